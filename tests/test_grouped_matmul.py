"""One suite for every grouped-matmul backend against an independent NumPy float64 reference.

The Pallas backend runs its real kernels in interpret mode here (CPU), with small tiles so that
groups straddle tiles and M is not a multiple of the tile.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_test_base import Backend, OpTestBase, Tol, bounds

from jaxmoe.ops import work_list
from jaxmoe.ops.grouped_matmul.api import grouped_matmul, resolve_backend
from jaxmoe.ops.grouped_matmul.pallas_mosaic import PallasMosaicGroupedMatmul
from jaxmoe.ops.grouped_matmul.pallas_triton import (
    PallasTritonGroupedMatmul,
    TileConfig,
)
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig

# Relative tolerances on max |error| / max |reference|. bf16: inputs are exact in the reference
# (same bf16 values, upcast), so the error is the bf16 rounding of the result (2^-8 relative).
TOL = {"float32": 1e-5, "bfloat16": 1.6e-2}

SMALL_TILES = TileConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)
MOSAIC_TRITON_TILES = TileConfig(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=2)
BACKENDS = {
    "reference": "reference",
    "xla": "xla",
    "pallas_triton": PallasTritonGroupedMatmul(gmm_tiles=SMALL_TILES, tgmm_tiles=SMALL_TILES),
}


# --------------------------------------------------------------------------------------------------
# The NumPy reference (float64, group sizes truncated at M like the op documents).
# --------------------------------------------------------------------------------------------------


np_bounds = bounds  # the rows of each group, sizes truncated at M


def np_gmm(lhs, rhs, group_sizes):
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    b = np_bounds(group_sizes, lhs.shape[0])
    for g in range(rhs.shape[0]):
        out[b[g] : b[g + 1]] = lhs[b[g] : b[g + 1]] @ rhs[g]
    return out


def np_grads(lhs, rhs, group_sizes, dout):
    lhs, rhs, dout = (np.asarray(a, np.float64) for a in (lhs, rhs, dout))
    dlhs = np.zeros_like(lhs)
    drhs = np.zeros_like(rhs)
    b = np_bounds(group_sizes, lhs.shape[0])
    for g in range(rhs.shape[0]):
        s, e = b[g], b[g + 1]
        dlhs[s:e] = dout[s:e] @ rhs[g].T
        drhs[g] = lhs[s:e].T @ dout[s:e]
    return dlhs, drhs


def random_inputs(m, k, n, g, dtype, seed=0):
    rng = np.random.default_rng(seed)
    cast = lambda a: jnp.asarray(a, jnp.float32).astype(dtype)
    lhs = cast(rng.standard_normal((m, k)))
    rhs = cast(rng.standard_normal((g, k, n)) / np.sqrt(k))
    dout = cast(rng.standard_normal((m, n)))
    return lhs, rhs, dout


def fwd_and_grads(backend):
    @jax.jit
    def run(lhs, rhs, group_sizes, dout):
        out, vjp = jax.vjp(
            lambda a, b: grouped_matmul(a, b, group_sizes, backend=backend), lhs, rhs
        )
        return (out, *vjp(dout))

    return run


class TestGroupedMatmulBackends(OpTestBase):
    """Every backend's forward, d lhs and d rhs against NumPy (``OpTestBase``)."""

    BACKENDS = {
        "reference": Backend("reference", (70, 40, 48), ("float32", "bfloat16")),
        "xla": Backend("xla", (70, 40, 48), ("float32", "bfloat16")),
        "pallas_triton": Backend(BACKENDS["pallas_triton"], (70, 40, 48), ("float32", "bfloat16")),
        # The Mosaic kernel in its interpreter takes the forward (bf16, block-aligned shapes);
        # d lhs (transposed) and d rhs go to Triton, as on a GPU where Mosaic refuses them.
        "pallas": Backend(
            PallasMosaicGroupedMatmul(
                gmm_tiles=MosaicTileConfig(64, 128, 64, stages=2, group_swizzle=2),
                triton=PallasTritonGroupedMatmul(MOSAIC_TRITON_TILES, MOSAIC_TRITON_TILES),
                triton_fallback=True,
            ),
            (128, 64, 128),
            ("bfloat16",),
            cases=(),
        ),
    }
    TOLERANCES = {name: Tol(tol, tol) for name, tol in TOL.items()}

    def make_inputs(self, m, k, n, groups, dtype, seed):
        lhs, rhs, dout = random_inputs(m, k, n, groups, dtype, seed)
        return (lhs, rhs), dout

    def call(self, backend, operands, group_sizes):
        return grouped_matmul(*operands, group_sizes, backend=backend)

    def reference(self, operands, group_sizes):
        return np_gmm(*operands, group_sizes)

    def reference_grads(self, operands, group_sizes, cotangent):
        return np_grads(*operands, group_sizes, cotangent)

    def group_sizes(self, case, m):
        # M = 70 is no multiple of 16; groups end at 10, 10, 43, 50, 55: an empty group, groups
        # straddling tiles, and 15 rows past the end. On the Mosaic kernel's 64-row tiles:
        # groups end at 50, 50, 80, 100 of 128.
        table = {
            70: {
                "empty_and_tail": [10, 0, 33, 7, 5],
                "single_group": [0, 70, 0],
                "skewed": [1, 68, 1],
                "no_rows": [0, 0, 0],
            },
            128: {"empty_and_tail": [50, 0, 30, 20]},
        }
        # past_m: sum 100 > M = 70: the second group ends at 70.
        table[70]["past_m"] = [30, 50, 20]
        return table.get(m, {}).get(case) or super().group_sizes(case, m)


