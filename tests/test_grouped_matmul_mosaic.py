"""The Mosaic GPU ``gmm`` (``backend="pallas"``) against the NumPy reference of the shared suite.

On a CPU the kernel runs in Mosaic GPU's interpreter, which simulates every warpgroup, barrier
and TMA copy; each call costs seconds, so the shapes are the smallest that still give several
M tiles, two N tiles, two K steps per tile and more work items than the two simulated SMs.
The interpreter has no transposed ``wgmma`` operand, so the dgrad (``transpose_rhs``) is proven
by lowering for CUDA instead, and on the device by ``tests/gpu/test_primitives.py`` (forward
and dgrad against the reference backend, with empty groups and tail rows) and by ``jaxmoe bench
gemm``, which checks every row at the benchmark shapes before timing it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grouped_matmul import np_gmm, random_inputs

from jaxmoe.ops.grouped_matmul.api import resolve_backend
from jaxmoe.ops.grouped_matmul.pallas_mosaic import PallasMosaicGroupedMatmul
from jaxmoe.ops.grouped_matmul.pallas_triton import PallasTritonGroupedMatmul
from jaxmoe.ops.mosaic import launch as pallas_mosaic
from jaxmoe.ops.mosaic import tiles as pallas_mosaic_tiles
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, default_mosaic_gmm_tiles

M, K, N = 256, 128, 256
SMALL = MosaicTileConfig(block_m=64, block_n=128, block_k=64, stages=2, group_swizzle=2)
CONFIGS = {
    # jax's pipeline per tile with 64-row tiles (SMALL) has its straddling case in
    # test_grouped_matmul.py's TestGroupedMatmulBackends["pallas"] (an empty group, cut tiles,
    # tail rows).
    # One pipeline chained across a CTA's tiles (K / block_k = 2 steps, a multiple of the 2
    # stages), tiles from each group's first row, and the swizzled epilogue on it: the default's
    # 128-row tile with a 64-row slab, one chunk per slab, two slabs per tile (the slots
    # alternating between slabs), whose cut slabs take the unswizzled 64-row slab (the
    # unswizzled half slab's test; the ring runs the same epilogue code).
    "chained_swizzled_half_slab": MosaicTileConfig(
        128,
        128,
        64,
        stages=2,
        group_swizzle=2,
        pipelined_tiles=True,
        epilogue_rows=64,
        swizzled_epilogue=True,
        group_start_tiles=True,
    ),
    # The hand-written ring (2 K steps per tile on 2 slots: the slot wraps inside a tile and
    # across tiles), the swizzled epilogue with one store per result (one slot), and the last
    # round cut into K halves where it would leave a worker idle (14 units on 2 CTAs: nothing
    # is cut here; test_mosaic_last_round.py for the cuts). The ring's unswizzled stores:
    # "split_rows_wide" (the epilogue's code is the same for either warpgroup split).
    "ring_split_last_round": MosaicTileConfig(
        64,
        128,
        64,
        stages=2,
        group_swizzle=2,
        swizzled_epilogue=True,
        ring=True,
        split_last_round=True,
    ),
    # Two 64-column chunks per slab on the ring, the slots alternating within it (also with
    # the paired K loop: test_pair_sums_two_products_in_one_k_loop).
    "ring_swizzled": MosaicTileConfig(
        64, 256, 64, stages=2, group_swizzle=2, swizzled_epilogue=True, ring=True
    ),
    # The compute warpgroups split a tile's rows (64 each): a group boundary in either half.
    # At block_n 256 (the default's shape) the unswizzled slab is staged in two 128-column
    # parts, whole slabs and cut ones; on jax's pipeline (128 columns: one part; so is the
    # fused gated kernel's default, tested with it). The swizzled one (the default tiles with
    # three ring slots, not four: four chunks, tiles from each group's first row off the
    # block_m grid, the last groups' tiles moved back to end at M) is "multicast" below in
    # clusters, and alone in test_forward_single_group_holds_every_row_of_sizes_past_m.
    "split_rows_wide": MosaicTileConfig(
        128, 256, 64, stages=2, group_swizzle=2, epilogue_rows=64, ring=True, split_rows=True
    ),
    "split_rows_swizzled_wide": dataclasses.replace(
        default_mosaic_gmm_tiles(M, K, N), stages=3, group_swizzle=2
    ),
    "split_rows_pipeline": MosaicTileConfig(
        128, 128, 64, stages=2, group_swizzle=2, epilogue_rows=64, split_rows=True
    ),
    # The default's layout in clusters of two CTAs taking neighbouring work items, the weight
    # block multicast when the two share a group (the interpreter copies it whole into each).
    "multicast": dataclasses.replace(
        default_mosaic_gmm_tiles(M, K, N), stages=3, group_swizzle=2, multicast_weights=True
    ),
}


def mosaic_forward(group_sizes, cfg, m=M, k=K, n=N, seed=0):
    lhs, rhs, _ = random_inputs(m, k, n, len(group_sizes), "bfloat16", seed)
    out = pallas_mosaic.gmm(lhs, rhs, jnp.asarray(group_sizes, jnp.int32), tiles=cfg)
    assert out.shape == (m, n) and out.dtype == jnp.bfloat16
    return np.asarray(out.astype(jnp.float32), np.float64), np_gmm(lhs, rhs, group_sizes)


# Four configs, each holding several options. The parametrizations removed, and what covers
# each now:
# - "plain" (SMALL): test_grouped_matmul.py's TestGroupedMatmulBackends["pallas"];
# - "chained": "chained_swizzled_half_slab";
# - "swizzled" (64 x 256 on jax's pipeline): "ring_swizzled" in
#   test_pair_sums_two_products_in_one_k_loop (the same epilogue), "chained_swizzled_half_slab"
#   (the swizzled epilogue on jax's pipeline);
# - "swizzled_half_slab": "chained_swizzled_half_slab";
# - "swizzled_one_slot": "ring_split_last_round";
# - "ring_three_slots": three slots in test_pair_sums_two_products_in_one_k_loop["multicast"]
#   and test_forward_single_group_holds_every_row_of_sizes_past_m (stages=3), the unswizzled
#   half slab in "chained_swizzled_half_slab"'s cut slabs;
# - "ring_swizzled": test_pair_sums_two_products_in_one_k_loop["ring_swizzled"];
# - "split_rows_swizzled_wide" and "multicast": test_pair_sums_two_products_in_one_k_loop
#   ["multicast"] (these tiles in clusters, on the same groups) and
#   test_forward_single_group_holds_every_row_of_sizes_past_m (these tiles alone);
# - "multicast_narrow": test_mosaic_last_round.py's test_halves_in_clusters_of_two_ctas (these
#   tiles on 4 CTAs: pairs sharing a group, pairs of two groups, the odd last item, tail rows).
@pytest.mark.parametrize(
    "name",
    [
        "chained_swizzled_half_slab",
        "ring_split_last_round",
        "split_rows_wide",
        "split_rows_pipeline",
    ],
)
def test_forward_empty_groups_straddling_tiles_and_tail(name):
    # Groups end at rows 70, 70, 73, 173, 213: an empty group, a 3-row group inside one tile,
    # boundaries inside tiles (odd run lengths exercise every power-of-two store) and 43 tail
    # rows, which must be written as zeros.
    sizes, m = [70, 0, 3, 100, 40], M
    if name == "chained_swizzled_half_slab":
        # First the MoE layer's case (groups padded to the alignment), in the same kernel call
        # (each call costs seconds): rows 0-191 in groups aligned to the tiles, an empty one
        # between, so every slab they store is whole and takes the swizzled path, and the
        # 128-row tile of the 64-row group leaves its other slab empty (the 64-row tiles' whole
        # slabs: "ring_swizzled" in test_pair_sums_two_products_in_one_k_loop); then the cut
        # groups above from row 192, and 107 tail rows. (This was
        # test_swizzled_epilogue_groups_aligned_to_tiles_and_tail, a call of its own.)
        sizes, m = [128, 0, 64, *sizes], 2 * M
    got, want = mosaic_forward(sizes, CONFIGS[name], m=m)
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err <= 1.6e-2, f"{name}: relative error {err:.3g}"
    # The aligned groups alone, so that an error there is not hidden by the cut ones' scale.
    aligned = np.max(np.abs(got[:192] - want[:192])) / np.max(np.abs(want[:192]))
    assert m == M or aligned <= 1.6e-2, f"{name}: aligned groups' relative error {aligned:.3g}"
    assert np.all(got[sum(sizes) :] == 0), "rows past sum(group_sizes) are not zero"


# Whole tiles only, no tail, on the default's layout; the sizes sum past M (group 1 is cut at M,
# group 2 starts past it: both clipped). The other configs' whole tiles and slabs are in
# test_forward_empty_groups_straddling_tiles_and_tail (rows 0-63 are one group), the multicast's
# pairs sharing a group in test_mosaic_last_round.py's test_halves_in_clusters_of_two_ctas.
# (This was test_forward_random_group_sizes' explicit example, [90, 90, 90].)
def test_forward_single_group_holds_every_row_of_sizes_past_m():
    got, want = mosaic_forward([0, M + 30, 40], CONFIGS["split_rows_swizzled_wide"], seed=1)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= 1.6e-2


# jax's pipeline, and the default's layout on the hand-written ring with the last-round cut on
# (no units at all: nothing to cut).
NO_ROWS = {
    "plain": SMALL,
    "ring_default_split_last_round": dataclasses.replace(
        CONFIGS["split_rows_swizzled_wide"], split_last_round=True
    ),
}


@pytest.mark.parametrize("name", list(NO_ROWS))
def test_forward_no_rows_at_all_is_zeros(name):
    cfg = NO_ROWS[name]
    got, _ = mosaic_forward([0, 0], cfg, m=cfg.block_m, n=cfg.block_n)
    assert np.all(got == 0)


def _kernels(backend, m, k, n, dtype, transpose_rhs=False):
    gs = jnp.array([40, 50], jnp.int32)
    lhs, rhs, _ = random_inputs(m, k, n, 2, dtype)
    if transpose_rhs:
        rhs = jnp.swapaxes(rhs, 1, 2)
    text = str(
        jax.make_jaxpr(
            lambda a, b: backend.gmm(
                a, b, gs, transpose_rhs=transpose_rhs, out_dtype=jnp.dtype(dtype)
            )
        )(lhs, rhs)
    )
    return ("wgmma" in text), ("jaxmoe_gmm" in text)


# (m, k, n, dtype, transpose_rhs) the Mosaic kernel refuses, and the words of the reason.
REFUSED = [
    ((128, 64, 128, "float32"), "not bf16/fp16"),  # fp32: exact IEEE in Triton
    ((100, 64, 128, "bfloat16"), "block_m"),  # M not a multiple of block_m
    ((128, 64, 96, "bfloat16"), "block_n"),  # N not a multiple of block_n
    ((128, 64, 128, "bfloat16", True), "interpreter"),  # no transposed wgmma operand there
]


def test_auto_rule_uses_mosaic_where_it_applies_and_triton_elsewhere():
    backend = PallasMosaicGroupedMatmul(gmm_tiles=SMALL, triton_fallback=True)
    assert _kernels(backend, 128, 64, 128, "bfloat16") == (True, False)
    for args, _ in REFUSED:
        assert _kernels(backend, *args) == (False, True), args


@pytest.mark.parametrize("args, why", REFUSED, ids=["fp32", "m", "n", "dgrad-interpret"])
def test_named_pallas_never_falls_back_silently(args, why):
    backend = PallasMosaicGroupedMatmul(gmm_tiles=SMALL)  # what backend="pallas" builds
    with pytest.raises(NotImplementedError, match=why):
        _kernels(backend, *args)


def test_pallas_name_is_strict_auto_falls_back_triton_is_triton(monkeypatch):
    from jaxmoe.ops.grouped_matmul import api

    named = resolve_backend("pallas")
    assert isinstance(named, PallasMosaicGroupedMatmul) and not named.triton_fallback
    assert isinstance(resolve_backend("pallas_triton"), PallasTritonGroupedMatmul)
    monkeypatch.setattr(api, "default_backend_name", lambda platform=None: "pallas")  # a GPU
    for auto in (None, "auto"):
        chosen = resolve_backend(auto)
        assert isinstance(chosen, PallasMosaicGroupedMatmul) and chosen.triton_fallback


# The default tiles with the swizzled epilogue, plain and chained (one pipeline across tiles);
# on the GPU its two buffers are one aliased region (plgpu.RefUnion), which only lowering tests.
LOWERED = {
    "default": None,
    "chained": MosaicTileConfig(
        64, 128, 64, stages=2, group_swizzle=2, pipelined_tiles=True, group_start_tiles=True
    ),
    "swizzled": MosaicTileConfig(stages=4, epilogue_rows=64, swizzled_epilogue=True),
    "swizzled_chained": MosaicTileConfig(
        stages=4, epilogue_rows=64, pipelined_tiles=True, swizzled_epilogue=True
    ),
    "swizzled_n128": MosaicTileConfig(
        128, 128, 64, stages=4, epilogue_rows=64, swizzled_epilogue=True
    ),
    "ring": MosaicTileConfig(stages=4, epilogue_rows=64, ring=True),
    # The default before run 16: the compute warpgroups split the columns.
    "ring_swizzled_columns": MosaicTileConfig(
        stages=4, epilogue_rows=64, swizzled_epilogue=True, ring=True
    ),
    "split_rows_unswizzled": MosaicTileConfig(
        stages=4, epilogue_rows=64, ring=True, split_rows=True
    ),
    # The default before run 18: tiles on the global block_m grid.
    "grid": dataclasses.replace(default_mosaic_gmm_tiles(M, 2048, N), group_start_tiles=False),
    # Clusters of two CTAs: cluster barriers for the slots' releases, multicast weight copies.
    "multicast": dataclasses.replace(default_mosaic_gmm_tiles(M, 2048, N), multicast_weights=True),
    "multicast_narrow": dataclasses.replace(
        default_mosaic_gmm_tiles(M, 2048, N), block_n=128, multicast_weights=True
    ),
    # The last round cut into K halves, partial sums staged as float32 in the epilogue's region.
    "split_last_round": dataclasses.replace(
        default_mosaic_gmm_tiles(M, 2048, N), split_last_round=True
    ),
    "multicast_split_last_round": dataclasses.replace(
        default_mosaic_gmm_tiles(M, 2048, N), multicast_weights=True, split_last_round=True
    ),
}


# The dgrad (transposed weights) changes only how the weight blocks are sliced, allocated and
# handed to the wgmma: lowered on each distinct weight path (the ring with rows or columns
# split, jax's pipeline per tile and chained at 64, 128 and 256 columns, the multicast copy at
# 128 and 256 columns, the last round's K halves); its configs that differ from these only in
# the epilogue or the work list lower the forward only (each lowering costs about a second).
FWD_ONLY = {"swizzled_chained", "ring_swizzled_columns", "split_rows_unswizzled", "grid"}
FWD_ONLY |= {"split_last_round"}  # its dgrad: "multicast_split_last_round"


@pytest.mark.parametrize(
    "name, transpose_rhs",
    [(name, t) for name in LOWERED for t in (False, True) if not (t and name in FWD_ONLY)],
    ids=lambda v: {False: "fwd", True: "dgrad"}.get(v, v) if isinstance(v, bool) else v,
)
def test_lowers_for_cuda(transpose_rhs, name):
    # No GPU needed: proves both operand layouts, the chained pipeline and the swizzled
    # epilogue pass Mosaic GPU's lowering (layout inference included; the interpreter cannot
    # run the transposed operand).
    cfg = LOWERED[name]
    k = 2048  # default tiles: a 4-stage chained ring at K = 2048, N = 256
    rhs_shape = (5, N, k) if transpose_rhs else (5, k, N)
    fn = jax.jit(
        functools.partial(
            pallas_mosaic.gmm, transpose_rhs=transpose_rhs, tiles=cfg, interpret=False
        )
    )
    lowered = fn.trace(
        jax.ShapeDtypeStruct((M, k), jnp.bfloat16),
        jax.ShapeDtypeStruct(rhs_shape, jnp.bfloat16),
        jax.ShapeDtypeStruct((5,), jnp.int32),
    ).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "mosaic_gpu" in text  # jax 0.11 no longer spells the kernel's name in the text
    # The work list is straight-line XLA ops: no loop (a GPU launches a loop's body per step).
    assert "stablehlo.while" not in text
    # Clusters: the CTA's place in its cluster, releases arriving in both CTAs' barriers, the
    # multicast copy's CTA mask (as the wgrad's lowering test).
    clustered = cfg is not None and cfg.multicast_weights  # None: the default, at K*N 0.5 Mi
    for marker in ("gpu.cluster_block_id", "mbarrier.arrive.shared::cluster", "cluster_dim_blocks"):
        assert (marker in text) == clustered, marker


def test_default_tiles_follow_the_measured_table():
    # docs/kernels.md, 'Mosaic gmm: default tiles': the tiles, ring depth and 64-row slab; the
    # hand-written ring with the swizzled epilogue (fastest on 10 of 12 cases); split rows (12
    # of 12); tiles from each group's first row (8 of 8 skewed cases): the same on every shape.
    # The weight multicast in clusters of two CTAs on Mixtral's products only (1.03-1.05x there,
    # 0.96-1.01x on DeepSeek's and Qwen3's), either way round (the input gradient swaps K and N).
    # The last round cut into K halves on Mixtral's K = 14336 products (1.026-1.041x), not on
    # shorter contractions (level to 0.977x).
    for m, k, n, multicast, split in [
        (65536, 2048, 768, False, False),
        (32768, 2048, 7168, False, False),
        (32768, 7168, 2048, False, False),
        (16384, 4096, 14336, True, False),
        (16384, 14336, 4096, True, True),
    ]:
        cfg = default_mosaic_gmm_tiles(m, k, n)
        assert (cfg.block_m, cfg.block_n, cfg.block_k) == (128, 256, 64)
        assert (cfg.stages, cfg.epilogue_rows) == (4, 64)
        assert cfg.ring and cfg.swizzled_epilogue and cfg.split_rows and cfg.group_start_tiles
        assert cfg.multicast_weights == multicast
        assert cfg.split_last_round == split
        assert pallas_mosaic_tiles.cluster_ctas(cfg) == (2 if multicast else 1)
        pallas_mosaic_tiles.check_tiles(cfg)


def test_split_rows_stages_a_wide_slab_in_parts_so_four_slots_fit():
    # A warpgroup's [64, 256] result: the unswizzled slab is 128 columns (two parts), the same
    # 16 KiB as the two swizzled [64, 64] slots it aliases; with the 4-deep ring, 224 KiB.
    cfg = default_mosaic_gmm_tiles(16384, 4096, 14336)
    lay = pallas_mosaic_tiles.epilogue_layout(cfg)
    assert (lay["wg_m"], lay["wg_n"], lay["rows"], lay["slab_cols"]) == (64, 256, 64, 128)
    assert (lay["chunks"], lay["stores"], lay["slots"], lay["slab_rows"]) == (4, 4, 2, 64)
    assert pallas_mosaic_tiles.smem_bytes(cfg) == 4 * 48 * 1024 + 32 * 1024
    # The column split's layout is unchanged: one [64, 128] slab per warpgroup.
    columns = dataclasses.replace(cfg, split_rows=False)
    lay = pallas_mosaic_tiles.epilogue_layout(columns)
    assert (lay["wg_m"], lay["wg_n"], lay["slab_cols"]) == (128, 128, 128)
    assert pallas_mosaic_tiles.smem_bytes(columns) == pallas_mosaic_tiles.smem_bytes(cfg)


def test_split_rows_needs_128_row_tiles():
    with pytest.raises(ValueError, match="split_rows"):
        pallas_mosaic_tiles.check_tiles(MosaicTileConfig(block_m=64, split_rows=True))


def test_unsupported_operands_raise_not_implemented():
    lhs, rhs, _ = random_inputs(128, 64, 128, 2, "float32")
    with pytest.raises(NotImplementedError, match="bf16/fp16"):
        pallas_mosaic.gmm(lhs, rhs, jnp.array([64, 64], jnp.int32), tiles=SMALL)


@pytest.mark.parametrize(
    "field, value",
    [
        ("epilogue_rows", 32),
        ("block_n", 96),
        ("block_k", 128),
        ("block_m", 256),
        ("stages", 1),
        ("multicast_weights", True),  # off the ring
    ],
)
def test_bad_tiles_raise_value_error(field, value):
    with pytest.raises(ValueError, match=field):
        PallasMosaicGroupedMatmul(gmm_tiles=MosaicTileConfig(**{field: value}))


def test_tiles_that_do_not_fit_in_shared_memory_are_refused():
    # A 4-deep ring (192 KiB) leaves 35 KiB: a 64-row slab (32 KiB) fits, swizzled or not (the
    # two buffers share it); the whole-tile slab (64 KiB) and a 5-deep ring do not.
    fits = MosaicTileConfig(stages=4, epilogue_rows=64, swizzled_epilogue=True)
    pallas_mosaic_tiles.check_tiles(fits)
    assert pallas_mosaic_tiles.epilogue_smem_bytes(fits) == 32 * 1024
    for cfg in (
        MosaicTileConfig(stages=4),
        MosaicTileConfig(stages=4, swizzled_epilogue=True),
        MosaicTileConfig(stages=5, epilogue_rows=64, swizzled_epilogue=True),
    ):
        with pytest.raises(ValueError, match="shared memory.*does not fit"):
            PallasMosaicGroupedMatmul(gmm_tiles=cfg)
    # block_n = 128: the swizzled slots (2 x 64 columns) are twice the 64-column slab.
    n128 = MosaicTileConfig(128, 128, 64, stages=4, epilogue_rows=64, swizzled_epilogue=True)
    assert pallas_mosaic_tiles.epilogue_smem_bytes(n128) == 32 * 1024
    unswizzled = MosaicTileConfig(128, 128, 64, stages=4, epilogue_rows=64)
    assert pallas_mosaic_tiles.epilogue_smem_bytes(unswizzled) == 16 * 1024


@pytest.mark.parametrize("block_n", [128, 256])
@pytest.mark.parametrize("epilogue_rows", [64, 128])
@pytest.mark.parametrize("out_bytes", [2])
def test_each_warpgroup_slab_lies_on_its_own_swizzled_slots(block_n, epilogue_rows, out_bytes):
    # On the GPU the unswizzled slab ([NUM_WG, slab_rows, wg_n]) and the swizzled slots
    # ([NUM_WG, slots, rows, chunk_cols]) alias one region. A warpgroup's slab must not reach into
    # the other's slots: with block_n 128 and unpadded slabs, warpgroup 1's slab was warpgroup
    # 0's second slot (the fused gated kernel's wrong rows on skewed groups, on an H100).
    cfg = MosaicTileConfig(
        128, block_n, 64, stages=2, epilogue_rows=epilogue_rows, swizzled_epilogue=True
    )
    lay = pallas_mosaic_tiles.epilogue_layout(cfg, out_bytes)
    slab = lay["slab_rows"] * lay["wg_n"]  # elements per warpgroup, unswizzled view
    slots = lay["slots"] * lay["rows"] * lay["chunk_cols"]  # per warpgroup, swizzled view
    assert lay["slab_rows"] >= lay["rows"]
    for wg in range(2):
        used = (wg * slab, wg * slab + lay["rows"] * lay["wg_n"])
        own = (wg * slots, (wg + 1) * slots)
        assert own[0] <= used[0] and used[1] <= own[1], (wg, used, own)
    assert pallas_mosaic_tiles.epilogue_smem_bytes(cfg, out_bytes) == 2 * max(slab, slots) * 2


# Random group sizes on the default's layout (one kernel call a draw: one draw). Sizes >= 1 so
# that CI's derandomized draw is not the no-rows case (test_forward_no_rows_at_all_is_zeros);
# its sizes past M: test_forward_single_group_holds_every_row_of_sizes_past_m.
@settings(max_examples=1, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(1, 90), min_size=3, max_size=3))
def test_forward_random_group_sizes(sizes):
    got, want = mosaic_forward(sizes, CONFIGS["split_rows_swizzled_wide"], seed=sum(sizes))
    assert np.max(np.abs(got - want)) <= 1.6e-2 * max(np.max(np.abs(want)), 1e-6)
    assert np.all(got[min(sum(sizes), M) :] == 0)


def test_a_gpu_other_than_hopper_is_refused(monkeypatch):
    # wgmma exists on compute capability 9.x only: 'pallas' says so, 'auto' takes Triton.
    monkeypatch.setattr(pallas_mosaic_tiles, "_compute_capability", lambda: "8.0")
    reason = pallas_mosaic_tiles.unsupported_reason(
        (128, 64), (2, 64, 128), jnp.bfloat16, jnp.bfloat16, False, SMALL, interpret=False
    )
    assert "compute capability 8.0" in reason
    monkeypatch.setattr(pallas_mosaic_tiles, "_compute_capability", lambda: "9.0")
    assert pallas_mosaic_tiles.supports(
        (128, 64), (2, 64, 128), jnp.bfloat16, jnp.bfloat16, False, SMALL, interpret=False
    )


# The ring with the swizzled epilogue's two chunks per slab, and the default's layout with the
# weight multicast ("multicast" is "split_rows_swizzled_wide" in clusters: its pairs that do
# not share a group load their own). These are also the single products' straddling cases on
# those tiles (the pair's K loop is the single product's run twice).
@pytest.mark.parametrize("name", ["ring_swizzled", "multicast"])
def test_pair_sums_two_products_in_one_k_loop(name):
    # lhs @ rhs[g] + lhs2 @ rhs2[g]: the ring's steps run over the first pair, then the second
    # (2 + 2 K steps per tile on two slots; the slot wraps inside and across tiles). Groups cut
    # tiles, one is empty, 43 tail rows must be zeros. Each product alone would miss the other's
    # half.
    sizes = [70, 0, 3, 100, 40]
    lhs, rhs, _ = random_inputs(M, K, N, len(sizes), "bfloat16", seed=6)
    lhs2, rhs2, _ = random_inputs(M, K, N, len(sizes), "bfloat16", seed=7)
    got = pallas_mosaic.gmm_pair(
        lhs, rhs, lhs2, rhs2, jnp.asarray(sizes, jnp.int32), tiles=CONFIGS[name]
    )
    got = np.asarray(got.astype(jnp.float32), np.float64)
    want = np_gmm(lhs, rhs, sizes) + np_gmm(lhs2, rhs2, sizes)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= 1.6e-2
    assert np.all(got[213:] == 0)


def test_pair_refuses_mismatched_operands_and_tiles_off_the_ring():
    lhs, rhs, _ = random_inputs(M, K, N, 2, "bfloat16")
    sizes = jnp.asarray([100, 100], jnp.int32)
    with pytest.raises(ValueError, match="lhs2"):
        pallas_mosaic.gmm_pair(lhs, rhs, lhs[:, :64], rhs, sizes, tiles=CONFIGS["ring_swizzled"])
    with pytest.raises(ValueError, match="rhs2"):
        pallas_mosaic.gmm_pair(lhs, rhs, lhs, rhs.astype(jnp.float16), sizes)
    with pytest.raises(NotImplementedError, match="ring"):
        pallas_mosaic.gmm_pair(lhs, rhs, lhs, rhs, sizes, tiles=SMALL)


@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["fwd", "dgrad"])
def test_pair_lowers_for_cuda(transpose_rhs):
    # The gated FFN's input gradient is the transposed pair, which the interpreter cannot run.
    k = 2048
    rhs_shape = (5, N, k) if transpose_rhs else (5, k, N)
    fn = jax.jit(
        functools.partial(pallas_mosaic.gmm_pair, transpose_rhs=transpose_rhs, interpret=False)
    )
    lhs = jax.ShapeDtypeStruct((M, k), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct(rhs_shape, jnp.bfloat16)
    text = (
        fn.trace(lhs, rhs, lhs, rhs, jax.ShapeDtypeStruct((5,), jnp.int32))
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    assert "mosaic_gpu" in text and "stablehlo.while" not in text
