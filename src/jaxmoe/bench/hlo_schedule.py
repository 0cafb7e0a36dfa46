"""What XLA scheduled around each exchange: a pure-text reading of a compiled module's HLO.

``compiled.as_text()`` after scheduling lists every computation's instructions in their execution
order. :func:`exchange_report` finds each all-to-all there: an async ``all-to-all-start`` /
``all-to-all-done`` pair (the wire can overlap whatever XLA placed between the two) or a plain
``all-to-all(`` (synchronous: nothing overlaps it). Per exchange it records the payload (shape,
dtype, bytes), the ``op_name`` scope (``ep_dispatch`` / ``ep_combine``; forward, or backward when
the name holds ``transpose(``), and the ops between start and done by class:

- ``grouped_matmul``: the expert kernels, custom calls ``mpmd_map`` (Mosaic GPU) or
  ``pallas_call`` / ``__gpu$xla.gpu.triton`` (Triton);
- ``gemm``: other matmuls (``gemm_fusion*`` fusions, cuBLAS custom calls);
- ``fusion``: every other fusion; ``collective``: other collectives; ``while``: loops (on a GPU
  each iteration copies its predicate to the host); ``conditional``; ``other``: copies and the
  like (bitcasts, tuples, get-tuple-elements, parameters and constants are not counted).

It also counts the grouped-matmul kernels of the same computation that depend on the exchange
(``kernels_after``: they read what it received), that it depends on (``kernels_before``), and
neither (``kernels_independent``: the only ones any schedule could place under it). Run it on
saved HLO texts (``.txt`` or ``.txt.gz``)::

    PYTHONPATH=src python -m jaxmoe.bench.hlo_schedule hlo-default.txt.gz [--markdown]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import re

DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_TRIVIAL = {"get-tuple-element", "bitcast", "tuple", "parameter", "constant"}
_COLLECTIVE = re.compile(
    r"^(all-reduce|all-gather|all-to-all|collective-permute|collective-broadcast|"
    r"reduce-scatter|ragged-all-to-all|send|recv)(-start|-done)?$"
)
_CALLEES = re.compile(r"\b(?:calls|body|condition|to_apply)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    shape: str
    operands: list[str]
    attributes: str  # the text after the operand list (metadata, backend_config, ...)
    index: int  # position in its computation's schedule

    @property
    def op_name(self) -> str:
        found = re.search(r'op_name="((?:[^"\\]|\\.)*)"', self.attributes)
        return found.group(1) if found else ""

    @property
    def target(self) -> str:
        found = re.search(r'custom_call_target="([^"]*)"', self.attributes)
        return found.group(1) if found else ""

    @property
    def calls(self) -> str:
        found = re.search(r"\bcalls=%([\w.\-]+)", self.attributes)
        return found.group(1) if found else ""


def _balanced(text: str, start: int) -> int:
    """Index just past the parenthesis group opening at ``text[start] == '('``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced parentheses: {text[start : start + 80]!r}")


def _parse_instruction(line: str, index: int) -> Instruction | None:
    head = re.match(r"\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*", line)
    if not head:
        return None
    pos = head.end()
    if line[pos] == "(":  # tuple shape
        end = _balanced(line, pos)
    else:
        end = line.index(" ", pos)
    shape = line[pos:end]
    op = re.compile(r"\s*([a-z][\w\-]*)\(").match(line, end)
    if not op:
        return None
    close = _balanced(line, op.end() - 1)
    operands = re.findall(r"%([\w.\-]+)", line[op.end() : close - 1])
    return Instruction(head.group(1), op.group(1), shape, operands, line[close:], index)


def parse_module(hlo: str) -> tuple[dict[str, list[Instruction]], str]:
    """``({computation: [instructions in schedule order]}, entry computation name)``."""
    computations, entry, current = {}, "", None
    for line in hlo.splitlines():
        if current is None:
            header = re.match(r"(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$", line)
            if header and not line.startswith(" "):
                current = header.group(2)
                computations[current] = []
                if header.group(1):
                    entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        instruction = _parse_instruction(line, len(computations[current]))
        if instruction is not None:
            computations[current].append(instruction)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, entry