def check_all(backend, group_sizes, m=70, k=40, n=48, dtype="float32", seed=0):
    """Forward, d lhs and d rhs under jit against NumPy; exact zeros where nothing belongs."""
    spec = Backend(backend, (m, k, n), (dtype,))
    TestGroupedMatmulBackends().check(spec, group_sizes, dtype, seed)


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def backend(request):
    return BACKENDS[request.param]


# --------------------------------------------------------------------------------------------------
# The reference itself: NumPy against hand-computed numbers.
# --------------------------------------------------------------------------------------------------


def test_numpy_reference_by_hand():
    lhs = np.arange(6.0).reshape(3, 2)
    rhs = np.stack([np.eye(2), 2 * np.eye(2)])
    np.testing.assert_array_equal(np_gmm(lhs, rhs, [1, 1]), [[0, 1], [4, 6], [0, 0]])
    np.testing.assert_array_equal(np_gmm(lhs, rhs, [2, 5]), [[0, 1], [2, 3], [8, 10]])
    dlhs, drhs = np_grads(lhs, rhs, [0, 2], np.ones((3, 2)))
    np.testing.assert_array_equal(dlhs, [[2, 2], [2, 2], [0, 0]])
    np.testing.assert_array_equal(drhs[0], np.zeros((2, 2)))
    np.testing.assert_array_equal(drhs[1], [[2, 2], [4, 4]])


# --------------------------------------------------------------------------------------------------
# The shared suite: every backend.
# --------------------------------------------------------------------------------------------------


@settings(max_examples=6, deadline=None, derandomize=True)
@given(data=st.data())
def test_random_group_sizes(data):
    # One backend per example keeps this fast; the shape is fixed so each compiles once.
    name = data.draw(st.sampled_from(list(BACKENDS)), label="backend")
    sizes = data.draw(st.lists(st.integers(0, 30), min_size=4, max_size=4), label="group_sizes")
    check_all(BACKENDS[name], sizes, m=48, k=32, n=32, seed=sum(sizes))


def test_default_tiles_and_interpret_default():
    # No tile override: the shape heuristic, shrunk to the problem; interpret chosen for CPU.
    check_all(PallasTritonGroupedMatmul(), [5, 0, 20], m=40, k=24, n=20)


# --------------------------------------------------------------------------------------------------
# Non-finite values stay in their group: rows of group g come from lhs_g and rhs[g] only.
# --------------------------------------------------------------------------------------------------

# Groups end at 10, 10, 43, 50, 55 of M = 70 (an empty group, 15 rows past the end). The poisoned
# group is 2 (rows 10:43); row 25 is one of its rows; the last row lies past the groups.
CONFINED_SIZES = [10, 0, 33, 7, 5]
POISON_GROUP, POISON_ROW = 2, 25


def assert_only_where(got, clean, bad, what):
    """``got`` equals ``clean`` bit for bit outside the boolean mask ``bad``, and is non-finite
    somewhere inside it (the poison is computed, not dropped)."""
    got, clean = (np.asarray(jnp.asarray(a, jnp.float32)) for a in (got, clean))
    bad = np.broadcast_to(bad, got.shape)
    np.testing.assert_array_equal(got[~bad], clean[~bad], err_msg=what)
    if bad.any():
        assert not np.all(np.isfinite(got[bad])), f"{what}: the poison vanished"


