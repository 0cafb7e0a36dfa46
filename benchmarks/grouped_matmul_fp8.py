"""FP8 grouped matmul on the GPU: jaxmoe's Mosaic GPU FP8 kernel vs torch._scaled_grouped_mm vs
jaxmoe bf16, forward, on the six grouped-matmul shapes (balanced groups), in one process.

What is checked and timed, per shape (``GEMM_SHAPES`` of :mod:`jaxmoe.bench.presets`):

* The operands: ``x [M, K]`` and ``w [G, K, N]`` drawn in float32, quantized once by jaxmoe's
  rowwise e4m3 recipe (per-row and per-(group, output channel) float32 scales). Every FP8 impl
  multiplies these same bytes: torch gets them through DLPack. The weights are stored K-major,
  ``[G, N, K]``, as FP8 ``wgmma`` and ``torch._scaled_grouped_mm`` both need (transposed once,
  outside the timing, for both).
* ``jaxmoe_fp8``: :func:`jaxmoe.ops.fp8.pallas_mosaic.scaled_gmm_kn` on the K-major weights;
  ``jaxmoe_fp8_api``: ``scaled_grouped_matmul(backend="pallas")`` on ``[G, K, N]`` weights (the FP8
  API's layout: the K-major copy is made per call, so this row shows what that costs).
* ``torch_fp8``: ``torch._scaled_grouped_mm`` with row-wise scales, bf16 out,
  ``use_fast_accum=True`` (FP8 products accumulated in the tensor core's accumulator, as the jaxmoe
  kernel does); ``torch_fp8_exact_accum``: the same with ``use_fast_accum=False``.
* ``jaxmoe_bf16``: ``grouped_matmul`` (default backend: the Mosaic bf16 kernel) on the bf16 casts.
* Errors, on the GPU in float64 with torch: ``rel_err_vs_fp64`` (Frobenius, against the float64
  product of the dequantized operands; bf16 rounding of the result alone is ~1e-3),
  ``max_err_vs_fp64`` (the largest error over the largest reference element), and
  ``rel_err_vs_bf16`` (against the bf16 product, i.e. the quantization error).
* Timings interleaved: ``ROUNDS`` rounds over the impls, the median of each impl's medians.

Before the shapes, small GPU checks with skewed groups (empty groups, a group cut by tiles, tail
rows): the forward against float64 and zero tails, and ``fp8_grouped_matmul(backend="pallas")``'s
values and gradients against ``backend="xla"`` (the dgrad runs in the same kernel); the same for
the blockwise recipe (``blockwise_checks``: per-K-step scales, never run on a GPU before). Per
shape, after the interleaved rows, two rows timed on their own (not interleaved):
``jaxmoe_fp8_blockwise`` (default tiles, ``block_m`` 64) and ``... bm=128``: the blockwise recipe
on the same ``x``, ``w`` (its own quantization, K-major weights), with its error against the
float64 product of its own dequantized operands.

Writes ``$OUT/grouped_matmul-fp8-h100.json`` (``{"header", "rows"}``) and ``.md``::

    python benchmarks/grouped_matmul_fp8.py --out $OUT/grouped_matmul-fp8-h100.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.bench.gemm import hard_group_sizes
from jaxmoe.bench.harness import markdown_report, results_header, write_results
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.bench.timing import time_jax, time_torch
from jaxmoe.ops.fp8 import (
    Fp8Recipe,
    dequantize,
    fp8_grouped_matmul,
    quantize,
    scaled_grouped_matmul,
)
from jaxmoe.ops.fp8.pallas_mosaic import default_fp8_tiles, pipeline_fp8_tiles, scaled_gmm_kn
from jaxmoe.ops.grouped_matmul import grouped_matmul
from jaxmoe.ops.grouped_matmul.pallas_mosaic_tiles import MosaicTileConfig

ROUNDS = 3
# Tiles tried on the small-K/N Qwen3 shapes, where the default (the bf16 kernel's, block_k 128)
# was 0.81-0.94x torch in the first H100 run; not interleaved, the default's row is the peer.
SWEEP = {
    "qwen3-up": [
        MosaicTileConfig(128, 128, 128, stages=4, pipelined_tiles=True),
        MosaicTileConfig(128, 256, 128, stages=4, pipelined_tiles=False, epilogue_rows=64),
    ],
    "qwen3-down": [
        MosaicTileConfig(128, 256, 128, stages=3, pipelined_tiles=True, epilogue_rows=64),
        MosaicTileConfig(128, 256, 128, stages=2, pipelined_tiles=True),
        MosaicTileConfig(128, 128, 128, stages=3, pipelined_tiles=True),
    ],
}


def ring_variants(m: int, k: int, n: int) -> list[MosaicTileConfig]:
    """Tiles to time beside the default (the ring with the swizzled epilogue): the session-7
    pipeline tiles and the ring without the swizzled epilogue."""
    return [
        pipeline_fp8_tiles(m, k, n),
        dataclasses.replace(default_fp8_tiles(m, k, n), swizzled_epilogue=False),
    ]


RECIPE = Fp8Recipe("rowwise")
BLOCKWISE = Fp8Recipe("blockwise")  # DeepSeek-V3: 1x128 activation tiles, 128x128 weight blocks
COLUMNS = [
    ("shape", "shape", ""),
    ("impl", "impl", ""),
    ("ms", "ms", "{:.3f}"),
    ("tflops", "TFLOP/s", "{:.0f}"),
    ("ratio_vs_torch_fp8", "vs torch fp8", "{:.2f}x"),
    ("ratio_vs_jaxmoe_bf16", "vs jaxmoe bf16", "{:.2f}x"),
    ("rel_err_vs_fp64", "err vs fp64", "{:.2e}"),
    ("max_err_vs_fp64", "max err vs fp64", "{:.2e}"),
    ("rel_err_vs_bf16", "err vs bf16", "{:.2e}"),
]


def to_torch(array):
    """A jax GPU array as a torch tensor (no copy); FP8 goes through a uint8 view."""
    import torch

    if array.dtype == jnp.float8_e4m3fn:
        as_bytes = jax.lax.bitcast_convert_type(array, jnp.uint8)
        return torch.from_dlpack(as_bytes).view(torch.float8_e4m3fn)
    return torch.from_dlpack(array)


def grouped_reference64(x_q, x_scale, w_q_nk, w_scale, bounds):
    """float64 (torch, GPU): each group's dequantized rows @ its dequantized weights."""
    import torch

    out = torch.zeros(x_q.shape[0], w_q_nk.shape[1], dtype=torch.float64, device="cuda")
    for g, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        if end > start:
            rows = x_q[start:end].double() * x_scale[start:end].double()[:, None]
            weights = w_q_nk[g].double() * w_scale[g].double()[:, None]  # [N, K]
            out[start:end] = rows @ weights.T
    return out


