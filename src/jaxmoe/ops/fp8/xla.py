"""The FP8 grouped matmul through ``jax.lax.ragged_dot`` on the float8 operands.

``ragged_dot`` multiplies the FP8 operands exactly and accumulates in float32
(``preferred_element_type``); the scales are then applied as a kernel's epilogue would: once
per output for rowwise, once per K block's partial product for blockwise. It lowers on CPU
(jax 0.10, checked by the tests); on a GPU, XLA rewrites ``ragged_dot`` into a dense masked dot,
so this backend is for correctness, not speed, until a Hopper FP8 kernel is one more backend.
A non-finite weight stays in its group's rows (:func:`.grouped_matmul.xla.ragged_dot_confined`).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from jaxmoe.ops.fp8.base import ScaledGroupedMatmulBackend
from jaxmoe.ops.fp8.columnwise import padded_group_sizes
from jaxmoe.ops.fp8.quantize import expand_scale
from jaxmoe.ops.grouped_matmul.base import group_ids
from jaxmoe.ops.grouped_matmul.xla import XlaGroupedMatmul, ragged_dot_confined


@dataclasses.dataclass(frozen=True)
class XlaScaledGroupedMatmul(ScaledGroupedMatmulBackend):
    """``lax.ragged_dot`` on FP8 operands, float32 accumulation, scales in the epilogue."""

    name: str = dataclasses.field(default="xla", init=False)

    def scaled_gmm(self, lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, *, recipe, out_dtype):
        (num_rows, depth), (num_groups, _, width) = lhs_q.shape, rhs_q.shape
        if num_groups == 0:  # no row is in a group (and there is no column scale to take)
            return jnp.zeros((num_rows, width), out_dtype)
        ids = group_ids(group_sizes, num_rows)
        in_group = (ids < num_groups)[:, None]
        # Each K block (rowwise: the whole of K) is one float32-accumulated FP8 product, scaled
        # by its row scale and by the column scale of each row's group.
        step = max(depth, 1) if recipe.name == "rowwise" else recipe.block_size
        col_blocks = (1, recipe.rhs_blocks[2])
        out = jnp.zeros((num_rows, width), jnp.float32)
        for block in range(math.ceil(depth / step)):  # none when K = 0: zeros
            cols = slice(block * step, (block + 1) * step)
            partial = ragged_dot_confined(lhs_q[:, cols], rhs_q[:, cols, :], group_sizes)
            col_scale = expand_scale(rhs_scale[:, block, :], (num_groups, width), col_blocks)
            col_scale = jnp.take(col_scale, ids, axis=0, mode="clip")  # [M, N], row's group
            out = out + partial * lhs_scale[:, block : block + 1] * col_scale
        # Rows past the groups: ragged_dot gives 0 there, but their scales may be anything.
        return jnp.where(in_group, out, 0.0).astype(out_dtype)

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        return XlaGroupedMatmul().tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype)

    def scaled_tgmm(
        self, lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, group_starts, group_sizes, *, out_dtype
    ):
        # The padded layout is contiguous (columnwise.padded_group_starts): each group's padded
        # block of columns (its zero tail included) is one group of a ragged contraction.
        del group_starts
        padded_sizes = padded_group_sizes(group_sizes)
        out = XlaGroupedMatmul().tgmm(lhs_t_q.T, rhs_t_q.T, padded_sizes, out_dtype=jnp.float32)
        return (out * lhs_scale[:, :, None] * rhs_scale[:, None, :]).astype(out_dtype)
