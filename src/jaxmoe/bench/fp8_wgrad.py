"""``jaxmoe bench fp8-wgrad``: the FP8 Mosaic GPU weight gradient against the bf16 Mosaic wgrad
and torch's, checked then timed.

The kernel is :func:`jaxmoe.ops.fp8.pallas_mosaic_wgrad.scaled_tgmm`. Per shape (``GEMM_SHAPES``:
``x [M, K]``, the output gradient ``dy [M, N]``, ``G`` groups) and routing (``balanced``, or
``skewed``: Dirichlet 0.3 as :func:`jaxmoe.bench.gemm.group_sizes_for`, one group forced empty):

* operands: ``x`` and ``dy`` drawn in float32, quantized by
  :func:`jaxmoe.ops.fp8.columnwise.quantize_columnwise` (one scale per (group, column),
  transposed ``[K, Mp]``, ``[N, Mp]``, each group at a 128-aligned column: the FP8 layer's
  operands);
* check: the kernel against a float32 XLA computation of the contract (per group, a masked dot
  of the FP8 values, exact in float32, then times the two scales): ``rel_err`` (Frobenius),
  ``group_max_rel_err``, the non-finite count, and empty groups exactly 0, on an output buffer
  poisoned with NaN first;
* time, in interleaved rounds (:func:`jaxmoe.bench.timing.time_interleaved`): ``fp8_mosaic``,
  ``bf16_mosaic`` (``jaxmoe.ops.mosaic.tgmm_launch.tgmm`` on the bf16 ``x``, ``dy``) and ``torch``
  (``torch._grouped_mm(dy.t(), x, offs)``, torch's weight gradient) when torch is installed.
  Quantization and padding are not timed (the FP8 layer's caller makes them).

``smoke``: the check only, on a tiny problem with small tiles, on any backend (Mosaic GPU's
interpreter on a CPU).
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.argument_checks import round_up
from jaxmoe.bench.gemm import group_sizes_for
from jaxmoe.bench.harness import weight_gradient_errors
from jaxmoe.bench.presets import GemmShape
from jaxmoe.bench.timing import jax_sync, time_interleaved, torch_sync, warm_up
from jaxmoe.ops.fp8 import pallas_mosaic_wgrad as fp8_wgrad
from jaxmoe.ops.fp8.columnwise import ALIGN, quantize_columnwise
from jaxmoe.ops.mosaic import tgmm_launch

ROUTINGS = ("balanced", "skewed")
SHAPES = ("mixtral-up", "mixtral-down", "dsv3-up", "dsv3-down", "qwen3-up", "qwen3-down")
# Three ring slots and a whole 128-row epilogue slab: the default the half slab replaced.
WHOLE_SLAB_TILES = fp8_wgrad.Fp8TgmmTileConfig(stages=3, epilogue_rows=None)
ROUNDS = 5
SMOKE_SHAPE = GemmShape("smoke", 512, 256, 256, 4)
SMOKE_TILES = fp8_wgrad.Fp8TgmmTileConfig(block_k=128, block_n=128, stages=2, group_swizzle=2)
HEADER_FACTS = {
    "timing": "median over interleaved rounds (jaxmoe.bench.timing.time_interleaved)",
    "flops": "2*M*K*N (useful only)",
}
COLUMNS = (
    ("shape", "shape", ""),
    ("routing", "routing", ""),
    ("impl", "impl", ""),
    ("ms", "ms", "{:.3f}"),
    ("tflops", "TFLOP/s", "{:.0f}"),
    ("ratio_vs_bf16_mosaic", "vs bf16 mosaic", "{:.2f}x"),
    ("ratio_vs_torch", "vs torch", "{:.2f}x"),
    ("rel_err", "rel err", "{:.2e}"),
    ("group_max_rel_err", "group max rel err", "{:.2e}"),
    ("ok", "ok", ""),
)


@jax.jit
def reference(lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, padded_sizes):
    """The contract in float32 by XLA: the FP8 values (exact in float32) contracted per group
    over its padded columns (zeros past its tokens), then scaled. One group at a time (a
    ``lax.map`` of masked dots): ``ragged_dot``'s dense rewrite needs tens of GiB on the
    DeepSeek and Qwen3 shapes."""
    ends = jnp.cumsum(padded_sizes)
    columns = jnp.arange(lhs_t_q.shape[1])
    lhs, rhs = lhs_t_q.astype(jnp.float32), rhs_t_q.astype(jnp.float32)

    def one_group(bounds):
        start, end = bounds
        mask = ((columns >= start) & (columns < end)).astype(jnp.float32)
        return jnp.dot(lhs * mask[None, :], rhs.T, precision=jax.lax.Precision.HIGHEST)

    raw = jax.lax.map(one_group, (ends - padded_sizes, ends))
    return raw * lhs_scale[:, :, None] * rhs_scale[:, None, :]


def skewed_sizes(shape: GemmShape) -> np.ndarray:
    """Dirichlet 0.3 sizes (summing to ``M``), with one group forced empty (its rows moved to
    the largest) so that the empty-group path is always checked."""
    sizes = group_sizes_for(shape, "skewed").astype(np.int64)
    order = np.argsort(sizes)
    if shape.groups > 1:
        sizes[order[-1]] += sizes[order[0]]
        sizes[order[0]] = 0
    return sizes.astype(np.int32)


def sizes_for(shape: GemmShape, routing: str) -> np.ndarray:
    return group_sizes_for(shape, "balanced") if routing == "balanced" else skewed_sizes(shape)


def _checked_rows(base, fp8_fns, operands, starts, gs, want, variant_tiles) -> list[dict]:
    rows = []
    for impl, fn in fp8_fns.items():
        row = {**base, "impl": impl}
        if impl == "fp8_mosaic_variant":
            row["tiles"] = str(variant_tiles)
        # NaN where the output will be: a kernel that skips a store shows it as non-finite.
        poison = jax.block_until_ready(jnp.full(want.shape, jnp.nan, jnp.bfloat16))
        del poison
        got = jax.block_until_ready(fn(*operands, starts, gs))
        rel, group_max, nonfinite, empty_max = (
            float(v) for v in jax.jit(weight_gradient_errors)(got, want, gs)
        )
        row |= {"rel_err": rel, "group_max_rel_err": group_max, "nonfinite": int(nonfinite)}
        row |= {"empty_max_abs": empty_max}
        # bf16 rounding of the result is ~2e-3 relative (Frobenius); FP8 products summed in the
        # wgmma accumulator (narrower than float32) add a little at large M.
        row["ok"] = bool(rel < 1e-2 and group_max < 2e-2 and nonfinite == 0 and empty_max == 0)
        rows.append(row)
    return rows


def run_case(
    shape: GemmShape,
    routing: str,
    *,
    tiles=None,
    timed: bool = True,
    rounds: int = ROUNDS,
    torch=None,
    variant_tiles=None,
    settle_ms: float | None = None,
) -> list[dict[str, Any]]:
    """The rows of one (shape, routing): each FP8 kernel's check, then (``timed``) every
    contender's interleaved time."""
    sizes = sizes_for(shape, routing)
    gs = jnp.asarray(sizes)
    kx, kd = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (shape.m, shape.k), jnp.float32)
    dy = jax.random.normal(kd, (shape.m, shape.n), jnp.float32)
    lhs_t_q, lhs_scale, starts = jax.jit(quantize_columnwise)(x, gs)
    rhs_t_q, rhs_scale, _ = jax.jit(quantize_columnwise)(dy, gs)
    operands = (lhs_t_q, lhs_scale, rhs_t_q, rhs_scale)
    mp = lhs_t_q.shape[1]
    base = {"shape": shape.name, "routing": routing, "m": shape.m, "k": shape.k, "n": shape.n}
    base |= {"groups": shape.groups, "mp": mp, "empty_groups": int(np.sum(sizes == 0))}
    padded_sizes = jnp.asarray(round_up(sizes, ALIGN).astype(np.int32))
    if mp > int(padded_sizes.sum()):  # all groups empty: the reference's sizes must reach Mp
        padded_sizes = padded_sizes.at[-1].add(mp - int(padded_sizes.sum()))
    want = reference(*operands, padded_sizes)
    fp8_fns = {"fp8_mosaic": jax.jit(functools.partial(fp8_wgrad.scaled_tgmm, tiles=tiles))}
    if variant_tiles is not None:
        fp8_fns["fp8_mosaic_variant"] = jax.jit(
            functools.partial(fp8_wgrad.scaled_tgmm, tiles=variant_tiles)
        )
    rows = _checked_rows(base, fp8_fns, operands, starts, gs, want, variant_tiles)
    del want
    if not timed:
        return rows

    contenders = {
        impl: (lambda fn=fn: fn(*operands, starts, gs), jax_sync) for impl, fn in fp8_fns.items()
    }
    xb, dyb = x.astype(jnp.bfloat16), dy.astype(jnp.bfloat16)
    bf16_fn = jax.jit(tgmm_launch.tgmm)
    contenders["bf16_mosaic"] = (lambda: bf16_fn(xb, dyb, gs), jax_sync)
    rows.append({**base, "impl": "bf16_mosaic"})
    if torch is not None:
        offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
        # dw_nk[g] = dy[rows of g]^T @ x[rows of g]: torch's weight gradient of
        # _grouped_mm(x, w_nk^T), the contraction ragged.
        tx, tdy = torch.from_dlpack(xb), torch.from_dlpack(dyb)
        contenders["torch"] = (
            functools.partial(torch._grouped_mm, tdy.t(), tx, offs=offs),
            torch_sync,
        )
        rows.append({**base, "impl": "torch"})
    ready = {}
    for row in rows:
        call, sync = contenders[row["impl"]]
        try:
            ready[row["impl"]] = (call, sync, warm_up(call, sync))
        except Exception as error:  # noqa: BLE001 - recorded in the row, the others still run
            traceback.print_exc()
            row["error"] = f"{type(error).__name__}: {error}"[:300]
    timings = time_interleaved(ready, rounds=rounds, settle_ms=settle_ms)
    flops = 2 * shape.m * shape.k * shape.n
    for row in rows:
        if row["impl"] in timings:
            t = timings[row["impl"]]
            row |= {"ms": t.median_ms, "min_ms": t.min_ms, "tflops": flops / t.median_ms / 1e9}
        for peer in ("bf16_mosaic", "torch"):
            if row.get("ms") and peer in timings:
                row[f"ratio_vs_{peer}"] = timings[peer].median_ms / row["ms"]
    return rows