def errors(got, ref64, bf16_product=None) -> dict:
    """Relative Frobenius errors, and the largest error over the reference's largest element."""

    got = got.double()
    diff = got - ref64
    result = {
        "rel_err_vs_fp64": float(diff.norm() / ref64.norm().clamp_min(1e-30)),
        "max_err_vs_fp64": float(diff.abs().max() / ref64.abs().max().clamp_min(1e-30)),
    }
    if bf16_product is not None:
        result["rel_err_vs_bf16"] = float(
            (got - bf16_product).norm() / bf16_product.norm().clamp_min(1e-30)
        )
    return result


def gpu_checks() -> list[dict]:
    """Skewed groups on the GPU: forward vs float64, zero tails, values and grads vs 'xla'."""
    import torch

    rows = []
    m, k, n = 1024, 512, 512
    sizes = [300, 0, 5, 400, 100]  # an empty group, a 5-row group, 214 tail rows
    kx, kw, kd = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (m, k)) * jnp.exp(jax.random.uniform(kx, (m, 1), minval=-3, maxval=3))
    w = jax.random.normal(kw, (len(sizes), k, n)) / np.sqrt(k)
    gs = jnp.asarray(sizes, jnp.int32)
    x_q, x_s = quantize(x, RECIPE.lhs_blocks)
    w_q, w_s = quantize(w, RECIPE.rhs_blocks)
    got = jax.jit(functools.partial(scaled_grouped_matmul, backend="pallas"))(
        x_q, x_s, w_q, w_s, gs
    )
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    ref = grouped_reference64(
        to_torch(x_q),
        to_torch(x_s[:, 0]),
        to_torch(jnp.swapaxes(w_q, 1, 2)),
        to_torch(w_s[:, 0, :]),
        bounds,
    )
    got_t = to_torch(got)
    tail_zero = bool((got_t[bounds[-1] :] == 0).all())
    rows.append({"check": "skewed fwd vs fp64", "tail_zero": tail_zero, **errors(got_t, ref)})

    rows += pallas_against_xla(x, w, gs, jax.random.normal(kd, (m, n)), "rowwise", "")
    del torch
    return rows


