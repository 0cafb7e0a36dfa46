"""Bytes on the wire, read from HLO text: the operands of every collective, by scope.

Reads either the compiled module (``jax.jit(f).lower(...).compile().as_text()``) or the
lowered one (``.lower(...).as_text(dialect="hlo", debug_info=True)``; ``debug_info`` keeps the
``op_name`` scopes). Prefer the lowered text on a CPU: XLA's CPU compiler runs collectives of
bfloat16 in float32 (it converts around them), which doubles their bytes against what the
program asks for and a GPU sends. Each collective counts its operands' bytes once per
execution of the instruction (an all-to-all's operand is its whole send buffer, own slot
included; a collective in a ``while`` body counts once, for one iteration)::

    lowered = jax.jit(f).lower(params, x)
    text = lowered.as_text(dialect="hlo", debug_info=True)
    dispatch = sum(c.operand_bytes for c in collectives(text) if c.scope == "ep_dispatch")
"""

from __future__ import annotations

import dataclasses
import re

from jaxmoe.bench.hlo_schedule import payload, scope

COLLECTIVE_OPS = (
    "all-to-all",
    "ragged-all-to-all",
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "collective-permute",
    "collective-broadcast",
)
# name = shape op(operands), ...   (compiled text names start with %, lowered text's do not)
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\([^()]*\)|\S+)\s+"
    r"(?P<op>[a-z][\w\-]*)\((?P<operands>[^)]*)\)(?P<rest>.*)$"
)
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of an HLO module."""

    name: str
    op: str  # e.g. "all-to-all" (an async "-start" counts as its op; "-done" is not listed)
    operand_bytes: int
    op_name: str  # the jax scope path, "" where the text has no metadata

    @property
    def scope(self) -> str:
        """The innermost layer scope: ``"ep_dispatch"``, ``"ep_combine"``, ... or ``""``."""
        return scope(self.op_name)["scope"]

    @property
    def in_loop(self) -> bool:
        """Whether it sits in a ``while`` body (e.g. the dropless overflow windows)."""
        return "/while/body/" in self.op_name or self.op_name.startswith("while/body/")

    @property
    def backward(self) -> bool:
        return "transpose(" in self.op_name


def collectives(hlo: str) -> list[Collective]:
    """Every collective of ``hlo`` (compiled or lowered HLO text), in text order."""
    shapes, found = {}, []
    for line in hlo.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        shapes[match.group("name")] = match.group("shape")
        op = match.group("op")
        base = op[: -len("-start")] if op.endswith("-start") else op
        if base not in COLLECTIVE_OPS:
            continue
        listed = re.sub(r"/\*.*?\*/", "", match.group("operands"))  # drop /*index=5*/
        operands = re.findall(r"%?([\w.\-]+)", listed)
        operand_bytes = sum(payload(shapes[name])[1] for name in operands if name in shapes)
        op_name = _OP_NAME.search(match.group("rest"))
        found.append(
            Collective(
                match.group("name"), base, operand_bytes, op_name.group(1) if op_name else ""
            )
        )
    return found


def wire_bytes(hlo: str, scope_name: str | None = None, *, in_loops: bool = False) -> int:
    """The operand bytes of ``hlo``'s collectives in scope ``scope_name`` (None: all of them),
    outside ``while`` bodies (``in_loops=True``: those inside them, one iteration each, too)."""
    return sum(
        c.operand_bytes
        for c in collectives(hlo)
        if (scope_name is None or c.scope == scope_name) and (in_loops or not c.in_loop)
    )
