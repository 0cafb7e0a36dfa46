"""The Mosaic GPU ``tgmm`` (wgrad of ``backend="pallas"``): its row-block walk, lowering, wiring.

Mosaic GPU's interpreter has no transposed ``wgmma`` operand, and the kernel reads ``lhs``
transposed, so on a CPU the kernel cannot run. What runs here instead: the kernel's row-block
arithmetic (``group_row_blocks``, ``rows_in_group``, shared with the kernel) walked in plain JAX
by ``simulate_tgmm`` against the NumPy reference, with NaN in every row outside a group; the
kernel lowered for CUDA through Mosaic GPU down to NVVM; and the backend's choice of kernel. The
kernel itself is checked on the device by ``tests/gpu/test_primitives.py`` (the weight
gradient against the reference backend) and by ``jaxmoe bench gemm``'s ``fwd+bwd`` rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxmoe.ops import pallas_common
from jaxmoe.ops.grouped_matmul.pallas_mosaic import PallasMosaicGroupedMatmul
from jaxmoe.ops.grouped_matmul.pallas_triton import PallasTritonGroupedMatmul, TileConfig
from jaxmoe.ops.mosaic import tgmm_kernel as wgrad
from jaxmoe.ops.mosaic import tgmm_launch, tgmm_ring
from jaxmoe.ops.mosaic.tgmm_launch import MosaicTgmmTileConfig

M, K, N = 256, 64, 128
TRITON_TILES = TileConfig(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=2)


def np_tgmm(lhs, rhs, sizes):
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    ends = np.cumsum(sizes)
    return np.stack(
        [lhs[e - s : e].T @ rhs[e - s : e] for s, e in zip(sizes, ends, strict=True)]
        or [np.zeros((lhs.shape[1], rhs.shape[1]))]
    )[: len(sizes)]


def simulated(sizes, block_m, m=M, seed=0, dtype=jnp.bfloat16):
    """``simulate_tgmm`` with NaN in the rows past the sum, against float64 NumPy."""
    key_l, key_r = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(key_l, (m, K), jnp.float32).astype(dtype)
    rhs = jax.random.normal(key_r, (m, N), jnp.float32).astype(dtype)
    total = int(sum(sizes))
    lhs, rhs = lhs.at[total:].set(jnp.nan), rhs.at[total:].set(jnp.nan)
    got = wgrad.simulate_tgmm(lhs, rhs, jnp.asarray(sizes, jnp.int32), block_m)
    want = np_tgmm(np.asarray(lhs.astype(jnp.float32)), np.asarray(rhs.astype(jnp.float32)), sizes)
    return np.asarray(got, np.float64), want


CASES = {
    # ends 70, 70, 73, 173, 213: an empty group, a 3-row group inside one block, boundaries
    # inside blocks, 43 rows past the sum (NaN here: they must not be read into any group).
    "straddling": [70, 0, 3, 100, 40],
    "one_group_all_rows": [0, M, 0],
    "aligned": [64, 128, 64],
    "skewed": [1, 200, 0, 0, 2, 50],
    "all_empty": [0, 0, 0],
}


@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("name", list(CASES))
def test_row_block_walk_is_exact(name, block_m):
    sizes = CASES[name]
    got, want = simulated(sizes, block_m)
    assert np.all(np.isfinite(got)), "rows outside a group leaked into it"
    # float32 accumulation of bf16 products: exact to rounding of the sums.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    for g, size in enumerate(sizes):
        if size == 0:
            assert np.all(got[g] == 0), f"empty group {g} is not zeros"


@settings(max_examples=5, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(0, 90), min_size=1, max_size=5))
def test_row_block_walk_random_sizes(sizes):
    sizes = sizes if sum(sizes) <= M else [min(s, M // len(sizes)) for s in sizes]
    got, want = simulated(sizes, 64, seed=sum(sizes))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_row_blocks_of_a_group():
    # Rows [70, 173) with 64-row blocks: blocks 1 and 2 (rows 64..191); rows 6..63 of block 1.
    first, count = wgrad.group_row_blocks(jnp.int32(70), jnp.int32(173), 64)
    assert (int(first), int(count)) == (1, 2)
    assert tuple(map(int, wgrad.rows_in_group(70, 173, 64, 64))) == (6, 64)
    assert tuple(map(int, wgrad.rows_in_group(70, 173, 128, 64))) == (0, 45)
    assert int(wgrad.group_row_blocks(jnp.int32(70), jnp.int32(70), 64)[1]) == 0


@pytest.mark.parametrize(
    "cfg",
    [
        None,
        MosaicTgmmTileConfig(block_m=128, block_k=64, block_n=128, stages=2),
        MosaicTgmmTileConfig(stages=3, epilogue_rows=None),
        MosaicTgmmTileConfig(),
        MosaicTgmmTileConfig(split_rows=True, multicast_rhs=True),
    ],
    ids=["default_split_rows", "small", "three_slots_whole_slab", "column_split", "multicast"],
)
def test_lowers_for_cuda_through_mosaic_to_nvvm(cfg):
    # No GPU needed: Mosaic GPU's layout inference and lowering run on the host, down to NVVM
    # (the transposed lhs operand, the masks written back to shared memory, the TMA epilogue;
    # with multicast_rhs the cluster grid, the cluster-wide release barriers and the
    # multicast copies).
    fn = jax.jit(functools.partial(tgmm_launch.tgmm, tiles=cfg, interpret=False))
    lowered = fn.trace(
        jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16),
        jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16),
        jax.ShapeDtypeStruct((5,), jnp.int32),
    ).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "mosaic_gpu" in text and "nvvm.wgmma" in text
    clustered = cfg is not None and cfg.multicast_rhs
    # Each marker was checked to vanish when its part is dropped: the CTA's place in its
    # cluster, the releases arriving in both CTAs' barriers, the multicast copy's CTA mask.
    for marker in ("gpu.cluster_block_id", "mbarrier.arrive.shared::cluster", "cluster_dim_blocks"):
        assert (marker in text) == clustered, marker


@pytest.mark.parametrize("ctas", [1, 2])
@pytest.mark.parametrize("group_swizzle", [1, 3, 8])
def test_cluster_units_cover_every_tile_once_in_pairs_sharing_the_rhs_block(ctas, group_swizzle):
    # 3 groups x 6 K tiles x 5 N tiles: the cluster's units (one per pair of CTAs) hand out
    # every output tile exactly once, the two CTAs of a unit at neighbouring K tiles of one
    # (group, N tile) - the same rhs rows and columns, so the block can be multicast. Without
    # clusters the order is the tile order the kernel always had.
    num_groups, num_k_tiles, num_n_tiles = 3, 6, 5
    units = num_groups * num_k_tiles // ctas * num_n_tiles
    seen = []
    for index in range(units):
        tiles = [
            tuple(
                int(v)
                for v in wgrad.unit_tile(index, cta, num_k_tiles, num_n_tiles, group_swizzle, ctas)
            )
            for cta in range(ctas)
        ]
        if ctas == 2:
            (g0, k0, n0), (g1, k1, n1) = tiles
            assert (g0, n0) == (g1, n1) and k0 % 2 == 0 and k1 == k0 + 1
        else:
            tiles_per_group = num_k_tiles * num_n_tiles
            k, n = pallas_common.swizzle(
                index % tiles_per_group, num_k_tiles, num_n_tiles, group_swizzle
            )
            assert tiles == [(index // tiles_per_group, int(k), int(n))]
        seen += tiles
    assert sorted(seen) == [
        (g, k, n) for g in range(num_groups) for k in range(num_k_tiles) for n in range(num_n_tiles)
    ]


def test_multicast_needs_an_even_number_of_k_tiles():
    cfg = MosaicTgmmTileConfig(split_rows=True, multicast_rhs=True)
    # K = 384: three 128-row K tiles, one left without a partner.
    why = tgmm_launch.unsupported_tgmm_reason(
        (1024, 384), (1024, 512), jnp.bfloat16, jnp.bfloat16, cfg
    )
    assert "multicast_rhs" in why and "odd" in why
    assert (
        tgmm_launch.unsupported_tgmm_reason(
            (1024, 256), (1024, 512), jnp.bfloat16, jnp.bfloat16, cfg
        )
        is None
    )
    backend = PallasMosaicGroupedMatmul(tgmm_tiles=cfg, interpret=False)
    with pytest.raises(NotImplementedError, match="multicast_rhs"):
        _tgmm_kernel(backend, 1024, 384, 512, "bfloat16")


def _tgmm_kernel(backend, m, k, n, dtype):
    gs = jnp.array([40, 50], jnp.int32)
    lhs = jnp.zeros((m, k), dtype)
    rhs = jnp.zeros((m, n), dtype)
    text = str(
        jax.make_jaxpr(lambda a, b: backend.tgmm(a, b, gs, out_dtype=jnp.dtype(dtype)))(lhs, rhs)
    )
    return ("wgmma" in text), ("jaxmoe_tgmm" in text)


SMALL = MosaicTgmmTileConfig(block_m=64, block_k=64, block_n=128, stages=2)
REFUSED = [
    ((128, 64, 128, "float32"), "not bf16/fp16"),
    ((100, 64, 128, "bfloat16"), "block_m"),
    ((128, 64, 96, "bfloat16"), "block_n"),
]


def test_named_pallas_and_auto_take_mosaic_wgrad_auto_falls_back_where_refused():
    # interpret=False: traced as for a GPU (a jaxpr only; nothing runs on this host). Both take
    # the Mosaic wgrad wherever it applies, Qwen3-like narrow shapes included (faster than
    # Triton's balanced on an H100); 'auto' takes Triton's where the Mosaic kernel refuses.
    triton = PallasTritonGroupedMatmul(TRITON_TILES, TRITON_TILES, interpret=False)
    named = PallasMosaicGroupedMatmul(tgmm_tiles=SMALL, triton=triton, interpret=False)
    auto = PallasMosaicGroupedMatmul(
        tgmm_tiles=SMALL, triton=triton, triton_fallback=True, interpret=False
    )
    for args in [(128, 64, 128, "bfloat16"), (128, 2048, 768, "bfloat16")]:
        assert _tgmm_kernel(named, *args) == (True, False), args
        assert _tgmm_kernel(auto, *args) == (True, False), args
    for args, _ in REFUSED:
        assert _tgmm_kernel(auto, *args) == (False, True), args


@pytest.mark.parametrize("args, why", REFUSED, ids=["fp32", "m", "n"])
def test_named_pallas_wgrad_never_falls_back_silently(args, why):
    backend = PallasMosaicGroupedMatmul(tgmm_tiles=SMALL, interpret=False)
    with pytest.raises(NotImplementedError, match=why):
        _tgmm_kernel(backend, *args)


def test_interpreter_refuses_named_and_auto_takes_triton():
    named = PallasMosaicGroupedMatmul(tgmm_tiles=SMALL)
    with pytest.raises(NotImplementedError, match="interpreter"):
        _tgmm_kernel(named, 128, 64, 128, "bfloat16")
    auto = PallasMosaicGroupedMatmul(
        tgmm_tiles=SMALL,
        triton=PallasTritonGroupedMatmul(TRITON_TILES, TRITON_TILES),
        triton_fallback=True,
    )
    assert _tgmm_kernel(auto, 128, 64, 128, "bfloat16") == (False, True)


@pytest.mark.parametrize(
    "field, value",
    [
        ("block_m", 32),
        ("block_k", 256),
        ("block_n", 64),
        ("stages", 1),
        ("stages", 5),
        ("epilogue_rows", 32),
        ("epilogue_rows", None),
    ],
)
def test_bad_tiles_raise_value_error(field, value):
    # The default's four slots fit only with the half slab (224 KiB); the whole one (None: all
    # block_k rows) makes 256 KiB, a fifth slot 272.
    memory = (field == "stages" and value > 1) or value is None
    with pytest.raises(ValueError, match="memory" if memory else field):
        PallasMosaicGroupedMatmul(tgmm_tiles=MosaicTgmmTileConfig(**{field: value}))
    PallasMosaicGroupedMatmul(tgmm_tiles=MosaicTgmmTileConfig(stages=3, epilogue_rows=None))


def test_split_rows_halves_the_rows_and_stages_its_result_in_two_parts():
    # Each warpgroup: a [64, 256] result (the lhs block's columns 64 at a time, the whole rhs
    # block), staged [64, 128] at a time, so the epilogue takes the same 32 KiB as the column
    # split's two [64, 128] halves and four ring slots still fit.
    cfg = MosaicTgmmTileConfig(split_rows=True)
    assert tgmm_launch.default_mosaic_tgmm_tiles(1024, 256, 512) == cfg
    assert tgmm_ring.warpgroup_tile(cfg) == (64, 256) and tgmm_ring.warpgroup_tile(
        MosaicTgmmTileConfig()
    ) == (128, 128)
    assert (tgmm_ring.epilogue_rows(cfg), tgmm_ring.epilogue_cols(cfg)) == (64, 128)
    assert tgmm_ring.smem_bytes(cfg) == tgmm_ring.smem_bytes(MosaicTgmmTileConfig()) == 224 * 1024
    tgmm_launch.check_tgmm_tiles(cfg)
    with pytest.raises(ValueError, match="split_rows"):
        tgmm_launch.check_tgmm_tiles(MosaicTgmmTileConfig(block_k=64, split_rows=True))


def test_groups_go_largest_first_keeping_ties_in_order():
    # Both wgrads (bf16 and FP8) walk their tiles in this order.
    sizes = jnp.array([3, 0, 7, 3, 7, 1], jnp.int32)
    order = tgmm_ring.largest_first(sizes)
    assert order.dtype == jnp.int32 and order.tolist() == [2, 4, 0, 3, 5, 1]