def check_confined(
    backend,
    value,
    m=70,
    k=40,
    n=48,
    dtype="float32",
    sizes=CONFINED_SIZES,
    only=None,
    together=False,
):
    """A NaN or inf in ``rhs[g]``, in a row of ``lhs_g``, in a row of the cotangent and in a
    row past the groups reaches only what depends on it: forward, d lhs and d rhs (``only``:
    the names of the cases to run, default all). ``together``: the cases' poisons in one run,
    against the union of what each may reach (for cases whose regions do not overlap, so that
    one kernel call checks them all)."""
    lhs, rhs, dout = random_inputs(m, k, n, len(sizes), dtype)
    gs = jnp.asarray(sizes, jnp.int32)
    bounds = np_bounds(sizes, m)
    rows = np.arange(m)
    in_group = (rows >= bounds[POISON_GROUP]) & (rows < bounds[POISON_GROUP + 1])
    tail_row = m - 1
    assert bounds[-1] <= tail_row and in_group[POISON_ROW]
    run = fwd_and_grads(backend)
    clean = run(lhs, rhs, gs, dout)
    poison = jnp.asarray(value, dtype)
    none_rows, none_groups = np.zeros((m, 1), bool), np.zeros((len(sizes), 1, 1), bool)
    group_mask = (np.arange(len(sizes)) == POISON_GROUP)[:, None, None]
    cases = {
        # rhs[g][3, 5]: column 5 of group g's rows, and d lhs's column 3 of those rows.
        "rhs[g]": (
            (lhs, rhs.at[POISON_GROUP, 3, 5].set(poison), dout),
            (in_group[:, None] & (np.arange(n) == 5), in_group[:, None] & (np.arange(k) == 3)),
            none_groups,
        ),
        # lhs row 25 (group g): that output row, and group g's weight gradient.
        "lhs row": (
            (lhs.at[POISON_ROW, 1].set(poison), rhs, dout),
            ((rows == POISON_ROW)[:, None], none_rows),
            group_mask,
        ),
        # d out row 25: that row of d lhs, and group g's weight gradient.
        "d out row": (
            (lhs, rhs, dout.at[POISON_ROW, 2].set(poison)),
            (none_rows, (rows == POISON_ROW)[:, None]),
            group_mask,
        ),
        # A row past the groups reaches nothing.
        "tail rows": (
            (lhs.at[tail_row].set(poison), rhs, dout.at[tail_row].set(poison)),
            (none_rows, none_rows),
            none_groups,
        ),
    }
    cases = {case: v for case, v in cases.items() if only is None or case in only}
    if together:
        # Each operand poisoned wherever a case poisons it; each result may go bad wherever a
        # case's may.
        clean_operands = (lhs, rhs, dout)
        operands = tuple(
            functools.reduce(
                lambda acc, x: jnp.where(jnp.isnan(x) | jnp.isinf(x), x, acc), xs, clean_x
            )
            for clean_x, *xs in zip(clean_operands, *(v[0] for v in cases.values()), strict=True)
        )
        out_masks = tuple(
            functools.reduce(np.logical_or, masks)
            for masks in zip(*(v[1] for v in cases.values()), strict=True)
        )
        drhs_mask = functools.reduce(np.logical_or, (v[2] for v in cases.values()))
        cases = {" + ".join(cases): (operands, out_masks, drhs_mask)}
    for case, ((a, b, d), (bad_out, bad_dlhs), bad_drhs) in cases.items():
        out, dlhs, drhs = run(a, b, gs, d)
        what = f"{case} = {value}"
        assert_only_where(out, clean[0], bad_out, f"{what}: forward")
        assert_only_where(dlhs, clean[1], bad_dlhs, f"{what}: d lhs")
        assert_only_where(drhs, clean[2], bad_drhs, f"{what}: d rhs")


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
def test_non_finite_values_stay_in_their_group(backend, value):
    check_confined(backend, value)


def test_non_finite_weights_stay_in_their_group_through_the_transposed_weights():
    # d lhs multiplies by rhs[g]^T: the transposed product of every backend (xla's own path).
    lhs, rhs, _ = random_inputs(70, 40, 48, 5, "float32")
    gs = jnp.asarray(CONFINED_SIZES, jnp.int32)
    rows = np.arange(70)
    bounds = np_bounds(CONFINED_SIZES, 70)
    in_group = (rows >= bounds[POISON_GROUP]) & (rows < bounds[POISON_GROUP + 1])
    weights_t = jnp.swapaxes(rhs, 1, 2)  # [G, N, K]
    for name, backend in BACKENDS.items():
        impl = resolve_backend(backend)
        clean = impl.gmm(lhs, weights_t, gs, transpose_rhs=True, out_dtype=jnp.float32)
        for value in (np.nan, np.inf):
            poisoned = weights_t.at[POISON_GROUP, 5, 3].set(value)
            out = impl.gmm(lhs, poisoned, gs, transpose_rhs=True, out_dtype=jnp.float32)
            bad = in_group[:, None] & (np.arange(48) == 5)
            assert_only_where(out, clean, bad, f"{name}: rhs[g]^T = {value}")