def payload(shape: str) -> tuple[str, int]:
    """The arrays of an all-to-all's result (for a start, the last tuple element: the output
    buffers) and their bytes: ``('bf16[4,512,1024]', 4194304)``."""
    if shape.startswith("(("):  # a start: ((operands), result)
        inner = shape[1:-1]
        shape = inner[_balanced(inner, 0) :].lstrip(", ")
    arrays = _ARRAY.findall(shape)
    total = sum(
        math.prod(int(d) for d in dims.split(",") if d) * DTYPE_BYTES[dt] for dt, dims in arrays
    )
    text = ", ".join(f"{dt}[{dims}]" for dt, dims in arrays)
    return text, int(total)


def classify(instruction: Instruction) -> str | None:
    """The class of an op for the overlap count (None: bookkeeping, not counted)."""
    op, name, target = instruction.opcode, instruction.name, instruction.target
    if op in _TRIVIAL:
        return None
    if op == "custom-call":
        if "cublas" in target.lower():
            return "gemm"
        if "mosaic" in target or "triton" in target or name.startswith(("mpmd_map", "pallas_call")):
            return "grouped_matmul"
        return "other"
    if op == "fusion":
        callee = instruction.calls
        if name.startswith(("gemm_fusion", "cublas")) or callee.startswith("gemm_fusion"):
            return "gemm"
        if "__cublas" in instruction.attributes or "triton_gemm" in instruction.attributes:
            return "gemm"
        return "fusion"
    if op in ("dot", "convolution"):
        return "gemm"
    if _COLLECTIVE.match(op) or op in ("async-start", "async-done"):
        return "collective"
    if op in ("while", "conditional"):
        return op
    return "other"


def scope(op_name: str) -> dict:
    """``{'scope': 'ep_dispatch'|'ep_combine'|..., 'pass': 'forward'|'backward',
    'in_loop_body': bool}`` from an op_name such as
    ``jit(f)/transpose(jvp(jit(_moe_shard)))/shard_map/jaxmoe/ep_combine/all_to_all``."""
    found = re.findall(r"\b(ep_dispatch|ep_combine|router|experts|pmax|psum)\b", op_name)
    inner = op_name.rsplit("/while/body/", 1)[-1]  # a loop body's own pass
    if "transpose(" not in op_name:
        direction = "forward"
    elif "/while/body/" in op_name and "transpose(" not in inner:
        direction = "backward (recomputed forward)"
    else:
        direction = "backward"
    return {
        "scope": found[-1] if found else "",
        "pass": direction,
        "in_loop_body": "/while/body/" in op_name,
    }


def _descendants(instructions: list[Instruction], root: str) -> set[str]:
    users: dict[str, list[str]] = {}
    for instruction in instructions:
        for operand in instruction.operands:
            users.setdefault(operand, []).append(instruction.name)
    seen, stack = set(), [root]
    while stack:
        for user in users.get(stack.pop(), ()):
            if user not in seen:
                seen.add(user)
                stack.append(user)
    return seen


def _ancestors(by_name: dict[str, Instruction], root: str) -> set[str]:
    seen, stack = set(), [root]
    while stack:
        for operand in by_name[stack.pop()].operands:
            if operand in by_name and operand not in seen:
                seen.add(operand)
                stack.append(operand)
    return seen


def _holds_collective(computations, name: str, seen=None) -> bool:
    seen = set() if seen is None else seen
    if name in seen or name not in computations:
        return False
    seen.add(name)
    for instruction in computations[name]:
        if classify(instruction) == "collective":
            return True
        callees = _CALLEES.findall(instruction.attributes)
        for branches in _BRANCHES.findall(instruction.attributes):
            callees += re.findall(r"%([\w.\-]+)", branches)
        if any(_holds_collective(computations, c, seen) for c in callees):
            return True
    return False


