r"""The FP8 operands of the weight gradient: one scale per (group, column), transposed, padded.

The wgrad of ``out = lhs @ rhs[g]`` is ``d rhs[g] = lhs_g^T @ d out_g``, a contraction over the
group's rows (tokens). For an FP8 product whose scales apply in the epilogue, each operand's
scale must be constant along that contraction: one scale per (group, column)::

    scale[g, k] = max(amax_{m in g} |x[m, k]|, SCALE_EPS) / fmax
    q[m, k]     = cast_fp8(clip(x[m, k] / scale[g(m), k], -fmax, fmax))
    d rhs[g]    = (q_lhs_g^T @ q_grad_g) * scale_lhs[g, :, None] * scale_grad[g, None, :]

(torchao's rowwise recipe scales these operands per column over all tokens, "axiswise dim 0";
per group is finer: one expert's outlier token does not coarsen another expert's scale.)

Layout: FP8 ``wgmma`` reads both operands contraction-major (only 16-bit types have a
transposed operand), so the quantized operand is written transposed, ``[K, Mp]``, tokens
contiguous. Each group starts at a multiple of ``align`` (128: one 128-byte swizzled row of
FP8) and its columns past its row count, up to the next multiple, are zeros::

    padded_group_starts = [0, r(n_0), r(n_0) + r(n_1), ...]     r(n) = ceil(n / align) * align
    x_t_q[:, starts[g] + i] = q[offsets[g] + i, :]  for i < n_g;  zeros elsewhere

so a kernel walks a group's ``ceil(n_g / align)`` column blocks with no masking (masking would
zero columns of a swizzled 1-byte tile). ``Mp = padded_length(M, G)`` bounds the layout
statically. Rows at or past ``sum(group_sizes)`` are in no group: they are neither read into the
scales nor copied (they may hold anything, NaN included).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.argument_checks import round_up
from jaxmoe.ops.fp8.quantize import E4M3, cast_scaled, scale_from_amax
from jaxmoe.sorted_search import search_right

Array = jax.Array

ALIGN = 128


def padded_length(num_rows: int, num_groups: int, align: int = ALIGN) -> int:
    """A static bound on the padded layout's length: ``sum(r(n_g)) <= M + G * (align - 1)``."""
    return round_up(num_rows + num_groups * (align - 1), align)


def padded_group_sizes(group_sizes: Array, align: int = ALIGN) -> Array:
    """Each group's columns in the padded layout, its zero tail included: ``r(n_g)``, int32."""
    return round_up(group_sizes.astype(jnp.int32), align)


def padded_group_starts(group_sizes: Array, align: int = ALIGN) -> Array:
    """Where each group's columns start in the padded layout (``[G]`` int32, multiples of
    ``align``): the exclusive running sum of :func:`padded_group_sizes`."""
    padded = padded_group_sizes(group_sizes, align)
    return (jnp.cumsum(padded) - padded).astype(jnp.int32)


def block_tables(
    group_sizes: Array, num_rows: int, align: int = ALIGN
) -> tuple[Array, Array, Array, Array]:
    """``(starts [G], source [Mp/align], count [Mp/align], group [Mp/align])``: each
    ``align``-column block of the padded layout is rows ``[source, source + count)`` of group
    ``group`` (a group's rows are contiguous and its columns start at a multiple of ``align``, so
    a block never spans two groups; ``count`` is 0 for the blocks past the groups)."""
    num_groups = group_sizes.shape[0]
    sizes = group_sizes.astype(jnp.int32)
    starts = padded_group_starts(sizes, align)
    block_start = jnp.arange(0, padded_length(num_rows, num_groups, align), align, dtype=jnp.int32)
    # The last group starting at or before the block (empty groups share their successor's
    # start and lose the tie).
    group = jnp.clip(search_right(starts, block_start) - 1, 0, max(num_groups - 1, 0))
    within = block_start - starts[group]
    count = jnp.clip(sizes[group] - within, 0, align)
    source = jnp.cumsum(sizes)[group] - sizes[group] + within
    return starts, jnp.where(count > 0, source, 0), count, group


def quantize_columnwise(
    x: Array, group_sizes: Array, dtype=E4M3, align: int = ALIGN
) -> tuple[Array, Array, Array]:
    """``x [M, K]`` (rows sorted by group) in FP8, one scale per (group, column), transposed.

    Args:
      x: ``[M, K]`` floating, rows sorted by group.
      group_sizes: ``[G]`` integer row counts, summing to at most ``M`` (clipped sizes).
      dtype: the FP8 format.
      align: where groups start (a multiple of it) in the padded layout.

    Returns:
      ``(x_t_q, scale, starts)``: ``x_t_q`` FP8 ``[K, padded_length(M, G)]`` (module docstring),
      ``scale`` float32 ``[G, K]`` (an empty group's is ``SCALE_EPS / fmax``), ``starts`` int32
      ``[G]`` (:func:`padded_group_starts`).
    """
    num_rows, width = x.shape
    num_groups = group_sizes.shape[0]
    if num_rows == 0 or num_groups == 0:  # no row is in a group: zeros, the floor scale
        scale = scale_from_amax(jnp.zeros((num_groups, width), jnp.float32), dtype)
        zeros = jnp.zeros((width, padded_length(num_rows, num_groups, align)), dtype)
        return zeros, scale, padded_group_starts(group_sizes, align)
    starts, block_source, block_count, block_group = block_tables(group_sizes, num_rows, align)
    # Each padded column's source row: its block's, offset, if within the block's rows.
    offset = jnp.arange(align, dtype=jnp.int32)[None, :]
    copied = (offset < block_count[:, None]).reshape(-1)
    source = jnp.where(copied, (block_source[:, None] + offset).reshape(-1), 0)
    rows = jnp.where(copied[:, None], jnp.take(x, source, axis=0).astype(jnp.float32), 0.0)
    # amax in two steps, both without a scatter over the rows: per block, then per group over
    # its few blocks.
    block_amax = jnp.max(jnp.abs(rows).reshape(-1, align, width), axis=1)
    amax = jax.ops.segment_max(block_amax, block_group, num_groups, indices_are_sorted=True)
    scale = scale_from_amax(jnp.maximum(amax, 0.0), dtype)  # an empty group: no block, -inf
    q = cast_scaled(rows / jnp.repeat(scale[block_group], align, axis=0), dtype)
    return q.T, scale, starts
