"""``jaxmoe bench ab``: two jaxmoe source trees, before and after a change, on one machine.

For structure-only refactors and kernel changes: each case must give the same bits in both trees
and the same time. Two long-lived worker processes (:mod:`jaxmoe.bench.ab_worker`), one per tree,
each importing its own jaxmoe, share the device(s). Per case:

* Both workers build the case (in parallel): inputs drawn from the seed, the function jitted
  through the tree's public API, run twice, each output (and, ``fwd+bwd``, each cotangent of
  ``jax.vjp`` with a fixed ``dy``) saved as raw bits to an ``.npy`` file. The parent compares the
  files leaf by leaf (:func:`compare_leaf`: the bytes, NaN-aware) and the inputs' digests.
* Then interleaved rounds: per round one timed sample of each tree, the before tree first in
  even rounds and the after tree first in odd ones; each sample runs ``settle_ms`` of its own
  calls untimed first (:func:`jaxmoe.bench.timing.settle`), then back-to-back calls filling
  about ``sample_ms`` and one device sync (:func:`jaxmoe.bench.timing.take_sample`); both trees
  take the same number of calls per sample.

The cases (:func:`case_list`), named ``family/shape/routing/pass/backend``: ``gmm``
(``jaxmoe.grouped_matmul``) on the gemm bench's six shapes; ``gated_ffn``
(``jaxmoe.ops.gated_grouped_matmul.gated_ffn``, SwiGLU) at the three layer presets' sizes
(``k`` the hidden size, ``n`` the FFN size); ``fp8_rowwise`` and ``fp8_blockwise``
(``jaxmoe.fp8_grouped_matmul``) on the six shapes. Each balanced and skewed (the gemm bench's
routings), ``fwd`` and ``fwd+bwd``. ``tiny``: one small shape for each family instead, aligned
to the Mosaic and FP8 blocks, which a CPU runs (the Mosaic kernels in their interpreter).

A row: ``ok`` (every leaf bitwise equal, the inputs equal, and the time ``within_tolerance``),
``bitwise_equal`` per leaf, ``before_ms``, ``after_ms`` (= ``ms``), ``ratio`` = after / before.
"""

from __future__ import annotations

import datetime
import fnmatch
import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxmoe.bench.ab_pipe import CaseFailed, WorkerDied, WorkerProcess
from jaxmoe.bench.ab_trees import SourceTree
from jaxmoe.bench.gemm import PASSES, ROUTINGS, group_sizes_for
from jaxmoe.bench.harness import format_table, package_version
from jaxmoe.bench.presets import GEMM_SHAPES, LAYER_PRESETS, GemmShape
from jaxmoe.option_names import GROUPED_MATMUL_BACKENDS

