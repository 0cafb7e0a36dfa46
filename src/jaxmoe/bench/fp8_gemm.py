"""``jaxmoe bench fp8-gemm``: the FP8 (e4m3) grouped matmul on the GPU, jaxmoe's Mosaic GPU
kernel against ``torch._scaled_grouped_mm`` and jaxmoe's bf16 kernel, forward, balanced groups.

Per shape (``GEMM_SHAPES`` of :mod:`jaxmoe.bench.presets`):

* The operands: ``x [M, K]`` and ``w [G, K, N]`` drawn in float32, quantized once by jaxmoe's
  rowwise recipe (per-row and per-(group, output channel) float32 scales). Every FP8 impl
  multiplies these same bytes (torch gets them through DLPack). The weights are stored K-major,
  ``[G, N, K]``, as FP8 ``wgmma`` and ``torch._scaled_grouped_mm`` both need (transposed once,
  outside the timing, for both).
* ``jaxmoe_fp8``: :func:`jaxmoe.ops.fp8.pallas_mosaic.scaled_gmm_kn` on the K-major weights;
  ``jaxmoe_fp8_api``: ``scaled_grouped_matmul(backend="pallas")`` on ``[G, K, N]`` weights (the
  K-major copy is made per call: this row shows what that costs).
* ``torch_fp8``: ``torch._scaled_grouped_mm`` with row-wise scales, bf16 out,
  ``use_fast_accum=True`` (products summed in the tensor core's accumulator, as jaxmoe's kernel
  does); ``torch_fp8_exact_accum``: the same with ``use_fast_accum=False``.
* ``jaxmoe_bf16``: ``grouped_matmul`` (the default backend) on the bf16 casts.
* Errors, on the GPU in float64 with torch: ``rel_err_vs_fp64`` (Frobenius, against the float64
  product of the dequantized operands; bf16 rounding of the result alone is ~1e-3),
  ``max_err_vs_fp64`` (the largest error over the largest reference element) and
  ``rel_err_vs_bf16`` (against the bf16 product: the quantization error).
* ``jaxmoe_fp8_blockwise``: the blockwise recipe (its own quantization of the same ``x``,
  ``w``) with its default tiles, and the other tiles of :func:`blockwise_tiles`
  (``jaxmoe_fp8_blockwise ring ...``); ``ratio_vs_jaxmoe_rowwise``: against ``jaxmoe_fp8``.
* Time: all of these in interleaved rounds (:func:`jaxmoe.bench.timing.time_interleaved`);
  then, timed on their own, the rowwise tile variants of ``sweep``.

Before the shapes, GPU checks on skewed groups (an empty group, a group cut by tiles, tail
rows): each recipe's forward against float64 with zero tails, and ``fp8_grouped_matmul(backend=
"pallas")``'s values and gradients against ``backend="xla"``. Needs a CUDA GPU and torch.
"""

from __future__ import annotations

import dataclasses
import functools
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.bench.gemm import hard_group_sizes
from jaxmoe.bench.harness import markdown_report
from jaxmoe.bench.presets import GemmShape
from jaxmoe.bench.timing import jax_sync, time_interleaved, time_jax, torch_sync, warm_up
from jaxmoe.ops.fp8 import (
    Fp8Recipe,
    dequantize,
    fp8_grouped_matmul,
    quantize,
    scaled_grouped_matmul,
)
from jaxmoe.ops.fp8.pallas_mosaic import default_fp8_tiles, pipeline_fp8_tiles, scaled_gmm_kn
from jaxmoe.ops.grouped_matmul import grouped_matmul
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig

