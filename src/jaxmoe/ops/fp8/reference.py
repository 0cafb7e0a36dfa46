"""The plain FP8 grouped matmul: dequantize both operands to float32, then the exact grouped matmul.

Equal to the scaled FP8 product up to float32 rounding (each dequantized element is one float32
multiply), so it is the yardstick for the other backends.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxmoe.ops.fp8.base import ScaledGroupedMatmulBackend
from jaxmoe.ops.fp8.quantize import dequantize
from jaxmoe.ops.grouped_matmul.reference import ReferenceGroupedMatmul


@dataclasses.dataclass(frozen=True)
class ReferenceScaledGroupedMatmul(ScaledGroupedMatmulBackend):
    """Dequantize-then-matmul in float32 at HIGHEST precision. For tests."""

    name: str = dataclasses.field(default="reference", init=False)

    def scaled_gmm(self, lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, *, recipe, out_dtype):
        lhs = dequantize(lhs_q, lhs_scale, recipe.lhs_blocks)
        rhs = dequantize(rhs_q, rhs_scale, recipe.rhs_blocks)
        return ReferenceGroupedMatmul().gmm(
            lhs, rhs, group_sizes, transpose_rhs=False, out_dtype=out_dtype
        )

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        return ReferenceGroupedMatmul().tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype)

    def scaled_tgmm(
        self, lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, group_starts, group_sizes, *, out_dtype
    ):
        # Each group's columns selected by a mask (the padding is zeros, but the contract is
        # the group's own columns), every product exact in float32 at HIGHEST precision.
        columns = jnp.arange(lhs_t_q.shape[1])[None, :]
        start, size = group_starts[:, None], group_sizes[:, None]
        in_group = ((columns >= start) & (columns < start + size))[:, None, :]  # [G, 1, P]
        # Selected per group on both operands: a one-hot multiply would spread a NaN column to
        # every group (NaN * 0 = NaN).
        out = jnp.einsum(
            "gkp,gnp->gkn",
            jnp.where(in_group, lhs_t_q.astype(jnp.float32)[None], 0.0),
            jnp.where(in_group, rhs_t_q.astype(jnp.float32)[None], 0.0),
            precision=jax.lax.Precision.HIGHEST,
        )
        return (out * lhs_scale[:, :, None] * rhs_scale[:, None, :]).astype(out_dtype)