FAMILIES = ("gmm", "gated_ffn", "fp8_rowwise", "fp8_blockwise")
GEMM_SHAPE_NAMES = tuple(name for name in GEMM_SHAPES if name != "tiny")
FFN_PRESETS = ("mixtral", "dsv3", "qwen3")
# Small enough for a CPU, aligned to the Mosaic tiles and the FP8 blocks (128).
TINY_SHAPE = GemmShape("tiny-ab", 256, 128, 256, 4)
GMM_BACKENDS = tuple(GROUPED_MATMUL_BACKENDS)
FP8_BACKENDS = ("auto", "reference", "xla", "pallas")
# The gated FFN also takes its fused Mosaic kernel by name (PallasMosaicGatedGroupedMatmul()).
FAMILY_BACKENDS = {
    "gmm": GMM_BACKENDS,
    "gated_ffn": (*GMM_BACKENDS, "pallas_fused"),
    "fp8_rowwise": FP8_BACKENDS,
    "fp8_blockwise": FP8_BACKENDS,
}
BACKENDS = tuple(dict.fromkeys(b for names in FAMILY_BACKENDS.values() for b in names))
MOSAIC_BACKENDS = ("pallas", "pallas_fused")
TOLERANCE = 0.01
ROUNDS = 10
SAMPLE_MS = 100.0
MEM_FRACTION = 0.45
HEADER_FACTS = {
    "timing": "interleaved rounds: per round one sample of each tree (before first in even "
    "rounds, after first in odd), each after settle_ms of its own calls untimed; a sample = "
    "back-to-back calls filling ~sample_ms, then a device sync, the same count for both trees",
    "ratio": "after_ms / before_ms (medians; < 1: after is faster); ratio_paired: the median "
    "of the rounds' after/before",
    "bitwise": "each output and cotangent leaf compared as raw bits (NaN-aware: NaNs at the "
    "same places are equal whatever their payload); inputs compared by digest",
    "families": "gmm: jaxmoe.grouped_matmul; gated_ffn: jaxmoe.ops.gated_grouped_matmul."
    "gated_ffn (swiglu; k = hidden, n = ffn); fp8_*: jaxmoe.fp8_grouped_matmul",
}
COLUMNS = (
    ("case", "case", ""),
    ("ok", "ok", ""),
    ("all_bitwise_equal", "bits equal", ""),
    ("before_ms", "before ms", "{:.4f}"),
    ("after_ms", "after ms", "{:.4f}"),
    ("ratio", "after/before", "{:.4f}"),
    ("within_tolerance", "within tol", ""),
)