def test_xla_keeps_the_finite_product_bit_for_bit():
    # For finite weights the xla backend is lax.ragged_dot itself, unchanged.
    lhs, rhs, _ = random_inputs(70, 40, 48, 5, "float32", seed=3)
    gs = jnp.asarray(CONFINED_SIZES, jnp.int32)
    want = jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=jnp.float32)
    got = jax.jit(lambda a, b: grouped_matmul(a, b, gs, backend="xla"))(lhs, rhs)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# --------------------------------------------------------------------------------------------------
# Kernel metadata and proof that the kernels ran.
# --------------------------------------------------------------------------------------------------


# Jitted as the kernels call it: one program per shape, where eager dispatch compiled each of
# its ops for each new shape (most of the random-sizes test's time).
_work_items = jax.jit(work_list.work_items, static_argnums=(1, 2), static_argnames="tile_align")


def covered_rows(group_sizes, m, bm, tile_align):
    """How many work items own each row, checking that each owns >= 1 row of its group in a
    tile inside the array; and the number of items per interval."""
    work_group, first_row, offsets = (
        np.asarray(a) for a in _work_items(jnp.asarray(group_sizes), m, bm, tile_align=tile_align)
    )
    assert len(work_group) == work_list.max_work_items(m, len(group_sizes), bm)
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(group_sizes), [m]]))
    used = work_group <= len(group_sizes)  # the rest are unused work items
    group, first = work_group[used], first_row[used]
    # Whole arrays through the kernels' scalar helpers: one call each, not one per item.
    row0 = np.asarray(work_list.tile_first_row(first, bm, m, tile_align=tile_align))
    lo, hi = (np.asarray(v) for v in work_list.rows_in_tile(first, row0, offsets[group + 1], bm))
    covered = np.zeros(m, np.int32)
    for g, start, low, high in zip(group, row0, lo, hi, strict=True):
        assert 0 <= start <= max(m - bm, 0) and start % (tile_align or bm) == 0
        assert 0 <= low < high <= bm, "a work item with no rows of its group"
        rows = np.arange(start + low, min(start + high, m))
        assert np.all((rows >= offsets[g]) & (rows < offsets[g + 1]))
        covered[rows] += 1
    return covered, np.bincount(
        work_group[work_group <= len(group_sizes)], minlength=len(group_sizes) + 1
    )


@pytest.mark.parametrize("tile_align", [None, 8], ids=["grid", "group_start"])
def test_work_items_cover_every_row_once(tile_align):
    # Per interval (5 groups, then 25 tail rows), 16-row tiles: the grid cuts groups 2 and 3
    # and the tail at its lines; from each group's first row (rounded down to 8) they take
    # cdiv(rows + start % 8, 16) tiles, the tail's last one moved back to end at row 80.
    covered, items = covered_rows(np.array([10, 0, 33, 7, 5]), 80, 16, tile_align)
    np.testing.assert_array_equal(covered, 1)
    np.testing.assert_array_equal(
        items, [1, 0, 3, 2, 1, 2] if tile_align is None else [1, 0, 3, 1, 1, 2]
    )