def run_fp8_wgrad_benchmark(
    shapes: Sequence[GemmShape],
    routings: Sequence[str],
    *,
    smoke: bool = False,
    rounds: int = ROUNDS,
    whole_slab: bool = False,
    settle_ms: float | None = None,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """Every (routing, shape)'s rows (:func:`run_case`), each passed to ``on_row`` as it is
    made; a case that fails becomes one row with its ``error``. ``smoke``: :data:`SMOKE_SHAPE`
    with :data:`SMOKE_TILES`, checked, not timed (any backend)."""
    torch = None
    if not smoke:
        try:
            import torch
        except ImportError:
            torch = None
    rows: list[dict[str, Any]] = []
    for routing in routings:
        for shape in [SMOKE_SHAPE] if smoke else shapes:
            try:
                new = run_case(
                    shape,
                    routing,
                    tiles=SMOKE_TILES if smoke else None,
                    timed=not smoke,
                    rounds=rounds,
                    torch=torch,
                    variant_tiles=WHOLE_SLAB_TILES if whole_slab else None,
                    settle_ms=settle_ms,
                )
            except Exception as error:  # noqa: BLE001 - one failed case, the others still run
                traceback.print_exc()
                error_text = f"{type(error).__name__}: {error}"[:300]
                new = [{"shape": shape.name, "routing": routing, "error": error_text}]
            for row in new:
                rows.append(row)
                on_row(row)
            if torch is not None:
                torch.cuda.empty_cache()
    return rows