def render(header: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The results' markdown: device, both trees, versions, the command, the table."""

    def tree(label: str) -> str:
        facts = header[label]
        name = f"`{facts['commit'][:12]}`" if facts.get("commit") else f"`{facts['path']}`"
        return f"{label} {name}" + (" (uncommitted changes in src/)" if facts.get("dirty") else "")

    lines = [
        f"# jaxmoe bench ab ({header['device']} x{header['num_devices']})",
        "",
        f"{tree('before')}; {tree('after')}. jax {header['jax']}; {header['date']}; "
        f"{header['rounds']} rounds, tolerance {header['tolerance']:g}; `{header['command']}`.",
        "",
    ]
    return "\n".join(lines) + format_table(rows, COLUMNS, markdown=True)


def ffn_shape(preset: str) -> GemmShape:
    """The gated FFN of a layer preset as ``M x K -> N`` per group: its routed rows
    (tokens * top_k), hidden size, FFN size, experts."""
    p = LAYER_PRESETS[preset]
    return GemmShape(preset, p.tokens * p.top_k, p.hidden_size, p.ffn_size, p.num_experts)


def family_shapes(family: str, tiny: bool) -> list[GemmShape]:
    if tiny:
        return [TINY_SHAPE]
    if family == "gated_ffn":
        return [ffn_shape(preset) for preset in FFN_PRESETS]
    return [GEMM_SHAPES[name] for name in GEMM_SHAPE_NAMES]


def case_list(tiny: bool, backends: Sequence[str] = ("auto",)) -> list[dict[str, Any]]:
    """Every case, in order; each family with those of ``backends`` it has."""
    cases = []
    for family in FAMILIES:
        for shape in family_shapes(family, tiny):
            for routing in ROUTINGS:
                for pass_ in PASSES:
                    for backend in backends:
                        if backend not in FAMILY_BACKENDS[family]:
                            continue
                        name = f"{family}/{shape.name}/{routing}/{pass_}/{backend}"
                        cases.append(
                            {
                                "case": name,
                                "family": family,
                                "shape": shape.name,
                                "m": shape.m,
                                "k": shape.k,
                                "n": shape.n,
                                "groups": shape.groups,
                                "routing": routing,
                                "pass": pass_,
                                "backend": backend,
                            }
                        )
    return cases


def all_case_names() -> list[str]:
    """Every name a case can have (tiny or not, every backend): what ``--cases`` may match."""
    return [case["case"] for tiny in (False, True) for case in case_list(tiny, BACKENDS)]


def matches(name: str, pattern: str) -> bool:
    """``fnmatch`` on the case name; a pattern without ``/`` also matches as a family
    (``gmm``, ``fp8_*``)."""
    return fnmatch.fnmatchcase(name, pattern) or (
        "/" not in pattern and fnmatch.fnmatchcase(name, pattern + "/*")
    )


def select_cases(cases: Sequence[dict], patterns: Sequence[str]) -> list[dict]:
    return [case for case in cases if any(matches(case["case"], p) for p in patterns)]


def skip_reason(case: dict[str, Any], info: dict[str, Any], tiny: bool) -> str | None:
    """Why ``case`` cannot run on the workers' device (``info``: a worker's hello), or None."""
    backend, here = case["backend"], info["platform"]
    if backend in MOSAIC_BACKENDS:
        if here == "gpu" and not str(info.get("compute_capability") or "").startswith("9."):
            return f"the Mosaic GPU kernels need a Hopper GPU (here: {info['device']})"
        if here not in ("gpu", "cpu"):
            return f"the Mosaic GPU kernels need a Hopper GPU (platform: {here})"
        if here == "cpu" and not tiny:
            return "the Mosaic GPU kernels need a Hopper GPU; on a CPU only --tiny runs them"
        if here == "cpu" and case["pass"] != "fwd":
            return (
                "Mosaic GPU's interpreter has no transposed wgmma operand: the backward runs "
                "on a Hopper GPU only"
            )
    if backend == "pallas_triton" and here != "gpu" and not (here == "cpu" and tiny):
        return "the Triton kernels need a GPU; on a CPU only --tiny runs them (interpreted)"
    return None


def compare_leaf(before: np.ndarray, after: np.ndarray, dtype: str) -> dict[str, Any]:
    """Bitwise equality of two leaves' raw bits (``dtype``: the leaf's), NaN-aware: NaNs at the
    same places are equal whatever their bits (payload, sign); ``differing``: elements that are
    not, ``max_abs_diff`` their largest difference."""
    if before.shape != after.shape or before.dtype != after.dtype:
        return {"equal": False, "differing": int(max(before.size, after.size)), "why": "shape"}
    if np.array_equal(before, after):
        return {"equal": True, "differing": 0}
    try:
        values = np.dtype(dtype)
    except TypeError:
        values = None
    if values is None or (values.kind != "f" and "float" not in values.name):
        return {"equal": False, "differing": int(np.count_nonzero(before != after))}
    a, b = before.view(values), after.view(values)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    differ = (before != after) & ~(nan_a & nan_b)
    result = {"equal": not differ.any(), "differing": int(np.count_nonzero(differ))}
    if differ.any():
        both = differ & ~nan_a & ~nan_b
        if both.any():
            diff = np.abs(a[both].astype(np.float64) - b[both].astype(np.float64))
            result["max_abs_diff"] = float(diff.max())
    return result


def compare_builds(before: dict, after: dict) -> dict[str, Any]:
    """Row fields from the two trees' ``build`` replies: per leaf equal or not."""
    names = [leaf["name"] for leaf in after["leaves"]]
    if names != [leaf["name"] for leaf in before["leaves"]]:
        return {"all_bitwise_equal": False, "error": f"leaves differ: {before['leaves']}"}
    equal, differing, max_diff = {}, {}, {}
    for a, b in zip(before["leaves"], after["leaves"], strict=True):
        if a["dtype"] != b["dtype"] or a["shape"] != b["shape"]:
            found = {"equal": False, "differing": -1}
        else:
            found = compare_leaf(np.load(a["file"]), np.load(b["file"]), b["dtype"])
        equal[b["name"]] = found["equal"]
        if not found["equal"]:
            differing[b["name"]] = found["differing"]
            if "max_abs_diff" in found:
                max_diff[b["name"]] = found["max_abs_diff"]
    row = {
        "bitwise_equal": equal,
        "all_bitwise_equal": all(equal.values()),
        "same_inputs": before["inputs_sha256"] == after["inputs_sha256"],
        "repeatable": {"before": before["repeatable"], "after": after["repeatable"]},
    }
    if differing:
        row["differing_elements"] = differing
    if max_diff:
        row["max_abs_diff"] = max_diff
    return row


def time_pair(
    workers: Sequence[WorkerProcess], rounds: int, settle_ms: float, sample_ms: float
) -> dict[str, Any]:
    """Interleaved rounds of the built case: before first in even rounds, after first in odd."""
    inner = min(w.request({"op": "warm", "target_sample_ms": sample_ms})["inner"] for w in workers)
    samples: dict[str, list[float]] = {w.tree.label: [] for w in workers}
    for index in range(rounds):
        for worker in workers if index % 2 == 0 else workers[::-1]:
            reply = worker.request({"op": "sample", "inner": inner, "settle_ms": settle_ms})
            samples[worker.tree.label].append(reply["ms"])
    before, after = samples["before"], samples["after"]
    return {
        "before_ms": statistics.median(before),
        "after_ms": statistics.median(after),
        "ratio": statistics.median(after) / statistics.median(before),
        "ratio_paired": statistics.median(a / b for a, b in zip(after, before, strict=True)),
        "inner": inner,
        "rounds": rounds,
        "before_samples": [round(ms, 6) for ms in before],
        "after_samples": [round(ms, 6) for ms in after],
    }


class AbSession:
    """The two workers, started together (``with AbSession(before, after, ...) as session``)."""

    def __init__(
        self,
        before: SourceTree,
        after: SourceTree,
        log_dir: Path,
        *,
        mem_fraction: float = MEM_FRACTION,
        timeout_s: float = 1800.0,
    ):
        self.workers = [
            WorkerProcess(tree, log_dir, mem_fraction=mem_fraction, timeout_s=timeout_s)
            for tree in (before, after)
        ]

    def __enter__(self) -> AbSession:
        self.start()
        return self

    def start(self) -> None:
        """Starts both workers (their imports overlap), then waits for each one's hello."""
        try:
            for worker in self.workers:
                worker.start()
            for worker in self.workers:
                worker.finish_start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    @property
    def info(self) -> dict[str, Any]:
        """The after worker's hello: the device and versions both share."""
        return self.workers[1].info


def _build_both(workers, case: dict, case_dir: Path, parallel: bool, repeat: bool):
    """Both trees build ``case``, at once where ``parallel``; returns the replies and each
    tree's error, if any. On a GPU one after the other: autotuning times candidate kernels, and
    the other tree's compilation beside it could change its pick (see
    :func:`jaxmoe.bench.ab_pipe.worker_env`)."""
    replies, errors, sent = {}, {}, []

    def receive(worker) -> None:
        try:
            replies[worker.tree.label] = worker.receive()
        except (CaseFailed, WorkerDied) as error:
            errors[worker.tree.label] = str(error)

    for worker in workers:
        save_dir = case_dir / worker.tree.label
        try:
            worker.send({"op": "build", "case": case, "save_dir": str(save_dir), "repeat": repeat})
        except WorkerDied as error:
            errors[worker.tree.label] = str(error)
            continue
        if parallel:
            sent.append(worker)
        else:
            receive(worker)
    for worker in sent:
        receive(worker)
    return replies, errors


def run_case(session: AbSession, case: dict, case_dir: Path, options: dict) -> dict[str, Any]:
    """One case's row fields: the comparison, then (``rounds`` > 0) the times."""
    workers = session.workers
    parallel = session.info["platform"] != "gpu"
    # Bits only (rounds 0, e.g. a kernel in an interpreter, seconds a call): one run each.
    repeat = options["rounds"] > 0
    replies, errors = _build_both(workers, case, case_dir, parallel, repeat)
    row: dict[str, Any] = {}
    for label, error in errors.items():
        row[f"{label}_error"] = error
    if errors:
        return row | {"error": "; ".join(f"{k}: {v}" for k, v in errors.items())[:600]}
    row |= compare_builds(replies["before"], replies["after"])
    if options["rounds"] > 0 and "error" not in row:
        try:
            row |= time_pair(workers, options["rounds"], options["settle_ms"], options["sample_ms"])
        except (CaseFailed, WorkerDied) as error:
            row["error"] = f"timing: {error}"
    return row


def _verdict(row: dict[str, Any], tolerance: float) -> dict[str, Any]:
    timed = row.get("ratio") is not None
    within = abs(row["ratio"] - 1.0) <= tolerance if timed else None
    ok = (
        not row.get("error")
        and row.get("all_bitwise_equal") is True
        and row.get("same_inputs") is True
        and within is not False
    )
    return {"ok": bool(ok), "within_tolerance": within, "ms": row.get("after_ms")}


def run_ab(
    session: AbSession,
    cases: Sequence[dict[str, Any]],
    *,
    tiny: bool,
    rounds: int = ROUNDS,
    tolerance: float = TOLERANCE,
    settle_ms: float = 0.0,
    sample_ms: float = SAMPLE_MS,
    seed: int = 0,
    arrays_dir: str | Path | None = None,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """Runs ``cases`` (from :func:`case_list`) on the session's two trees; returns the rows,
    each passed to ``on_row`` as it is made. ``arrays_dir``: keep each case's ``.npy`` files
    there (None: a temporary folder, each case's removed once compared)."""
    options = {"rounds": rounds, "settle_ms": settle_ms, "sample_ms": sample_ms}
    root = Path(arrays_dir) if arrays_dir else Path(tempfile.mkdtemp(prefix="jaxmoe-ab-"))
    rows = []
    try:
        for case in cases:
            shape = GemmShape(case["shape"], case["m"], case["k"], case["n"], case["groups"])
            sizes = group_sizes_for(shape, case["routing"], seed)
            row = {**case, "tolerance": tolerance}
            reason = skip_reason(case, session.info, tiny)
            if reason is not None:
                row |= {"skipped": reason, "ms": None}
            else:
                case_dir = root / case["case"].replace("/", "__").replace("+", "_")
                command = {**case, "group_sizes": sizes.tolist(), "seed": seed}
                row |= run_case(session, command, case_dir, options)
                row |= _verdict(row, tolerance)
                _restart_dead(session, row)
                if not arrays_dir:
                    shutil.rmtree(case_dir, ignore_errors=True)
            rows.append(row)
            on_row(row)
    finally:
        if not arrays_dir:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def _restart_dead(session: AbSession, row: dict[str, Any]) -> None:
    """A worker that died on this case is started again for the next (the row says so)."""
    for worker in session.workers:
        if worker.process is None or worker.process.poll() is not None:
            try:
                worker.restart()
                row[f"{worker.tree.label}_restarted"] = True
            except (WorkerDied, CaseFailed) as error:
                label = worker.tree.label
                raise WorkerDied(f"could not restart the {label} worker: {error}") from None


def ab_header(command: str, session: AbSession, **facts: Any) -> dict[str, Any]:
    """The results header (the keys of :func:`jaxmoe.bench.harness.results_header`, read from
    the workers: the parent makes no device of its own) and both trees."""
    info = session.info
    trees = {}
    for worker in session.workers:
        trees[worker.tree.label] = {
            **worker.tree.as_header(),
            "jaxmoe_file": worker.info.get("jaxmoe_file"),
            "jax": worker.info.get("jax"),
        }
    return {
        "device": info["device"],
        "platform": info["platform"],
        "num_devices": info["num_devices"],
        "jax": info["jax"],
        "jaxlib": info.get("jaxlib"),
        "torch": package_version("torch"),
        "python": info.get("python"),
        "xla_flags": info.get("xla_flags"),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "commit": trees["after"]["commit"],
        **trees,
        **HEADER_FACTS,
        **facts,
    }