ROUNDS = 3
SHAPES = ("mixtral-up", "mixtral-down", "dsv3-up", "dsv3-down", "qwen3-up", "qwen3-down")
SWEEPS = ("fixed", "ring", "none")
# Tiles tried on the small-K/N Qwen3 shapes, where the default (the bf16 kernel's, block_k 128)
# was 0.81-0.94x torch on an H100; the default's row is their peer.
FIXED_SWEEP = {
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
RECIPE = Fp8Recipe("rowwise")
BLOCKWISE = Fp8Recipe("blockwise")  # DeepSeek-V3: 1x128 activation tiles, 128x128 weight blocks
PEERS = (
    ("ratio_vs_torch_fp8", "torch_fp8"),
    ("ratio_vs_jaxmoe_bf16", "jaxmoe_bf16"),
    ("ratio_vs_jaxmoe_rowwise", "jaxmoe_fp8"),
)
HEADER_FACTS = {
    "groups": "balanced",
    "timing": "interleaved rounds (jaxmoe.bench.timing.time_interleaved), the blockwise tiles "
    "among them; the rowwise tile variants timed on their own (time_jax)",
    "flops": "2*M*K*N per forward",
}
COLUMNS = (
    ("shape", "shape", ""),
    ("recipe", "recipe", ""),
    ("impl", "impl", ""),
    ("ms", "ms", "{:.3f}"),
    ("tflops", "TFLOP/s", "{:.0f}"),
    ("ratio_vs_torch_fp8", "vs torch fp8", "{:.2f}x"),
    ("ratio_vs_jaxmoe_bf16", "vs jaxmoe bf16", "{:.2f}x"),
    ("ratio_vs_jaxmoe_rowwise", "vs jaxmoe rowwise", "{:.2f}x"),
    ("rel_err_vs_fp64", "err vs fp64", "{:.2e}"),
    ("max_err_vs_fp64", "max err vs fp64", "{:.2e}"),
    ("rel_err_vs_bf16", "err vs bf16", "{:.2e}"),
)
CHECK_SIZES = (300, 0, 5, 400, 100)  # an empty group, a 5-row group, 214 tail rows of 1024


def blockwise_tiles(shape: GemmShape, sweep: str) -> dict[str, MosaicTileConfig]:
    """The blockwise recipe's tiles timed in the interleaved rounds, by impl name: the default
    (128 x 128 on the ring, rows split); with ``sweep`` other than ``"none"`` jax's pipeline
    with ``block_m`` 64 (the earlier default); with ``"ring"`` also ``64 x 256`` on the ring."""
    tiles = {"jaxmoe_fp8_blockwise": default_fp8_tiles(shape.m, shape.k, shape.n, BLOCKWISE)}
    if sweep == "none":
        return tiles
    pipeline = pipeline_fp8_tiles(shape.m, shape.k, shape.n, BLOCKWISE)
    tiles["jaxmoe_fp8_blockwise pipeline bm=64"] = pipeline
    if sweep == "ring":
        tiles["jaxmoe_fp8_blockwise ring bm=64"] = dataclasses.replace(
            pipeline, ring=True, pipelined_tiles=False, epilogue_rows=64, swizzled_epilogue=True
        )
    return tiles


def _error(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:300]


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


def dequantized_reference64(x_q, x_s, w_q, w_s, recipe, bounds):
    """:func:`grouped_reference64` of any recipe's operands, dequantized in float32 first."""
    import torch

    x = to_torch(dequantize(x_q, x_s, recipe.lhs_blocks))
    w_nk = to_torch(jnp.swapaxes(dequantize(w_q, w_s, recipe.rhs_blocks), 1, 2))
    ones_m = torch.ones(x.shape[0], device="cuda")
    ones_gn = torch.ones(w_nk.shape[:2], device="cuda")
    return grouped_reference64(x, ones_m, w_nk, ones_gn, bounds)


def errors(got, ref64, bf16_product=None) -> dict[str, float]:
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


def _check_operands(recipe: Fp8Recipe, seed: int):
    """Skewed-group check operands whose magnitudes spread over the recipe's scale blocks
    (a scale applied to the wrong row or K block is then far off)."""
    m, k, n, groups = 1024, 512, 512, len(CHECK_SIZES)
    kx, kw, ks, kd = jax.random.split(jax.random.key(seed), 4)
    if recipe.name == "blockwise":
        x_blocks = jnp.exp(jax.random.uniform(ks, (m, k // 128), minval=-3, maxval=3))
        x = jax.random.normal(kx, (m, k)) * jnp.repeat(x_blocks, 128, axis=1)
        w_blocks = jnp.exp(
            jax.random.uniform(ks, (groups, k // 128, n // 128), minval=-2, maxval=2)
        )
        w = jax.random.normal(kw, (groups, k, n)) / np.sqrt(k)
        w = w * jnp.repeat(jnp.repeat(w_blocks, 128, axis=1), 128, axis=2)
    else:
        x = jax.random.normal(kx, (m, k)) * jnp.exp(
            jax.random.uniform(kx, (m, 1), minval=-3, maxval=3)
        )
        w = jax.random.normal(kw, (groups, k, n)) / np.sqrt(k)
    return x, w, jnp.asarray(CHECK_SIZES, jnp.int32), jax.random.normal(kd, (m, n))


def pallas_against_xla(x, w, gs, dy, recipe, label: str) -> list[dict[str, Any]]:
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


def recipe_checks(recipe: Fp8Recipe) -> list[dict[str, Any]]:
    """One recipe on skewed groups: the kernel's forward against float64 with zero tail rows,
    then :func:`pallas_against_xla`."""
    x, w, gs, dy = _check_operands(recipe, seed=1 if recipe.name == "rowwise" else 2)
    x_q, x_s = quantize(x, recipe.lhs_blocks)
    w_q, w_s = quantize(w, recipe.rhs_blocks)
    fn = jax.jit(functools.partial(scaled_grouped_matmul, recipe=recipe, backend="pallas"))
    got = to_torch(fn(x_q, x_s, w_q, w_s, gs))
    bounds = np.concatenate([[0], np.cumsum(CHECK_SIZES)]).tolist()
    ref = dequantized_reference64(x_q, x_s, w_q, w_s, recipe, bounds)
    tail_zero = bool((got[bounds[-1] :] == 0).all())
    label = "" if recipe.name == "rowwise" else f"{recipe.name} "
    row = {"check": f"{label}skewed fwd vs fp64", "tail_zero": tail_zero, **errors(got, ref)}
    return [row, *pallas_against_xla(x, w, gs, dy, recipe, label)]


def skewed_tiles_check(shape: GemmShape, operands, recipe: Fp8Recipe) -> dict[str, Any]:
    """The recipe's tiles that the benchmark times, against jax's pipeline tiles, on skewed
    groups (two empty, 77 rows past the sum): the same products summed in the same order, so
    the outputs must be bitwise equal, and the tail rows zero. ``operands``: rowwise, the
    quantized ``(x_q, x_s, w_q_nk, w_s)``; blockwise, ``(x, w)`` to quantize."""
    gs = jnp.asarray(hard_group_sizes(shape.m, shape.groups))
    end = int(gs.sum())
    if recipe.name == "blockwise":
        tiles = list(blockwise_tiles(shape, "ring").values())
        operands = _blockwise_operands(*operands)
    else:
        tiles = [default_fp8_tiles(shape.m, shape.k, shape.n)]
    pipeline = pipeline_fp8_tiles(shape.m, shape.k, shape.n, recipe)
    row: dict[str, Any] = {"check": f"{shape.name} skewed: {recipe.name} tiles vs pipeline tiles"}
    try:

        def run(cfg):
            fn = functools.partial(scaled_gmm_kn, rhs_layout="gnk", recipe=recipe, tiles=cfg)
            return jax.jit(fn)(*operands, gs)

        want = run(pipeline)
        outs = [run(cfg) for cfg in tiles if cfg != pipeline]
        row["differing_elements"] = [int(jnp.sum(out != want)) for out in outs]
        row["tail_zero"] = bool(all(jnp.all(out[end:] == 0) for out in [want, *outs]))
    except Exception as error:  # noqa: BLE001 - recorded in the row
        row["error"] = _error(error)
    return row


def _fill_speed(row: dict[str, Any], shape: GemmShape, peers: dict[str, dict]) -> None:
    ms = row.get("ms")
    row["tflops"] = shape.flops / (ms * 1e-3) / 1e12 if ms else None
    for key, peer in PEERS:
        peer_ms = peers.get(peer, {}).get("ms")
        row[key] = peer_ms / ms if peer_ms and ms else None


def _blockwise_operands(x_bf, w_bf):
    """The blockwise recipe's own quantization of the shape's ``x``, ``w``: ``(x_q, x_s,
    w_q_nk, w_s)``, the weights K-major (made outside the timing)."""
    bx_q, bx_s = quantize(x_bf.astype(jnp.float32), BLOCKWISE.lhs_blocks)
    bw_q, bw_s = quantize(w_bf.astype(jnp.float32), BLOCKWISE.rhs_blocks)
    return bx_q, bx_s, jnp.swapaxes(bw_q, 1, 2).copy(), bw_s


def _interleaved_rows(shape, ops, bounds, rounds, settle_ms, blockwise):
    """The five rowwise impls on the operands ``ops`` and the blockwise recipe with each of
    ``blockwise``'s tiles (impl name -> tiles) on its own quantization of them, each checked
    against float64, then all timed in interleaved rounds: ``(rows by impl, the rowwise float64
    reference, the bf16 product)``."""
    import torch

    x_q, x_s, w_q, w_s, w_q_nk, x_bf, w_bf, gs = ops
    xq_t, xs_t = to_torch(x_q), to_torch(x_s[:, 0]).contiguous()
    wq_nk_t, ws_t = to_torch(w_q_nk), to_torch(w_s[:, 0, :]).contiguous()
    offs = torch.as_tensor(np.asarray(bounds[1:]), dtype=torch.int32, device="cuda")
    fp8_kernel = jax.jit(functools.partial(scaled_gmm_kn, rhs_layout="gnk"))
    fp8_api = jax.jit(functools.partial(scaled_grouped_matmul, backend="pallas"))
    bf16 = jax.jit(grouped_matmul)

    def torch_fp8(fast_accum):
        def call():
            return torch._scaled_grouped_mm(
                xq_t, wq_nk_t.transpose(-2, -1), xs_t, ws_t, offs=offs,
                out_dtype=torch.bfloat16, use_fast_accum=fast_accum,
            )  # fmt: skip

        return call

    impls = {
        "jaxmoe_fp8": (lambda: fp8_kernel(x_q, x_s, w_q_nk, w_s, gs), jax_sync),
        "jaxmoe_fp8_api": (lambda: fp8_api(x_q, x_s, w_q, w_s, gs), jax_sync),
        "torch_fp8": (torch_fp8(True), torch_sync),
        "torch_fp8_exact_accum": (torch_fp8(False), torch_sync),
        "jaxmoe_bf16": (lambda: bf16(x_bf, w_bf, gs), jax_sync),
    }
    recipes = dict.fromkeys(impls, "rowwise")
    references = {}
    if blockwise:
        blockwise_args = (*_blockwise_operands(x_bf, w_bf), gs)
        bx_q, bx_s, bw_q_nk, bw_s, _ = blockwise_args
        blockwise_ref = dequantized_reference64(
            bx_q, bx_s, jnp.swapaxes(bw_q_nk, 1, 2), bw_s, BLOCKWISE, bounds
        )
        references = dict.fromkeys(blockwise, blockwise_ref)
    for name, tiles in blockwise.items():
        fn = jax.jit(
            functools.partial(scaled_gmm_kn, rhs_layout="gnk", recipe=BLOCKWISE, tiles=tiles)
        )
        impls[name] = (functools.partial(fn, *blockwise_args), jax_sync)
        recipes[name] = "blockwise"
    ref64 = grouped_reference64(xq_t, xs_t, wq_nk_t, ws_t, bounds)
    bf16_ref64 = grouped_reference64(
        to_torch(x_bf), torch.ones_like(xs_t), to_torch(jnp.swapaxes(w_bf, 1, 2)),
        torch.ones_like(ws_t), bounds,
    )  # fmt: skip
    bf16_product = to_torch(bf16(x_bf, w_bf, gs)).double()
    rows = {
        name: {"shape": shape.name, "pass": "fwd", "recipe": recipes[name], "impl": name}
        for name in impls
    }
    references["jaxmoe_bf16"] = bf16_ref64
    ready = {}
    for name, (call, sync) in impls.items():
        try:
            got = call()
            got = got if isinstance(got, torch.Tensor) else to_torch(got)
            rows[name].update(errors(got, references.get(name, ref64), bf16_product))
            ready[name] = (call, sync, warm_up(call, sync))
        except Exception as error:  # noqa: BLE001 - recorded in the row, the others still run
            traceback.print_exc()
            rows[name]["error"] = _error(error)
    for name, timing in time_interleaved(ready, rounds=rounds, settle_ms=settle_ms).items():
        rows[name]["ms"] = timing.median_ms
    for row in rows.values():
        _fill_speed(row, shape, rows)
    return rows, ref64, bf16_product


def _variant_rows(shape, ops, peers, sweep, ref64, bf16_product) -> list[dict[str, Any]]:
    """The rowwise tile variants of ``sweep``, timed on their own; with ``"ring"`` first the
    skewed-groups checks of the default tiles against the pipeline's."""
    x_q, x_s, _, w_s, w_q_nk, x_bf, w_bf, gs = ops
    rows: list[dict[str, Any]] = []
    variants = {"fixed": FIXED_SWEEP.get(shape.name, []), "none": []}.get(sweep)
    if variants is None:  # "ring": the pipeline tiles, the ring without the swizzled epilogue
        variants = [
            pipeline_fp8_tiles(shape.m, shape.k, shape.n),
            dataclasses.replace(
                default_fp8_tiles(shape.m, shape.k, shape.n), swizzled_epilogue=False
            ),
        ]
        rows.append(skewed_tiles_check(shape, (x_q, x_s, w_q_nk, w_s), RECIPE))
        rows.append(skewed_tiles_check(shape, (x_bf, w_bf), BLOCKWISE))
    for tiles in variants:
        row = {"shape": shape.name, "pass": "fwd", "recipe": "rowwise", "impl": f"sweep {tiles}"}
        try:
            fn = jax.jit(functools.partial(scaled_gmm_kn, rhs_layout="gnk", tiles=tiles))
            row.update(errors(to_torch(fn(x_q, x_s, w_q_nk, w_s, gs)), ref64, bf16_product))
            row["ms"] = time_jax(fn, x_q, x_s, w_q_nk, w_s, gs, warmup=2, repeats=7).median_ms
        except Exception as error:  # noqa: BLE001 - recorded in the row, the others still run
            traceback.print_exc()
            row["error"] = _error(error)
        _fill_speed(row, shape, peers)
        rows.append(row)
    return rows


def run_shape(
    shape: GemmShape, *, sweep: str = "fixed", rounds: int = ROUNDS, settle_ms=None
) -> list[dict[str, Any]]:
    """One shape's rows: the interleaved impls, then the variants timed on their own."""
    import torch

    sizes = np.full(shape.groups, shape.m // shape.groups)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (shape.m, shape.k), jnp.float32)
    w = jax.random.normal(kw, (shape.groups, shape.k, shape.n), jnp.float32) / np.sqrt(shape.k)
    x_q, x_s = quantize(x, RECIPE.lhs_blocks)
    w_q, w_s = quantize(w, RECIPE.rhs_blocks)
    w_q_nk = jnp.swapaxes(w_q, 1, 2).copy()  # K-major, outside the timing (as for torch)
    ops = (x_q, x_s, w_q, w_s, w_q_nk, x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    ops += (jnp.asarray(sizes, jnp.int32),)
    del x, w
    blockwise = blockwise_tiles(shape, sweep)
    peers, ref64, bf16_product = _interleaved_rows(shape, ops, bounds, rounds, settle_ms, blockwise)
    rows = list(peers.values())
    rows += _variant_rows(shape, ops, peers, sweep, ref64, bf16_product)
    del ref64, bf16_product
    torch.cuda.empty_cache()
    return rows


def run_fp8_gemm_benchmark(
    shapes: Sequence[GemmShape],
    *,
    sweep: str = "fixed",
    checks: bool = True,
    rounds: int = ROUNDS,
    settle_ms: float | None = None,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """The GPU checks (``checks``), then every shape's rows (:func:`run_shape`), each passed to
    ``on_row`` as it is made. Check rows carry ``check``, timed rows ``impl``."""
    rows: list[dict[str, Any]] = []

    def add(new):
        for row in new:
            rows.append(row)
            on_row(row)

    for recipe in (RECIPE, BLOCKWISE) if checks else ():
        try:
            add(recipe_checks(recipe))
        except Exception as error:  # noqa: BLE001 - recorded, the shapes still run
            traceback.print_exc()
            add([{"check": f"{recipe.name} checks", "error": _error(error)}])
    for shape in shapes:
        try:
            add(run_shape(shape, sweep=sweep, rounds=rounds, settle_ms=settle_ms))
        except Exception as error:  # noqa: BLE001 - recorded, the other shapes still run
            traceback.print_exc()
            add([{"shape": shape.name, "impl": "-", "error": _error(error)}])
    return rows


def render(header: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The markdown beside the JSON: the timed rows' table, then the checks."""
    table = markdown_report("FP8 grouped matmul, forward", COLUMNS)(
        header, [row for row in rows if "impl" in row]
    )
    checks = [f"- {row}" for row in rows if "check" in row]
    return "\n".join(
        [table, "", "GPU checks (skewed groups, empty groups, tail rows):", "", *checks]
    )