def pallas_against_xla(x, w, gs, dy, recipe, label: str) -> list[dict]:
    """``fp8_grouped_matmul(backend="pallas")`` against ``"xla"``: the bf16 output and both
    gradients of ``sum(out * dy)``, as relative Frobenius errors."""

    def loss(backend, a, b):
        out = fp8_grouped_matmul(a, b, gs, recipe=recipe, backend=backend)  # bf16 out
        return jnp.sum(out.astype(jnp.float32) * dy), out

    results = {}
    for backend in ("pallas", "xla"):
        fn = jax.jit(jax.grad(functools.partial(loss, backend), argnums=(0, 1), has_aux=True))
        (dx, dw), out = fn(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
        results[backend] = (out, dx, dw)
    rows = []
    for name, a, b in zip(("out", "dx", "dw"), results["pallas"], results["xla"], strict=True):
        a64, b64 = (to_torch(v.astype(jnp.float32)).double() for v in (a, b))
        err = float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))
        rows.append({"check": f"{label}fp8_grouped_matmul pallas vs xla: {name}", "rel_err": err})
    return rows


def blockwise_checks() -> list[dict]:
    """The blockwise recipe on the GPU, skewed groups: the forward against float64 (block scales
    spread over e**+-3, so a scale applied to the wrong K block is far off), zero tails, and
    ``fp8_grouped_matmul(recipe="blockwise", backend="pallas")`` values and grads vs ``"xla"``."""
    rows = []
    m, k, n = 1024, 512, 512
    sizes = [300, 0, 5, 400, 100]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    kx, kw, ks, kd = jax.random.split(jax.random.key(2), 4)
    x_blocks = jnp.exp(jax.random.uniform(ks, (m, k // 128), minval=-3, maxval=3))
    x = jax.random.normal(kx, (m, k)) * jnp.repeat(x_blocks, 128, axis=1)
    w_blocks = jnp.exp(
        jax.random.uniform(ks, (len(sizes), k // 128, n // 128), minval=-2, maxval=2)
    )
    w = jax.random.normal(kw, (len(sizes), k, n)) / np.sqrt(k)
    w = w * jnp.repeat(jnp.repeat(w_blocks, 128, axis=1), 128, axis=2)
    gs = jnp.asarray(sizes, jnp.int32)
    x_q, x_s = quantize(x, BLOCKWISE.lhs_blocks)
    w_q, w_s = quantize(w, BLOCKWISE.rhs_blocks)
    got = jax.jit(functools.partial(scaled_grouped_matmul, recipe=BLOCKWISE, backend="pallas"))(
        x_q, x_s, w_q, w_s, gs
    )
    x_deq = dequantize(x_q, x_s, BLOCKWISE.lhs_blocks)  # float32: one rounding per element
    w_deq = dequantize(w_q, w_s, BLOCKWISE.rhs_blocks)
    ones_m, ones_gn = jnp.ones((m,), jnp.float32), jnp.ones((len(sizes), n), jnp.float32)
    ref = grouped_reference64(
        to_torch(x_deq), to_torch(ones_m), to_torch(jnp.swapaxes(w_deq, 1, 2)), to_torch(ones_gn),
        bounds,
    )  # fmt: skip
    got_t = to_torch(got)
    tail_zero = bool((got_t[bounds[-1] :] == 0).all())
    rows.append(
        {"check": "blockwise skewed fwd vs fp64", "tail_zero": tail_zero, **errors(got_t, ref)}
    )
    return rows + pallas_against_xla(
        x, w, gs, jax.random.normal(kd, (m, n)), BLOCKWISE, "blockwise "
    )


def median_time(timer, fn, *args) -> float:
    return timer(fn, *args, warmup=2, repeats=7).median_ms


def skewed_check(shape, x_q, x_s, w_q_nk, w_s) -> dict:
    """The default tiles against the session-7 pipeline tiles on skewed groups (two empty, 77
    rows past the sum): the same products in the same order, so the outputs must be bitwise
    equal, and the tail rows zero."""
    gs = jnp.asarray(hard_group_sizes(shape.m, shape.groups))
    end = int(gs.sum())
    pipeline = pipeline_fp8_tiles(shape.m, shape.k, shape.n)
    row = {"check": f"{shape.name} skewed: default tiles vs session-7 pipeline tiles"}
    try:
        outs = [
            jax.jit(functools.partial(scaled_gmm_kn, rhs_layout="gnk", tiles=tiles))(
                x_q, x_s, w_q_nk, w_s, gs
            )
            for tiles in (None, pipeline)
        ]
        row["differing_elements"] = int(jnp.sum(outs[0] != outs[1]))
        row["tail_zero"] = bool(jnp.all(outs[0][end:] == 0))
    except Exception as error:  # noqa: BLE001
        row["error"] = f"{type(error).__name__}: {error}"[:300]
    return row


def run_shape(shape, header, rows, out_path, sweep: str = "fixed") -> None:
    import torch

    sizes = np.full(shape.groups, shape.m // shape.groups)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (shape.m, shape.k), jnp.float32)
    w = jax.random.normal(kw, (shape.groups, shape.k, shape.n), jnp.float32) / np.sqrt(shape.k)
    gs = jnp.asarray(sizes, jnp.int32)
    x_q, x_s = quantize(x, RECIPE.lhs_blocks)
    w_q, w_s = quantize(w, RECIPE.rhs_blocks)
    w_q_nk = jnp.swapaxes(w_q, 1, 2).copy()  # K-major, outside the timing (as for torch)
    x_bf, w_bf = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    del x, w

    xq_t, xs_t = to_torch(x_q), to_torch(x_s[:, 0]).contiguous()
    wq_nk_t, ws_t = to_torch(w_q_nk), to_torch(w_s[:, 0, :]).contiguous()
    offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")

    fp8_kernel = jax.jit(functools.partial(scaled_gmm_kn, rhs_layout="gnk"))
    fp8_api = jax.jit(functools.partial(scaled_grouped_matmul, backend="pallas"))
    bf16 = jax.jit(grouped_matmul)

    def torch_fp8(fast_accum):
        def call():
            return torch._scaled_grouped_mm(
                xq_t,
                wq_nk_t.transpose(-2, -1),
                xs_t,
                ws_t,
                offs=offs,
                out_dtype=torch.bfloat16,
                use_fast_accum=fast_accum,
            )

        return call

    impls = {
        "jaxmoe_fp8": (time_jax, fp8_kernel, (x_q, x_s, w_q_nk, w_s, gs)),
        "jaxmoe_fp8_api": (time_jax, fp8_api, (x_q, x_s, w_q, w_s, gs)),
        "torch_fp8": (time_torch, torch_fp8(True), ()),
        "torch_fp8_exact_accum": (time_torch, torch_fp8(False), ()),
        "jaxmoe_bf16": (time_jax, bf16, (x_bf, w_bf, gs)),
    }
    ref64 = grouped_reference64(xq_t, xs_t, wq_nk_t, ws_t, bounds)
    results = {
        name: {"shape": shape.name, "pass": "fwd", "recipe": "rowwise", "impl": name}
        for name in impls
    }
    bf16_product = None
    try:
        bf16_product = to_torch(bf16(x_bf, w_bf, gs)).double()
    except Exception as error:  # noqa: BLE001 - recorded in the row, the run goes on
        results["jaxmoe_bf16"]["error"] = f"{type(error).__name__}: {error}"[:300]
    for name, (_, fn, args) in impls.items():
        row = results[name]
        if row.get("error"):
            continue
        try:
            got = fn(*args)
            got_t = to_torch(got) if not isinstance(got, torch.Tensor) else got
            if name == "jaxmoe_bf16":
                ref = grouped_reference64(
                    to_torch(x_bf),
                    torch.ones_like(xs_t),
                    to_torch(jnp.swapaxes(w_bf, 1, 2)),
                    torch.ones_like(ws_t),
                    bounds,
                )
                row.update(errors(got_t, ref, bf16_product))  # vs fp64 of its bf16 operands
            else:
                row.update(errors(got_t, ref64, bf16_product))
            del got, got_t
        except Exception as error:  # noqa: BLE001
            row["error"] = f"{type(error).__name__}: {error}"[:300]
            traceback.print_exc()
    samples = {name: [] for name in impls}
    for _ in range(ROUNDS):  # interleaved: each round times every impl once
        for name, (timer, fn, args) in impls.items():
            if not results[name].get("error"):
                samples[name].append(median_time(timer, fn, *args))
    for name, row in results.items():
        if samples[name]:
            row["ms"] = statistics.median(samples[name])
            row["tflops"] = shape.flops / (row["ms"] * 1e-3) / 1e12
        else:
            row["ms"] = None
    for row in results.values():
        for key, peer in (
            ("ratio_vs_torch_fp8", "torch_fp8"),
            ("ratio_vs_jaxmoe_bf16", "jaxmoe_bf16"),
        ):
            peer_ms = results[peer].get("ms")
            row[key] = peer_ms / row["ms"] if peer_ms and row.get("ms") else None
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    variants = {"fixed": SWEEP.get(shape.name, ()), "none": ()}.get(sweep)
    if variants is None:  # "ring"
        variants = ring_variants(shape.m, shape.k, shape.n)
        rows.append(skewed_check(shape, x_q, x_s, w_q_nk, w_s))
        print(rows[-1], flush=True)
    for cfg in variants:
        row = {"shape": shape.name, "pass": "fwd", "recipe": "rowwise", "impl": f"sweep {cfg}"}
        try:
            fn = jax.jit(functools.partial(scaled_gmm_kn, rhs_layout="gnk", tiles=cfg))
            row.update(errors(to_torch(fn(x_q, x_s, w_q_nk, w_s, gs)), ref64))
            row["ms"] = median_time(time_jax, fn, x_q, x_s, w_q_nk, w_s, gs)
            row["tflops"] = shape.flops / (row["ms"] * 1e-3) / 1e12
            row["ratio_vs_torch_fp8"] = results["torch_fp8"]["ms"] / row["ms"]
        except Exception as error:  # noqa: BLE001
            row["error"] = f"{type(error).__name__}: {error}"[:300]
        rows.append(row)
        print(row, flush=True)
    # The blockwise recipe on the same x, w (its own quantization, weights K-major as above): the
    # default tiles (block_m 64: two accumulators per warpgroup) and block_m 128 (expected to
    # spill registers: 256 per thread for the two accumulators).
    try:
        bx_q, bx_s = quantize(x_bf.astype(jnp.float32), BLOCKWISE.lhs_blocks)
        bw_q, bw_s = quantize(w_bf.astype(jnp.float32), BLOCKWISE.rhs_blocks)
        bw_q_nk = jnp.swapaxes(bw_q, 1, 2).copy()
        ref_b = grouped_reference64(
            to_torch(dequantize(bx_q, bx_s, BLOCKWISE.lhs_blocks)),
            torch.ones_like(xs_t),
            to_torch(jnp.swapaxes(dequantize(bw_q, bw_s, BLOCKWISE.rhs_blocks), 1, 2)),
            torch.ones_like(ws_t),
            bounds,
        )
    except Exception as error:  # noqa: BLE001
        traceback.print_exc()
        ref_b = f"{type(error).__name__}: {error}"[:300]
    default_bw = default_fp8_tiles(shape.m, shape.k, shape.n, BLOCKWISE)
    blockwise_variants = [
        ("jaxmoe_fp8_blockwise", default_bw),
        ("jaxmoe_fp8_blockwise bm=128", dataclasses.replace(default_bw, block_m=128)),
    ]
    if sweep == "ring":
        ring_bw = dataclasses.replace(
            default_bw, ring=True, pipelined_tiles=False, swizzled_epilogue=True
        )
        blockwise_variants = [blockwise_variants[0], ("jaxmoe_fp8_blockwise ring", ring_bw)]
    for name, cfg in blockwise_variants:
        row = {"shape": shape.name, "pass": "fwd", "recipe": "blockwise", "impl": name}
        try:
            if isinstance(ref_b, str):
                raise RuntimeError(ref_b)
            fn = jax.jit(
                functools.partial(scaled_gmm_kn, rhs_layout="gnk", recipe=BLOCKWISE, tiles=cfg)
            )
            row.update(errors(to_torch(fn(bx_q, bx_s, bw_q_nk, bw_s, gs)), ref_b, bf16_product))
            row["ms"] = median_time(time_jax, fn, bx_q, bx_s, bw_q_nk, bw_s, gs)
            row["tflops"] = shape.flops / (row["ms"] * 1e-3) / 1e12
            for key, peer in (
                ("ratio_vs_torch_fp8", "torch_fp8"),
                ("ratio_vs_jaxmoe_bf16", "jaxmoe_bf16"),
            ):
                peer_ms = results[peer].get("ms")
                row[key] = peer_ms / row["ms"] if peer_ms else None
        except Exception as error:  # noqa: BLE001
            row["error"] = f"{type(error).__name__}: {error}"[:300]
            traceback.print_exc()
        rows.append(row)
        print(row, flush=True)
    del ref_b
    write_results(out_path, header, rows, render)
    del ref64, bf16_product
    torch.cuda.empty_cache()


def render(header, rows) -> str:
    table = markdown_report("FP8 grouped matmul, forward, rowwise e4m3", COLUMNS)(
        header, [r for r in rows if "impl" in r]
    )
    checks = [r for r in rows if "check" in r]
    lines = ["", "", "GPU checks (skewed groups, empty groups, tail rows):", ""]
    lines += [f"- {r}" for r in checks]
    return table + "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="grouped_matmul-fp8.json")
    parser.add_argument("--shapes", default=",".join(s for s in GEMM_SHAPES if s != "tiny"))
    parser.add_argument(
        "--sweep",
        choices=("fixed", "ring", "none"),
        default="fixed",
        help="extra rowwise tile rows: the fixed Qwen3 list, the default tiles on the ring, none",
    )
    parser.add_argument("--skip-checks", action="store_true", help="no GPU exactness checks")
    args = parser.parse_args(argv)
    import torch

    header = results_header(
        "python benchmarks/grouped_matmul_fp8.py " + " ".join(argv or sys.argv[1:]),
        gpu=torch.cuda.get_device_name(),
        groups="balanced",
        timing=f"median over {ROUNDS} interleaved rounds of time_jax/time_torch medians",
        flops="2*M*K*N per forward",
    )
    rows: list[dict] = []
    for checks in () if args.skip_checks else (gpu_checks, blockwise_checks):
        try:
            rows += checks()
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            rows.append(
                {"check": checks.__name__, "error": f"{type(error).__name__}: {error}"[:300]}
            )
    for row in rows:
        print(row, flush=True)
    write_results(args.out, header, rows, render)
    for name in args.shapes.split(","):
        run_shape(GEMM_SHAPES[name], header, rows, args.out, args.sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
