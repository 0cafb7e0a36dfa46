"""Grouped-matmul benchmark: jaxmoe's kernels against ``jax.lax.ragged_dot``, jax's own Mosaic GPU
kernels and ``torch._grouped_mm``, forward and forward+backward, balanced and skewed routing.

Every implementation's outputs (and gradients) are checked against a per-group dense reference
before it is timed (:mod:`jaxmoe.bench.gemm_cases`). TFLOP/s count useful FLOPs only: ``2*M*K*N``
forward, three times that for forward+backward (dgrad and wgrad), whatever an implementation
actually computes. The command line is ``jaxmoe bench gemm``; in Python::

    rows = run_gemm_benchmark(shapes_for_presets(["mixtral"]), impls=["torch", "jaxmoe"])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.argument_checks import round_up
from jaxmoe.bench import gemm_cases, timing
from jaxmoe.bench.harness import fill_ratios, release_torch_memory
from jaxmoe.bench.presets import GEMM_SHAPES, LAYER_PRESETS, GemmShape
from jaxmoe.bench.timing import Timing
from jaxmoe.ops.mosaic.tiles import MOSAIC_ALIGNMENT

IMPLS = ("torch", "jaxmoe", "jaxmoe_pallas", "jaxmoe_triton", "xla_ragged_dot", "jax_mosaic")
IMPL_LABELS = {
    "jaxmoe": "jaxmoe default backend ('auto': Mosaic GPU fwd/dgrad where it applies, and the "
    "Mosaic wgrad; Triton where they do not apply)",
    "jaxmoe_pallas": "jaxmoe backend='pallas' (Mosaic GPU fwd, dgrad and wgrad; GPU only)",
    "jaxmoe_triton": "jaxmoe backend='pallas_triton' (Triton kernels only)",
    "xla_ragged_dot": "jax.lax.ragged_dot (jaxmoe backend='xla')",
    "jax_mosaic": "jax's own Mosaic GPU ragged_dot kernels (peer, GPU only)",
    "torch": "torch._grouped_mm (CUDA only)",
}
ROUTINGS = ("balanced", "skewed")
PASSES = ("fwd", "fwd+bwd")
SKEW_ALPHA = 0.3
# bf16 operands, float32 accumulation, bf16 result: rounding alone gives ~3e-3.
REL_TOL = {"bfloat16": 1e-2, "float32": 1e-4}
# What the results header says about the numbers.
HEADER_FACTS = {
    "flops": "useful only: fwd 2*M*K*N, fwd+bwd 3x that",
    "timing": "median ms per call over 10 samples after warm-up (ragged_dot: 3 when one call "
    "> 50 ms); each sample = several back-to-back calls then a device sync; the impls of one "
    "(shape, routing, pass) sampled in interleaved rounds, one sample of each per round, each "
    "after settle_ms (in the row's timing) of the impl's own calls untimed",
    "impls": IMPL_LABELS,
}
# The table ``jaxmoe bench gemm`` prints (see jaxmoe.bench.harness.format_table).
COLUMNS = (
    ("shape", "shape", ""),
    ("m", "m", ""),
    ("k", "k", ""),
    ("n", "n", ""),
    ("groups", "groups", ""),
    ("routing", "routing", ""),
    ("pass", "pass", ""),
    ("impl", "impl", ""),
    ("ms", "ms", "{:.3f}"),
    ("tflops", "TFLOP/s", "{:.3f}"),
    ("ratio", "ratio", "{:.2f}x"),
)


def group_sizes_for(shape: GemmShape, routing: str, seed: int = 0) -> np.ndarray:
    """``[G]`` int32 sizes summing to ``M``: equal (``balanced``) or Dirichlet(0.3) (``skewed``)."""
    m, g = shape.m, shape.groups
    if routing == "balanced":
        sizes = np.full(g, m // g, np.int64)
        sizes[: m % g] += 1
    elif routing == "skewed":
        rng = np.random.default_rng(seed)
        sizes = rng.multinomial(m, rng.dirichlet(np.full(g, SKEW_ALPHA)))
    else:
        raise ValueError(f"unknown `routing` {routing!r}; choose from {ROUTINGS}")
    assert sizes.sum() == m
    return sizes.astype(np.int32)


def hard_group_sizes(m: int, groups: int, seed: int = 0) -> np.ndarray:
    """``[G]`` int32 sizes for exactness checks: Dirichlet(0.3) over ``m - 77`` rows (77 rows
    past the groups) with the first two groups empty."""
    rng = np.random.default_rng(seed)
    sizes = rng.multinomial(m - 77, rng.dirichlet(np.full(groups, SKEW_ALPHA)))
    sizes[2] += sizes[:2].sum()
    sizes[:2] = 0
    return sizes.astype(np.int32)


def layer_group_sizes(shape: GemmShape, seed: int = 0) -> np.ndarray:
    """``[G]`` int32 sizes of the MoE layer's kind: multinomial loads on 7/8 of the ``M`` rows,
    each padded to the layer's alignment for the Mosaic kernels (``MOSAIC_ALIGNMENT``, 64); the
    rows past their sum are tail rows: the kernels timed as the layer calls them (about half the
    groups end in a 64-row tile)."""
    g = shape.groups
    loads = np.random.default_rng(seed).multinomial(shape.m * 7 // 8, np.full(g, 1 / g))
    return round_up(loads, MOSAIC_ALIGNMENT).astype(np.int32)


def shapes_for_presets(presets: Iterable[str], tokens: int | None = None) -> list[GemmShape]:
    """The grouped matmuls of layer presets (``mixtral`` -> ``mixtral-up``, ``mixtral-down``;
    ``tiny`` -> ``tiny``), with ``M = tokens * top_k`` of the preset when ``tokens`` is given."""
    shapes = []
    for preset in presets:
        for name in (f"{preset}-up", f"{preset}-down", preset):
            if name in GEMM_SHAPES:
                shape = GEMM_SHAPES[name]
                if tokens is not None:
                    m = tokens * LAYER_PRESETS[preset].top_k
                    shape = GemmShape(shape.name, m, shape.k, shape.n, shape.groups)
                shapes.append(shape)
    return shapes


def unavailable_reason(impl: str, platform: str | None = None) -> str | None:
    """Why ``impl`` cannot run on ``platform`` (default: JAX's), or None when it can."""
    platform = platform or jax.default_backend()
    if impl == "torch":
        return gemm_cases.torch_unavailable()
    if impl == "jax_mosaic" and platform != "gpu":
        return f"jax's Mosaic GPU ragged_dot needs an NVIDIA GPU (platform: {platform})"
    if impl == "jaxmoe_pallas" and platform != "gpu":
        return f"backend='pallas' times the Mosaic GPU kernels (platform: {platform})"
    return None


def run_gemm_benchmark(
    shapes: Iterable[str | GemmShape] = tuple(k for k in GEMM_SHAPES if k != "tiny"),
    impls: Sequence[str] = IMPLS,
    routings: Sequence[str] = ROUTINGS,
    passes: Sequence[str] = PASSES,
    repeats: int = 10,
    *,
    settle_ms: float | None = None,
    dtype: str = "bfloat16",
    seed: int = 0,
    slow_impl_repeats: int = 3,
    jaxmoe_backend=None,
    budget_s: float = float("inf"),
    log: Callable[[str], None] = print,
    on_row: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Checks then times every (shape, impl, routing, pass); returns one row per combination.

    Per (shape, routing, pass), every implementation is checked, then all are timed together in
    ``repeats`` interleaved rounds (:func:`jaxmoe.bench.timing.time_interleaved`): one sample of
    each per round, so that peers share the GPU's clocks and temperature, each sample after
    ``settle_ms`` of the impl's own load (None: :data:`jaxmoe.bench.timing.SETTLE_MS` on a
    GPU, 0 elsewhere; see ``time_interleaved``). torch's cache is freed
    after each (shape, routing, pass) so that the two frameworks' memory pools do not fight. An
    impl that cannot run on this platform gives rows with ``"skipped"`` (the reason); a failure
    (e.g. out of memory) a row with ``"error"``, and the run goes on. No new case starts after
    ``budget_s`` seconds. ``on_row(rows)`` is called after every (shape, routing, pass) (to save
    partial results). An impl whose call takes over 50 ms (``xla_ragged_dot``) is timed on its
    own afterwards with ``slow_impl_repeats`` samples.

    Returns:
      rows ``{"shape", "pass", "routing", "impl", "ms", "tflops", "ratio", "baseline",
      "ratio_vs_torch", ...}``: ``ratio`` is the ms of the first impl in ``impls`` order that
      ran over this row's ms (:func:`jaxmoe.bench.harness.fill_ratios`), ``ratio_vs_torch``
      torch's.
    """
    shapes = [GEMM_SHAPES[s] if isinstance(s, str) else s for s in shapes]
    for name in impls:
        if name not in IMPLS:
            raise ValueError(f"unknown `impls` entry {name!r}; choose from {IMPLS}")
    skip = {impl: unavailable_reason(impl) for impl in impls}
    settle_ms = timing.settle_ms_for(jax.default_backend(), settle_ms)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        for routing in routings:
            sizes = group_sizes_for(shape, routing, seed)
            for pass_ in passes:
                here = [_row(shape, routing, pass_, impl) for impl in impls]
                contenders, slow = {}, {}
                for row in here:
                    impl = row["impl"]
                    if skip[impl]:
                        row["skipped"] = skip[impl]
                    elif time.perf_counter() - started > budget_s:
                        row["skipped"] = f"time budget of {budget_s} s spent"
                    else:
                        case = (impl, jaxmoe_backend, shape, sizes, pass_, dtype, seed)
                        prepared = _prepare(row, case)
                        if prepared is not None:
                            *contender, is_slow = prepared
                            (slow if is_slow else contenders)[impl] = tuple(contender)
                _time_rows(
                    here, contenders, slow, repeats, slow_impl_repeats, shape.flops, settle_ms
                )
                contenders = slow = None  # free this case's buffers before the next one
                release_torch_memory()
                rows.extend(here)
                for row in here:
                    log(_row_line(row))
                fill_ratios(rows, ("shape", "pass", "routing"), impls)
                if on_row is not None:
                    on_row(rows)
    return rows


def _row(shape: GemmShape, routing: str, pass_: str, impl: str) -> dict[str, Any]:
    return {
        "shape": shape.name,
        "pass": pass_,
        "routing": routing,
        "impl": impl,
        "m": shape.m,
        "k": shape.k,
        "n": shape.n,
        "groups": shape.groups,
        "ms": None,
        "tflops": None,
    }


def _prepare(row, case):
    """Builds and checks one case, then warms it up: ``(call, sync, inner, slow)``, or ``None``
    with ``row["error"]`` set on any failure (wrong result, out of memory, ...). ``slow``: one
    warm call takes over 50 ms (``xla_ragged_dot``)."""
    impl, jaxmoe_backend, shape, sizes, pass_, dtype, seed = case
    try:
        if impl == "torch":
            fn, args, check, sync = gemm_cases.torch_case(shape, sizes, pass_, dtype, seed)
        else:
            fn, args, check, sync = gemm_cases.jax_case(
                impl, jaxmoe_backend, shape, sizes, pass_, jnp.dtype(dtype), seed
            )
        err = check()
        row["rel_err"] = err
        if not err <= REL_TOL[dtype]:
            raise AssertionError(f"wrong result: rel err {err:.3g}")

        def call():
            return fn(*args)

        inner = timing.warm_up(call, sync)
        # A call past 50 ms, once warm (the first calls after compiling may be far slower), is
        # timed alone with fewer samples.
        return call, sync, inner, inner == 1 and timing.take_sample(call, sync, 1) > 50
    except Exception as e:  # noqa: BLE001 - record and go on (OOM, slow impls)
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return None


def _time_rows(
    rows, contenders, slow, repeats: int, slow_repeats: int, fwd_flops: int, settle_ms: float
) -> None:
    """Times the prepared cases into their rows: the fast ones interleaved, the slow ones alone."""
    by_impl = {row["impl"]: row for row in rows}
    timings: dict[str, Timing] = {}
    try:
        timings.update(timing.time_interleaved(contenders, rounds=repeats, settle_ms=settle_ms))
    except Exception as e:  # noqa: BLE001 - e.g. out of memory while both frameworks hold buffers
        for impl in contenders:
            by_impl[impl]["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    for impl, prepared in slow.items():
        timings.update(
            timing.time_interleaved({impl: prepared}, rounds=slow_repeats, settle_ms=settle_ms)
        )
    for impl, t in timings.items():
        row = by_impl[impl]
        flops = fwd_flops * (1 if row["pass"] == "fwd" else 3)
        row["ms"] = t.median_ms
        row["tflops"] = flops / (t.median_ms * 1e-3) / 1e12
        row["timing"] = {**t.as_dict(), "settle_ms": settle_ms}


def _row_line(r) -> str:
    what = f"{r['shape']:>13} {r['pass']:>8} {r['routing']:>9} {r['impl']:>15}"
    if r.get("skipped"):
        return f"{what}  skipped: {r['skipped']}"
    if r.get("error"):
        return f"{what}  ERROR {r['error']}"
    return f"{what} {r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s  err {r.get('rel_err', 0):.1e}"
