"""The FP8 Mosaic GPU kernel (``jaxmoe.ops.fp8.pallas_mosaic``, ``backend="pallas"``) on CPU.

On a CPU the kernel runs in Mosaic GPU's interpreter, which multiplies float8 operands (as
float32 products, exactly) but has no transposed ``wgmma`` operand; there the weights go in
``[G, K, N]`` and the same body (work list, schedule, group-boundary stores, scale epilogue) runs.
The K-major ``[G, N, K]`` operand FP8 ``wgmma`` needs on the GPU is proven by lowering for CUDA
here and on the device by ``jaxmoe bench fp8-gemm`` (its GPU checks run before the timing).

Bound: the kernel's float32 result (FP8 products are exact in float32; the sum and the two
scale multiplies round) is cast to bf16, so each element is within one bf16 ulp (``2**-8``
relative) of the float64 product of the dequantized operands. Blockwise (scales per K block,
applied per K step) adds float32 rounding of the sum of scaled partials, bounded by ``2**-20``
of the product of the operands' magnitudes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_test_base import Backend, Tol
from test_fp8 import Fp8Op, dequantized_operands

from jaxmoe.ops.fp8 import Fp8Recipe, dequantize, quantize, resolve_fp8_backend
from jaxmoe.ops.fp8 import pallas_mosaic as fp8_mosaic
from jaxmoe.ops.fp8.pallas_mosaic import PallasMosaicScaledGroupedMatmul
from jaxmoe.ops.fp8.xla import XlaScaledGroupedMatmul
from jaxmoe.ops.mosaic import gmm_kernel as pallas_mosaic_kernel
from jaxmoe.ops.mosaic import tiles as pallas_mosaic_tiles
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig

ROWWISE = Fp8Recipe("rowwise")
BLOCKWISE = Fp8Recipe("blockwise")
M, K, N = 256, 256, 256
# Two K steps per tile, two N tiles, several M tiles, more work items than the two simulated SMs.
SMALL = MosaicTileConfig(64, 128, 128, stages=2, group_swizzle=2)
CHAINED = MosaicTileConfig(64, 128, 128, stages=2, group_swizzle=2, pipelined_tiles=True)
# Blockwise: each compute warpgroup's 128 columns are one scale block, so block_n = 256.
BW_SMALL = MosaicTileConfig(64, 256, 128, stages=2, group_swizzle=2)
BW_CHAINED = MosaicTileConfig(64, 256, 128, stages=2, group_swizzle=2, pipelined_tiles=True)
# The hand-written ring with the default tiles' 64-row swizzled epilogue slab: the rowwise
# epilogue, and the blockwise per-step scales in its carry.
RING = MosaicTileConfig(
    64, 128, 128, stages=2, group_swizzle=2, ring=True, epilogue_rows=64, swizzled_epilogue=True
)
BW_RING = MosaicTileConfig(64, 256, 128, stages=2, group_swizzle=2, ring=True)
# The compute warpgroups splitting 128-row tiles (the bf16 default's layout): the row scales at
# each warpgroup's first row, a group boundary in each half.
SPLIT_ROWS = MosaicTileConfig(
    128, 256, 128, stages=2, group_swizzle=2, epilogue_rows=64, ring=True, split_rows=True
)


def _swizzled(cfg):
    return dataclasses.replace(cfg, swizzled_epilogue=True)


def _quantized(group_count, m=M, k=K, n=N, seed=0):
    rng = np.random.default_rng(seed)
    lhs = rng.standard_normal((m, k)) * np.exp(rng.uniform(-3, 3, (m, 1)))  # rows of any scale
    rhs = rng.standard_normal((group_count, k, n)) * np.exp(rng.uniform(-2, 2, (1, 1, n)))
    lhs_q, lhs_scale = quantize(jnp.asarray(lhs, jnp.float32), ROWWISE.lhs_blocks)
    rhs_q, rhs_scale = quantize(jnp.asarray(rhs, jnp.float32), ROWWISE.rhs_blocks)
    return lhs_q, lhs_scale, rhs_q, rhs_scale


def _blockwise_quantized(group_count, m=M, k=K, n=N, seed=0):
    # A magnitude per scale block (1 x 128 activation tiles, 128 x 128 weight blocks) spread
    # over e**+-3: a scale applied to the wrong K block or column block is far off.
    rng = np.random.default_rng(seed)
    lhs = rng.standard_normal((m, k)) * np.repeat(np.exp(rng.uniform(-3, 3, (m, k // 128))), 128, 1)
    blocks = np.exp(rng.uniform(-2, 2, (group_count, k // 128, n // 128)))
    rhs = rng.standard_normal((group_count, k, n)) * blocks.repeat(128, 1).repeat(128, 2)
    lhs_q, lhs_scale = quantize(jnp.asarray(lhs, jnp.float32), BLOCKWISE.lhs_blocks)
    rhs_q, rhs_scale = quantize(jnp.asarray(rhs, jnp.float32), BLOCKWISE.rhs_blocks)
    return lhs_q, lhs_scale, rhs_q, rhs_scale


def _grouped64(lhs, rhs, group_sizes):
    out, start = np.zeros((lhs.shape[0], rhs.shape[2])), 0
    for g, size in enumerate(group_sizes):
        size = min(size, lhs.shape[0] - start)
        out[start : start + size] = lhs[start : start + size] @ rhs[g]
        start += size
    return out


def _reference64(lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, recipe=ROWWISE, absolute=False):
    """The float64 product of the dequantized operands (``absolute``: of their magnitudes)."""
    lhs = np.asarray(dequantize(lhs_q, lhs_scale, recipe.lhs_blocks), np.float64)
    rhs = np.asarray(dequantize(rhs_q, rhs_scale, recipe.rhs_blocks), np.float64)
    if absolute:
        lhs, rhs = np.abs(lhs), np.abs(rhs)
    return _grouped64(lhs, rhs, group_sizes)


def _check_within_one_bf16_ulp(got, want, magnitude=None):
    """``magnitude`` (the product of the operands' magnitudes): also allow float32 rounding of
    the sum, ``2**-20 * magnitude`` (the blockwise kernel adds per-block partials, each scaled
    by its own scales, so the sum may cancel far below its terms)."""
    got = np.asarray(jnp.asarray(got).astype(jnp.float32), np.float64)
    slack = 0.0 if magnitude is None else 2.0**-20 * magnitude
    assert np.all(np.abs(got - want) <= 2.0**-8 * np.abs(want) + slack + 1e-30), (
        f"max relative error {np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)):.3g}"
    )


# Each config is one interpreted kernel call (~5-10 s on CPU), so each covers several options:
# the plain pipeline (SMALL, unswizzled epilogue): test_backend_matches_reference_backend_through_
# the_api_with_k_major_weights; the swizzled epilogue on jax's pipeline: "chained_swizzled"; on
# the ring (the default tiles' layout, 64-row slabs): "ring_swizzled".
@pytest.mark.parametrize(
    "cfg",
    [_swizzled(CHAINED), RING, SPLIT_ROWS],
    ids=["chained_swizzled", "ring_swizzled", "split_rows"],
)
def test_forward_empty_groups_straddling_tiles_and_tail(cfg):
    # Groups end at rows 70, 70, 73, 173, 213: an empty group, a 3-row group inside one tile,
    # boundaries inside tiles and 43 tail rows, which must be zeros.
    sizes = [70, 0, 3, 100, 40]
    operands = _quantized(len(sizes))
    got = fp8_mosaic.scaled_gmm_kn(*operands, jnp.asarray(sizes, jnp.int32), tiles=cfg)
    assert got.shape == (M, N) and got.dtype == jnp.bfloat16
    _check_within_one_bf16_ulp(got, _reference64(*operands, sizes))
    assert np.all(np.asarray(got)[213:] == 0)


class TestFp8MosaicBackends(Fp8Op):
    """backend="pallas" through the API in the interpreter, against the float64 product of the
    dequantized operands (an empty group, a 3-row group, boundaries in tiles, tail rows): the
    rowwise forward on the plain pipeline (SMALL); the blockwise forward and VJP on BW_CHAINED
    (jax's pipeline chaining tiles, the per-step scales in its carry; the dgrad runs the
    forward's FP8 weights transposed in the kernel), with a magnitude per scale block so that a
    scale applied to the wrong block is far off."""

    BACKENDS = {
        "pallas-rowwise": Backend(
            (PallasMosaicScaledGroupedMatmul(tiles=SMALL), ROWWISE),
            (M, K, N),
            ("bfloat16",),
            vjp=False,
            cases=(),
        ),
        "pallas-blockwise": Backend(
            (PallasMosaicScaledGroupedMatmul(tiles=BW_CHAINED), BLOCKWISE),
            (M, K, N),
            ("bfloat16",),
            cases=(),
        ),
    }
    # Forward: one bf16 ulp per element (check_forward); the gradients, bf16 results of float32
    # sums: 2**-7 of the largest.
    TOLERANCES = {"bfloat16": Tol(2.0**-8, 2.0**-7)}

    def group_sizes(self, case, m):
        return {"empty_and_tail": [70, 0, 3, 100, 40]}[case]

    def make_inputs(self, m, k, n, groups, dtype, seed):
        rng = np.random.default_rng(2)
        spread = np.repeat(np.exp(rng.uniform(-3, 3, (m, k // 128))), 128, 1)
        lhs = jnp.asarray(rng.standard_normal((m, k)) * spread, dtype)
        blocks = np.exp(rng.uniform(-2, 2, (groups, k // 128, n // 128)))
        w_spread = blocks.repeat(128, 1).repeat(128, 2) / 16
        rhs = jnp.asarray(rng.standard_normal((groups, k, n)) * w_spread, dtype)
        return (lhs, rhs), jnp.asarray(rng.standard_normal((m, n)), dtype)

    def check_forward(self, got, want, operands, group_sizes, dtype):
        # With the float32 rounding of a sum that cancels (far below its terms).
        quantized, _, _ = dequantized_operands(*operands, self.recipe)
        magnitude = _reference64(*quantized, group_sizes, self.recipe, absolute=True)
        _check_within_one_bf16_ulp(got, want, magnitude)


def test_k_major_entry_hands_the_interpreter_the_kn_weights(monkeypatch):
    # The "gnk" entry (K-major weights, the GPU layout): in the interpreter it hands the kernel
    # the same [G, K, N] weights as "gkn" (checked without a second ~10 s interpreted run; the
    # K-major read itself is proven by the lowering tests below).
    sizes = [70, 0, 3, 100, 40]
    lhs_q, lhs_scale, rhs_q, rhs_scale = _quantized(len(sizes), seed=1)
    gs = jnp.asarray(sizes, jnp.int32)
    launched = []

    def recording_launch(lhs, rhs, group_sizes, plan, *variant, **kwargs):
        launched.append(rhs)
        return jnp.zeros((lhs.shape[0], rhs.shape[2]), plan.out_dtype)

    monkeypatch.setattr(fp8_mosaic, "launch_gmm", recording_launch)
    fp8_mosaic.scaled_gmm_kn(
        lhs_q, lhs_scale, jnp.swapaxes(rhs_q, 1, 2), rhs_scale, gs, rhs_layout="gnk", tiles=SMALL
    )
    assert len(launched) == 1
    np.testing.assert_array_equal(
        np.asarray(launched[0].astype(jnp.float32)), np.asarray(rhs_q.astype(jnp.float32))
    )


@pytest.mark.parametrize("tiles_name", ["default", "pipeline", "pipeline_swizzled", "group_start"])
@pytest.mark.parametrize("rhs_layout", ["gkn", "gnk"])
def test_lowers_for_cuda_with_k_major_weights(rhs_layout, tiles_name):
    # No GPU needed: Mosaic GPU's lowering (run at .lower()) accepts the FP8 wgmma with the
    # weights K-major (transposed in the kernel's terms) and the scale loads of the epilogue, on
    # the default tiles (the ring, swizzled epilogue) and on the jax-pipeline tiles.
    m, k, n, g = 256, 1024, 512, 5
    rhs_shape = (g, n, k) if rhs_layout == "gnk" else (g, k, n)
    pipeline = fp8_mosaic.pipeline_fp8_tiles(m, k, n)
    tiles = {
        "default": None,
        "pipeline": pipeline,
        "pipeline_swizzled": dataclasses.replace(pipeline, swizzled_epilogue=True),
        # Tiles (and so the epilogue's scale loads) starting off the 128-row grid.
        "group_start": dataclasses.replace(
            fp8_mosaic.default_fp8_tiles(m, k, n), group_start_tiles=True
        ),
    }[tiles_name]
    fn = jax.jit(
        functools.partial(
            fp8_mosaic.scaled_gmm_kn, rhs_layout=rhs_layout, interpret=False, tiles=tiles
        )
    )
    fp8 = jnp.float8_e4m3fn
    lowered = fn.trace(
        jax.ShapeDtypeStruct((m, k), fp8),
        jax.ShapeDtypeStruct((m, 1), jnp.float32),
        jax.ShapeDtypeStruct(rhs_shape, fp8),
        jax.ShapeDtypeStruct((g, 1, n), jnp.float32),
        jax.ShapeDtypeStruct((g,), jnp.int32),
    ).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


def test_default_tiles_are_the_bf16_kernels_with_128_wide_k_blocks():
    for m, k, n in [(16384, 4096, 14336), (65536, 2048, 768), (32768, 2048, 7168)]:
        cfg, bf16 = (
            fp8_mosaic.default_fp8_tiles(m, k, n),
            pallas_mosaic_tiles.default_mosaic_gmm_tiles(m, k, n),
        )
        # The same schedule (ring, swizzled epilogue, slab, depth) with 128 FP8 elements per K
        # step; the compute warpgroups split the columns, tiles stay on the global grid and
        # CTAs are not clustered (split rows, group-start tiles and the weight multicast are
        # measured in bf16 only).
        assert cfg.block_k == 128 and cfg == dataclasses.replace(
            bf16, block_k=128, split_rows=False, group_start_tiles=False, multicast_weights=False
        )
        pallas_mosaic_tiles.check_tiles(cfg, operand_bytes=1)
        # Blockwise: DeepGEMM's 128 x 128 tile on the ring, each compute warpgroup 64 rows by one
        # 128-wide scale block of columns (its two float32 accumulators fit its registers).
        blockwise = fp8_mosaic.default_fp8_tiles(m, k, n, BLOCKWISE)
        assert (blockwise.block_m, blockwise.block_n, blockwise.block_k) == (128, 128, 128)
        assert blockwise.ring and blockwise.split_rows
        assert pallas_mosaic_tiles.warpgroup_tile(blockwise) == (64, 128)
        pallas_mosaic_tiles.check_tiles(blockwise, operand_bytes=1)
    # The jax-pipeline tiles (pipeline_fp8_tiles), kept for comparison. K = 768: 6 steps of 128
    # chain tiles in whole turns of a 3-deep ring, not of a 4-deep one.
    qwen3_down = fp8_mosaic.pipeline_fp8_tiles(65536, 768, 2048)
    assert qwen3_down.pipelined_tiles and qwen3_down.stages == 3
    assert pallas_mosaic_kernel.chains_tiles(qwen3_down, 768)
    pallas_mosaic_tiles.check_tiles(qwen3_down, operand_bytes=1)
    with pytest.raises(ValueError, match="block_k=64 must be 128"):
        pallas_mosaic_tiles.check_tiles(MosaicTileConfig(), operand_bytes=1)


# BW_CHAINED (jax's pipeline chaining tiles, the per-step scales in its carry; the plain
# pipeline's k_step_scale call site is the same): TestFp8MosaicBackends["pallas-blockwise"]
# (the same groups, to the same bound). The
# ring on the global 64-row grid: "ring_group_start" runs the same ring body on the other grid.
# The split-rows case runs its tiles plain and with the two knobs: the plain run against
# float64, the knobbed one against it bit for bit (the plain run was also a case of its own).
@pytest.mark.parametrize(
    "split_rows",
    [False, True],
    ids=["64x256", "default-128x128-split-rows-ordered-issue-prefetched-scales"],
)
def test_blockwise_forward_empty_groups_straddling_tiles_and_tail_on_the_ring(split_rows):
    # Two K blocks (K = 256), four column scale blocks over two N tiles (N = 512): each K step's
    # partial product is scaled by its own row and block scales. Groups as in the rowwise test.
    # group_start: tiles from each group's first row (rounded down to 8), so the row scales are
    # read at rows off the 64-row grid (the rowwise epilogue's reads there: lowering only).
    # split_rows: the default tiles' layout (each warpgroup's row scales from its own first row),
    # then the same tiles with ordered_issue (the warpgroups' wgmma in turn, across tiles and
    # CTAs with no tiles) and prefetch_scales (each step's scales carried from the step before):
    # the same products summed in the same order, so bitwise the same result.
    cfg = dataclasses.replace(BW_RING, group_start_tiles=True)
    if split_rows:
        cfg = dataclasses.replace(
            fp8_mosaic.default_fp8_tiles(M, K, 512, BLOCKWISE), stages=2, group_swizzle=2
        )
    sizes, n = [70, 0, 3, 100, 40], 512
    operands = _blockwise_quantized(len(sizes), n=n)

    def run(tiles):
        return fp8_mosaic.scaled_gmm_kn(
            *operands, jnp.asarray(sizes, jnp.int32), tiles=tiles, recipe="blockwise"
        )

    got = run(cfg)
    if split_rows:
        knobbed = run(dataclasses.replace(cfg, ordered_issue=True, prefetch_scales=True))
        np.testing.assert_array_equal(np.asarray(knobbed), np.asarray(got))
    assert got.shape == (M, n) and got.dtype == jnp.bfloat16
    want = _reference64(*operands, sizes, BLOCKWISE)
    _check_within_one_bf16_ulp(got, want, _reference64(*operands, sizes, BLOCKWISE, True))
    assert np.all(np.asarray(got)[213:] == 0)


@pytest.mark.parametrize("tiles", ["default", "swizzled", "ring", "ordered-prefetched"])
@pytest.mark.parametrize(
    "rhs_layout, k, n", [("gkn", 1024, 512), ("gnk", 2048, 2048)], ids=["gkn-chained", "gnk"]
)
def test_blockwise_lowers_for_cuda_with_k_major_weights(rhs_layout, k, n, tiles):
    # The per-K-step path on the GPU: a scoped wgmma accumulator per step, the row scales loaded
    # in its row layout, the block scale a scalar load; with one pipeline across a CTA's tiles
    # (default tiles where min(K, N) <= 1024) and without; and on the hand-written ring, the
    # tiles `jaxmoe bench fp8-gemm` times against the default.
    m, g = 256, 5
    rhs_shape = (g, n, k) if rhs_layout == "gnk" else (g, k, n)
    default = fp8_mosaic.default_fp8_tiles(m, k, n, BLOCKWISE)
    ring = dataclasses.replace(
        default, ring=True, pipelined_tiles=False, epilogue_rows=64, swizzled_epilogue=True
    )
    knobbed = dataclasses.replace(default, ordered_issue=True, prefetch_scales=True)
    cfg = {"default": None, "swizzled": _swizzled(default), "ring": ring}.get(tiles, knobbed)
    fn = jax.jit(
        functools.partial(
            fp8_mosaic.scaled_gmm_kn,
            rhs_layout=rhs_layout,
            interpret=False,
            recipe="blockwise",
            tiles=cfg,
        )
    )
    fp8 = jnp.float8_e4m3fn
    lowered = fn.trace(
        jax.ShapeDtypeStruct((m, k), fp8),
        jax.ShapeDtypeStruct((m, k // 128), jnp.float32),
        jax.ShapeDtypeStruct(rhs_shape, fp8),
        jax.ShapeDtypeStruct((g, k // 128, n // 128), jnp.float32),
        jax.ShapeDtypeStruct((g,), jnp.int32),
    ).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


def test_blockwise_needs_128_wide_blocks_and_block_n_256():
    args = ((256, 256), (2, 256, 256), jnp.float8_e4m3fn, jnp.float8_e4m3fn, jnp.bfloat16)
    assert fp8_mosaic.unsupported_reason(*args, BLOCKWISE, BW_SMALL, interpret=True) is None
    reason = fp8_mosaic.unsupported_reason(*args, BLOCKWISE, SMALL, interpret=True)
    assert "needs block_n=256" in reason
    # Split rows gives each warpgroup all 256 columns: two scale blocks, which the per-step
    # scale (one weight scale per warpgroup) cannot apply.
    split = MosaicTileConfig(128, 256, 128, stages=2, ring=True, split_rows=True)
    reason = fp8_mosaic.unsupported_reason(*args, BLOCKWISE, split, interpret=True)
    assert "split_rows=False" in reason
    reason = fp8_mosaic.unsupported_reason(
        *args, Fp8Recipe("blockwise", block_size=64), BW_SMALL, interpret=True
    )
    assert "block_size=64 is not 128" in reason


# (what to change, the words of the reason)
REFUSED = {
    "blockwise64": ({"recipe": Fp8Recipe("blockwise", block_size=64)}, "block_size 128 only"),
    "e5m2": ({"rhs_dtype": jnp.float8_e5m2}, "not float8_e4m3fn"),
    "f32 out": ({"out_dtype": jnp.float32}, "not a 2-byte type"),
    "m": ({"m": 100}, "block_m"),
    "k": ({"k": 192}, "block_k"),
    "n": ({"n": 96}, "block_n"),
}


def _call_backend(backend, m=128, k=128, n=256, recipe=ROWWISE, rhs_dtype=None, out_dtype=None):
    lhs_q, lhs_scale = quantize(jnp.ones((m, k)), recipe.lhs_blocks)
    rhs_q, rhs_scale = quantize(jnp.ones((2, k, n)), recipe.rhs_blocks, rhs_dtype or recipe.dtype)
    text = jax.make_jaxpr(
        lambda *a: backend.scaled_gmm(
            *a, jnp.array([40, 50], jnp.int32), recipe=recipe, out_dtype=out_dtype or jnp.bfloat16
        )
    )(lhs_q, lhs_scale, rhs_q, rhs_scale)
    return "wgmma" in str(text)


@pytest.mark.parametrize("change, why", list(REFUSED.values()), ids=list(REFUSED))
def test_named_pallas_never_falls_back_silently(change, why):
    with pytest.raises(NotImplementedError, match=why):
        _call_backend(resolve_fp8_backend("pallas"), **change)


def test_auto_on_a_gpu_takes_the_kernel_where_it_applies_and_xla_elsewhere():
    auto = resolve_fp8_backend("auto", platform="gpu")
    assert isinstance(auto, PallasMosaicScaledGroupedMatmul)
    assert isinstance(auto.fallback, XlaScaledGroupedMatmul)
    assert isinstance(resolve_fp8_backend("auto", platform="cpu"), XlaScaledGroupedMatmul)
    assert resolve_fp8_backend("pallas").fallback is None
    assert _call_backend(auto)
    assert _call_backend(auto, recipe=BLOCKWISE)
    for change, _ in REFUSED.values():
        assert not _call_backend(auto, **change), change


def test_a_gpu_other_than_hopper_is_refused(monkeypatch):
    monkeypatch.setattr(pallas_mosaic_tiles, "_compute_capability", lambda: "8.0")
    reason = fp8_mosaic.unsupported_reason(
        (128, 128), (2, 128, 256), jnp.float8_e4m3fn, jnp.float8_e4m3fn, jnp.bfloat16,
        ROWWISE, fp8_mosaic.default_fp8_tiles(128, 128, 256), interpret=False,
    )  # fmt: skip
    assert "compute capability 8.0" in reason