@pytest.mark.parametrize("tile_align", [None, 8], ids=["grid", "group_start"])
def test_work_items_fit_the_list_for_any_sizes(tile_align):
    # Random sizes, many small groups (each can cost a cut tile) and sizes just under a tile.
    rng = np.random.default_rng(0)
    for _ in range(40):
        groups = int(rng.integers(1, 12))
        sizes = rng.choice([0, 1, 7, 9, 23, 25, 31, 33, 64], size=groups)
        m = int(-(-max(int(sizes.sum()), 1) // 32) * 32 + rng.integers(0, 3) * 32)
        covered, _ = covered_rows(sizes, m, 32, tile_align)
        np.testing.assert_array_equal(covered, 1)


def test_every_product_of_the_vjp_is_a_grouped_matmul_primitive_of_the_backend():
    # Forward, dgrad and wgrad each bind one of the two primitives with the backend as a
    # parameter; the primitives lower to the backend's kernels (next test).
    lhs, rhs, dout = random_inputs(32, 16, 16, 2, "float32")
    gs = jnp.array([10, 12], jnp.int32)
    backend = BACKENDS["pallas_triton"]
    jaxpr = jax.make_jaxpr(fwd_and_grads(backend))(lhs, rhs, gs, dout)
    text = str(jaxpr)
    assert text.count("jaxmoe_grouped_matmul[") == 2  # forward and dgrad
    assert text.count("jaxmoe_transposed_grouped_matmul[") == 1  # wgrad
    assert text.count(f"impl={backend!r}") == 3
    assert "ragged_dot" not in text and "pallas_call" not in text


def test_pallas_kernels_lower_to_triton():
    # Lowering for CUDA needs no GPU: proves the kernels pass the Triton lowering, not only the
    # interpreter, and that the custom call carries the kernel's name.
    lhs, rhs, dout = random_inputs(100, 48, 40, 3, "bfloat16")
    backend = PallasTritonGroupedMatmul(interpret=False)
    gs = jnp.array([30, 0, 50], jnp.int32)
    lowered = fwd_and_grads(backend).trace(lhs, rhs, gs, dout).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "jaxmoe_gmm" in text and "jaxmoe_tgmm" in text


# --------------------------------------------------------------------------------------------------
# Bad inputs: ValueError naming the argument, before any tracing.
# --------------------------------------------------------------------------------------------------


def test_group_sizes_wrong_length():
    lhs, rhs, _ = random_inputs(8, 4, 4, 2, "float32")
    with pytest.raises(ValueError, match="group_sizes"):
        grouped_matmul(lhs, rhs, jnp.array([4, 2, 2], jnp.int32))


def test_group_sizes_float_dtype():
    lhs, rhs, _ = random_inputs(8, 4, 4, 2, "float32")
    with pytest.raises(ValueError, match="group_sizes"):
        grouped_matmul(lhs, rhs, jnp.array([4.0, 4.0]))


def test_mismatched_contracting_dim():
    lhs, _, _ = random_inputs(8, 4, 4, 2, "float32")
    rhs = jnp.zeros((2, 5, 4))
    with pytest.raises(ValueError, match="rhs"):
        grouped_matmul(lhs, rhs, jnp.array([4, 4], jnp.int32))


def test_mixed_dtypes():
    lhs, rhs, _ = random_inputs(8, 4, 4, 2, "float32")
    with pytest.raises(ValueError, match="lhs"):
        grouped_matmul(lhs, rhs.astype(jnp.bfloat16), jnp.array([4, 4], jnp.int32))


def test_unknown_backend_name():
    lhs, rhs, _ = random_inputs(8, 4, 4, 2, "float32")
    with pytest.raises(ValueError, match="backend"):
        grouped_matmul(lhs, rhs, jnp.array([4, 4], jnp.int32), backend="cutlass")


def test_importing_the_triton_kernels_leaves_warning_filters_alone():
    # The Triton deprecation message is silenced around the kernel calls only.
    import subprocess
    import sys

    code = (
        "import warnings, jax\n"
        "from jax.experimental import pallas\n"
        "from jax.experimental.pallas import triton, mosaic_gpu\n"
        "before = list(warnings.filters)\n"
        "import jaxmoe.ops.grouped_matmul.pallas_triton\n"
        "import jaxmoe.ops.grouped_matmul.pallas_mosaic\n"
        "import jaxmoe\n"
        "assert warnings.filters == before, set(warnings.filters) ^ set(before)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_non_finite_values_stay_in_their_group_on_the_mosaic_kernel():
    # The Mosaic GPU forward in its interpreter (d lhs and d rhs on Triton, as on a GPU where
    # Mosaic refuses them), on block-aligned bf16 shapes.
    from jaxmoe.ops.grouped_matmul.pallas_mosaic import PallasMosaicGroupedMatmul
    from jaxmoe.ops.mosaic.tiles import MosaicTileConfig

    backend = PallasMosaicGroupedMatmul(
        gmm_tiles=MosaicTileConfig(block_m=64, block_n=128, block_k=64, stages=2, group_swizzle=2),
        triton=PallasTritonGroupedMatmul(SMALL_TILES, SMALL_TILES),
        triton_fallback=True,
    )
    check_confined(
        backend,
        np.nan,
        m=128,
        k=64,
        n=128,
        dtype="bfloat16",
        sizes=[10, 0, 73, 20],
        only=("rhs[g]", "tail rows"),
        together=True,  # the tail row reaches nothing: one interpreted run for both, not two
    )