def _first_user(instructions: list[Instruction], by_name, name: str) -> dict | None:
    """The first op (in schedule order) that reads ``name``, skipping bookkeeping ops, and the
    all-to-alls it reads (more than one: it joins exchanges, e.g. a multi-output fusion)."""
    reads = {name}
    for instruction in instructions:
        if not reads.intersection(instruction.operands):
            continue
        if classify(instruction) is None:  # a bitcast or get-tuple-element: follow it
            reads.add(instruction.name)
            continue
        exchanges = sorted(
            {a for o in instruction.operands if (a := _a2a_source(o, by_name)) is not None}
        )
        return {"name": instruction.name, "class": classify(instruction), "reads": exchanges}
    return None


def _a2a_source(name: str, by_name) -> str | None:
    """The all-to-all (sync, or the done of a pair) that ``name`` is a bitcast or element of."""
    while name in by_name and by_name[name].opcode in ("bitcast", "get-tuple-element"):
        name = by_name[name].operands[0]
    if name in by_name and by_name[name].opcode in ("all-to-all", "all-to-all-done"):
        return name
    return None


def _brief(instruction: Instruction) -> dict:
    return {"name": instruction.name, **scope(instruction.op_name)}


def _exchange(computation, instructions, by_name, start, done) -> dict:
    between = [i for i in instructions[start.index + 1 : done.index] if classify(i)]
    counts = {k: 0 for k in ("grouped_matmul", "gemm", "fusion", "collective", "while")}
    counts.update(conditional=0, other=0)
    for instruction in between:
        counts[classify(instruction)] += 1
    kernels = [i for i in instructions if classify(i) == "grouped_matmul"]
    after, before = _descendants(instructions, done.name), _ancestors(by_name, start.name)
    shape, size = payload(done.shape)
    return {
        "computation": computation,
        "start": start.name,
        "done": done.name,
        "positions": [start.index, done.index],
        "payload": shape,
        "bytes": size,
        **scope(start.op_name),
        "op_name": start.op_name,
        "between": counts,
        "grouped_matmul_between": [_brief(i) for i in between if classify(i) == "grouped_matmul"],
        "gemm_between": [i.name for i in between if classify(i) == "gemm"],
        "collectives_between": [i.name for i in between if classify(i) == "collective"],
        "while_between": [
            _brief(i) | {"op_name": i.op_name} for i in between if i.opcode == "while"
        ],
        "kernels_after": sum(k.name in after for k in kernels),
        "kernels_before": sum(k.name in before for k in kernels),
        "kernels_independent": sum(k.name not in after and k.name not in before for k in kernels),
        "first_user": _first_user(instructions, by_name, done.name),
    }


