"""The FP8 scales applied inside the Mosaic ``gmm`` and ``tgmm``: the rowwise recipe's in the
epilogue (:func:`rowwise_scale_epilogue`, constant along K) and the blockwise recipe's per K
step (:func:`blockwise_k_step_scale`, one K step one scale block: the kernel multiplies each
step's product by them). Each reads the scales from GPU memory in the accumulator's layout, so
that the broadcasts stay in registers."""

from __future__ import annotations

from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


def rowwise_scale_epilogue(
    acc, lhs_scale_gmem, rhs_scale_gmem, *, group, row0, col0, interpreted: bool
):
    """``acc[r, c] * lhs_scale[row0 + r] * rhs_scale[group, col0 + c]`` for one warpgroup's
    ``[bm, wg_n]`` accumulator, the scales read from GPU memory in the accumulator's layout."""
    bm, wg_n = acc.shape
    rows, cols = lhs_scale_gmem.at[pl.ds(row0, bm)], rhs_scale_gmem.at[group, pl.ds(col0, wg_n)]
    if interpreted:  # the interpreter knows plain reads only, and no layouts
        row_scale, col_scale = rows[...], cols[...]
    else:
        # WGMMA.reduce(1): a [bm] vector laid out as the accumulator's rows (each thread loads
        # the scales of the rows it owns), so the broadcasts below stay in registers. A strided
        # register load, not a TMA: Mosaic has no "optimized" transfer for this layout, and it is
        # a few hundred bytes per tile.
        row_scale = plgpu.load(rows, (), layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)
        col_scale = plgpu.load(cols, (), layout=plgpu.Layout.WGMMA.reduce(0), optimized=False)
    return (
        acc
        * lax.broadcast_in_dim(row_scale, acc.shape, [0])
        * lax.broadcast_in_dim(col_scale, acc.shape, [1])
    )


def blockwise_k_step_scale(
    lhs_scale_t_gmem, rhs_scale_gmem, *, k_step, group, row0, col0, rows, cols, interpreted: bool
):
    """The ``[rows]`` scales of one warpgroup's ``[rows, cols]`` product of K block ``k_step``:
    ``lhs_scale[row0 + r, k_step] * rhs_scale[group, k_step, col0 // 128]`` (its ``cols`` = 128
    columns are one scale block, so the weight scale is one scalar), laid out as the
    accumulator's rows. ``lhs_scale_t_gmem`` is ``lhs_scale`` transposed, ``[K / 128, M]``, so
    that a tile's row scales are contiguous."""
    row_scales = lhs_scale_t_gmem.at[k_step, pl.ds(row0, rows)]
    col_scale = rhs_scale_gmem[group, k_step, col0 // cols]
    if interpreted:
        row_scale = row_scales[...]
    else:  # the accumulator's row layout, as in rowwise_scale_epilogue
        row_scale = plgpu.load(row_scales, (), layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)
    return row_scale * col_scale
