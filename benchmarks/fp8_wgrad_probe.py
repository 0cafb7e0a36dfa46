"""Probe: the FP8 Mosaic GPU wgrad against the bf16 Mosaic wgrad and torch's, on six shapes.

The kernel is ``jaxmoe.ops.fp8.pallas_mosaic_wgrad.scaled_tgmm``; its peers the bf16 Mosaic
``tgmm`` and ``torch._grouped_mm``'s wgrad. Not run on a GPU yet.

Per shape (``GEMM_SHAPES``: Mixtral, DeepSeek-V3, Qwen3, up and down; ``x [M, K]``, the output
gradient ``dy [M, N]``, ``G`` groups) and routing (``balanced``, or ``skewed``: Dirichlet 0.3,
as ``jaxmoe.bench.gemm.group_sizes_for``):

* operands: ``x`` and ``dy`` drawn in float32, quantized by
  :func:`jaxmoe.ops.fp8.columnwise.quantize_columnwise` (one scale per (group, column),
  transposed ``[K, Mp]``, ``[N, Mp]``, each group at a 128-aligned column, zeros up to the next
  multiple of 128: the layer's operands);
* check: the kernel against a float32 XLA computation of the contract (per group, a masked dot
  of the FP8 values, exact in float32, at ``highest`` precision, then times the two scales):
  ``rel_err`` (Frobenius), ``group_max_rel_err``, non-finite count, and empty groups exactly 0.
  The output buffer is poisoned with NaN first;
* time, interleaved rounds (``time_interleaved``): ``fp8_mosaic`` (this kernel, on the padded
  operands), ``bf16_mosaic`` (``pallas_mosaic_wgrad.tgmm`` on the unpadded bf16 ``x``, ``dy``:
  the wgrad the FP8 layer runs today), and ``torch`` (``torch._grouped_mm(dy.t(), x, offs)``, the
  weight gradient as torch's backward computes it) when torch is installed. Quantization and
  padding are not timed (the FP8 layer's caller makes them).

Writes ``fp8-wgrad-probe.json`` (``{"header", "rows"}``) and ``.md`` into ``--out-dir``::

    PYTHONPATH=src python benchmarks/fp8_wgrad_probe.py --out-dir $OUT

``--whole-slab`` also checks and times ``WHOLE_SLAB_TILES`` (``fp8_mosaic_variant``; H100 run 13
call 6 ran the then ``--half-slab`` against the 3-slot default of the time).
``--smoke`` runs the check only, on a tiny problem with small tiles, on any backend (Mosaic GPU's
interpreter on a CPU): for the tests.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.arrays import round_up
from jaxmoe.bench.gemm import group_sizes_for
from jaxmoe.bench.harness import (
    markdown_report,
    results_header,
    weight_gradient_errors,
    write_results,
)
from jaxmoe.bench.presets import GEMM_SHAPES, GemmShape
from jaxmoe.bench.timing import jax_sync, time_interleaved, torch_sync, warm_up
from jaxmoe.ops.fp8 import pallas_mosaic_wgrad as fp8_wgrad
from jaxmoe.ops.fp8.columnwise import ALIGN, quantize_columnwise
from jaxmoe.ops.grouped_matmul import pallas_mosaic_wgrad

SHAPES = "mixtral-up,mixtral-down,dsv3-up,dsv3-down,qwen3-up,qwen3-down"
# The default before session 12: three ring slots and a whole 128-row epilogue slab.
WHOLE_SLAB_TILES = fp8_wgrad.Fp8TgmmTileConfig(stages=3, epilogue_rows=None)
ROUNDS = 5
SMOKE_SHAPE = GemmShape("smoke", 512, 256, 256, 4)
SMOKE_TILES = fp8_wgrad.Fp8TgmmTileConfig(block_k=128, block_n=128, stages=2, group_swizzle=2)
COLUMNS = [
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
]


@jax.jit
def reference(lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, padded_sizes):
    """The contract in float32 by XLA: the FP8 values (exact in float32) contracted per group
    over its padded columns (zeros past its tokens), then scaled. One group at a time (a
    ``lax.map`` of masked dots): ``ragged_dot``'s dense rewrite needed 28-72 GiB on DeepSeek
    and Qwen3 (run 11 call 1)."""
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


def run_case(
    shape, routing, *, tiles, timed: bool, rounds: int, torch, variant_tiles=None
) -> list[dict]:
    sizes = sizes_for(shape, routing)
    gs = jnp.asarray(sizes)
    kx, kd = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (shape.m, shape.k), jnp.float32)
    dy = jax.random.normal(kd, (shape.m, shape.n), jnp.float32)
    # The layer's operands: per (group, column) scales, transposed, groups padded to 128.
    lhs_t_q, lhs_scale, starts_d = jax.jit(quantize_columnwise)(x, gs)
    rhs_t_q, rhs_scale, _ = jax.jit(quantize_columnwise)(dy, gs)
    operands = (lhs_t_q, lhs_scale, rhs_t_q, rhs_scale)
    mp = lhs_t_q.shape[1]
    fp8_fn = jax.jit(functools.partial(fp8_wgrad.scaled_tgmm, tiles=tiles))
    base = {"shape": shape.name, "routing": routing, "m": shape.m, "k": shape.k, "n": shape.n}
    base |= {"groups": shape.groups, "mp": mp, "empty_groups": int(np.sum(sizes == 0))}

    padded_sizes = jnp.asarray(round_up(sizes, ALIGN).astype(np.int32))
    if mp > int(padded_sizes.sum()):  # all groups empty: the reference's sizes must reach Mp
        padded_sizes = padded_sizes.at[-1].add(mp - int(padded_sizes.sum()))
    want = reference(*operands, padded_sizes)
    fp8_fns = {"fp8_mosaic": fp8_fn}
    if variant_tiles is not None:
        fp8_fns["fp8_mosaic_variant"] = jax.jit(
            functools.partial(fp8_wgrad.scaled_tgmm, tiles=variant_tiles)
        )
    rows = []
    for impl, fn in fp8_fns.items():
        row = {**base, "impl": impl}
        if impl == "fp8_mosaic_variant":
            row["tiles"] = str(variant_tiles)
        poison = jnp.full(want.shape, jnp.nan, jnp.bfloat16)
        jax.block_until_ready(poison)
        del poison
        got = jax.block_until_ready(fn(*operands, starts_d, gs))
        checks = jax.jit(weight_gradient_errors)(got, want, gs)
        rel, group_max, nonfinite, empty_max = (float(v) for v in checks)
        row |= {"rel_err": rel, "group_max_rel_err": group_max, "nonfinite": int(nonfinite)}
        row |= {"empty_max_abs": empty_max}
        # bf16 rounding of the result is ~2e-3 relative (Frobenius); FP8 products summed in the
        # wgmma accumulator (narrower than float32) add a little at large M.
        row["ok"] = bool(rel < 1e-2 and group_max < 2e-2 and nonfinite == 0 and empty_max == 0)
        del got
        rows.append(row)
    del want
    if not timed:
        return rows

    contenders = {
        impl: (lambda fn=fn: fn(*operands, starts_d, gs), jax_sync) for impl, fn in fp8_fns.items()
    }
    xb, dyb = x.astype(jnp.bfloat16), dy.astype(jnp.bfloat16)
    bf16_fn = jax.jit(pallas_mosaic_wgrad.tgmm)
    contenders["bf16_mosaic"] = (lambda: bf16_fn(xb, dyb, gs), jax_sync)
    rows.append({**base, "impl": "bf16_mosaic"})
    if torch is not None:
        tx = torch.from_dlpack(xb)
        tdy = torch.from_dlpack(dyb)
        offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
        # dw_nk[g] = dy[rows of g]^T @ x[rows of g]: torch's weight gradient of
        # _grouped_mm(x, w_nk^T), the contraction ragged.
        contenders["torch"] = (
            functools.partial(torch._grouped_mm, tdy.t(), tx, offs=offs),
            torch_sync,
        )
        rows.append({**base, "impl": "torch"})
    ready = {}
    for r in rows:
        call, sync = contenders[r["impl"]]
        try:
            ready[r["impl"]] = (call, sync, warm_up(call, sync))
        except Exception as error:  # noqa: BLE001 - the probe records failures and goes on
            traceback.print_exc()
            r["error"] = f"{type(error).__name__}: {error}"[:300]
    timings = time_interleaved(ready, rounds=rounds)
    flops = 2 * shape.m * shape.k * shape.n
    for r in rows:
        if r["impl"] in timings:
            t = timings[r["impl"]]
            r |= {"ms": t.median_ms, "min_ms": t.min_ms, "tflops": flops / t.median_ms / 1e9}
    for r in rows:
        for peer in ("bf16_mosaic", "torch"):
            if r.get("ms") and peer in timings:
                r[f"ratio_vs_{peer}"] = timings[peer].median_ms / r["ms"]
    return rows


def render(header, rows) -> str:
    return markdown_report("FP8 wgrad (Mosaic GPU tgmm on e4m3)", COLUMNS)(header, rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--routings", default="balanced,skewed")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument(
        "--smoke", action="store_true", help="check only, a tiny shape, small tiles (any backend)"
    )
    parser.add_argument(
        "--whole-slab",
        action="store_true",
        help="also check and time WHOLE_SLAB_TILES (rows fp8_mosaic_variant)",
    )
    args = parser.parse_args(argv)
    torch = None
    if not args.smoke:
        try:
            import torch
        except ImportError:
            torch = None
    header = results_header(
        "python benchmarks/fp8_wgrad_probe.py " + " ".join(sys.argv[1:] if argv is None else argv),
        gpu=torch.cuda.get_device_name() if torch is not None else None,
        timing=f"median over {args.rounds} interleaved rounds (time_interleaved)",
        flops="2*M*K*N (useful only)",
    )
    out = os.path.join(args.out_dir, "fp8-wgrad-probe.json")
    shapes = [SMOKE_SHAPE] if args.smoke else [GEMM_SHAPES[s] for s in args.shapes.split(",")]
    rows: list[dict] = []
    start = time.time()
    for routing in args.routings.split(","):
        for shape in shapes:
            new = len(rows)
            try:
                rows += run_case(
                    shape,
                    routing,
                    tiles=SMOKE_TILES if args.smoke else None,
                    timed=not args.smoke,
                    rounds=args.rounds,
                    torch=torch,
                    variant_tiles=WHOLE_SLAB_TILES if args.whole_slab else None,
                )
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                rows.append(
                    {
                        "shape": shape.name,
                        "routing": routing,
                        "error": f"{type(error).__name__}: {error}"[:300],
                    }
                )
            for row in rows[new:]:
                print(row, flush=True)
            write_results(out, header, rows, render)
            if torch is not None:
                torch.cuda.empty_cache()
    print(f"done in {time.time() - start:.0f} s: {out}", flush=True)
    return 0 if all(r.get("ok", True) and "error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