def exchange_report(hlo: str) -> dict:
    """Every all-to-all of a scheduled module (see the module docstring). ``exchanges``: the
    async pairs, entry computation first; ``sync_exchanges``: plain all-to-alls (``scheduled_as``:
    the scheduler's name for it, an ``all-to-all-start`` when XLA scheduled it async and then made
    it synchronous, ``is_sync`` in its backend config); ``while_loops``: the entry's loops."""
    computations, entry = parse_module(hlo)
    order = [entry] + [name for name in computations if name != entry]
    exchanges, sync = [], []
    for computation in order:
        instructions = computations[computation]
        by_name = {i.name: i for i in instructions}
        for done in instructions:
            if done.opcode == "all-to-all-done" and done.operands[0] in by_name:
                start = by_name[done.operands[0]]
                exchanges.append(_exchange(computation, instructions, by_name, start, done))
            elif done.opcode == "all-to-all":
                after = _descendants(instructions, done.name)
                before = _ancestors(by_name, done.name)
                kernels = [i for i in instructions if classify(i) == "grouped_matmul"]
                shape, size = payload(done.shape)
                scheduled = re.search(r'scheduling_name="([^"]*)"', done.attributes)
                sync.append(
                    {
                        "computation": computation,
                        "name": done.name,
                        "position": done.index,
                        "payload": shape,
                        "bytes": size,
                        **scope(done.op_name),
                        "op_name": done.op_name,
                        "scheduled_as": scheduled.group(1) if scheduled else "",
                        "is_sync": '"is_sync":true' in done.attributes,
                        "kernels_after": sum(k.name in after for k in kernels),
                        "kernels_before": sum(k.name in before for k in kernels),
                        "kernels_independent": sum(
                            k.name not in after and k.name not in before for k in kernels
                        ),
                        "first_user": _first_user(instructions, by_name, done.name),
                    }
                )
    loops = []
    for instruction in computations[entry]:
        if instruction.opcode == "while":
            body = re.search(r"\bbody=%([\w.\-]+)", instruction.attributes)
            loops.append(
                _brief(instruction)
                | {
                    "position": instruction.index,
                    "op_name": instruction.op_name,
                    "holds_collectives": bool(body)
                    and _holds_collective(computations, body.group(1)),
                }
            )
    entry_ops = computations[entry]
    in_flight, most = set(), 0
    for instruction in entry_ops:  # async collectives of any kind started and not yet done
        if instruction.opcode.endswith("-start") and classify(instruction) == "collective":
            in_flight.add(instruction.name)
            most = max(most, len(in_flight))
        elif instruction.opcode.endswith("-done"):
            in_flight.difference_update(instruction.operands)
    return {
        "entry": entry,
        "async_all_to_all": sum(e["computation"] == entry for e in exchanges),
        "sync_all_to_all": sum(s["computation"] == entry for s in sync),
        "while_loops": len(loops),
        "conditionals": sum(i.opcode == "conditional" for i in entry_ops),
        "grouped_matmul_kernels": sum(classify(i) == "grouped_matmul" for i in entry_ops),
        "most_collectives_in_flight": most,
        "exchanges": exchanges,
        "sync_exchanges": sync,
        "loops": loops,
    }


def markdown_table(report: dict) -> str:
    """One row per all-to-all of the entry computation, in schedule order, then the loops'."""
    rows = [
        "| # | exchange | scope | pass | payload | bytes | between start and done "
        "| kernels after / before / independent | first reader of the result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    entries = [(e["positions"][0], "async", e) for e in report["exchanges"]]
    entries += [(s["position"], "sync", s) for s in report["sync_exchanges"]]
    entries.sort(key=lambda t: (t[2]["computation"] != report["entry"], t[2]["computation"], t[0]))
    for number, (_, kind, e) in enumerate(entries, 1):
        where = "" if e["computation"] == report["entry"] else f" (loop body `{e['computation']}`)"
        if kind == "async":
            name = f"`{e['start']}`{where}"
            b = e["between"]
            kernels = ", ".join(
                f"{k['name']} ({k['pass'][:3]})" for k in e["grouped_matmul_between"]
            )
            parts = [f"{b['grouped_matmul']} grouped-matmul" + (f" ({kernels})" if kernels else "")]
            parts += [f"{b[k]} {k}" for k in ("gemm", "fusion", "collective", "while") if b[k]]
        else:
            name = f"`{e['name']}` **sync**{where}"
            parts = ["nothing (synchronous)"]
        rows.append(
            f"| {number} | {name} | {e['scope']} | {e['pass']} | {e['payload']} | {e['bytes']:,} "
            f"| {'; '.join(parts)} | {e['kernels_after']} / {e['kernels_before']} / "
            f"{e['kernels_independent']} | {_user_text(e['first_user'])} |"
        )
    return "\n".join(rows)


def _user_text(user: dict | None) -> str:
    if user is None:
        return ""
    text = f"{user['name']} ({user['class']})"
    if len(user["reads"]) > 1:
        text += ", reads " + " + ".join(user["reads"])
    return text


def _read(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="scheduled HLO texts (.txt or .txt.gz)")
    parser.add_argument("--markdown", action="store_true", help="a table per file, not JSON")
    args = parser.parse_args(argv)
    for path in args.files:
        report = exchange_report(_read(path))
        if args.markdown:
            print(f"### {path}\n\n{markdown_table(report)}\n")
        else:
            print(json.dumps({"file": path, **report}, indent=1))


if __name__ == "__main__":
    main()
