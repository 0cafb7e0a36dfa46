"""The plain grouped matmul: every group computed densely and masked. Exact, slow, O(G*M*N)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend, group_ids

_HIGHEST = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class ReferenceGroupedMatmul(GroupedMatmulBackend):
    """Dense per-group products in float32 at HIGHEST precision, then a mask. For tests."""

    name: str = dataclasses.field(default="reference", init=False)

    def gmm(self, lhs, rhs, group_sizes, *, transpose_rhs, out_dtype):
        num_groups = rhs.shape[0]
        spec = "mk,gnk->gmn" if transpose_rhs else "mk,gkn->gmn"
        every_group = jnp.einsum(
            spec, lhs.astype(jnp.float32), rhs.astype(jnp.float32), precision=_HIGHEST
        )
        ids = group_ids(group_sizes, lhs.shape[0])
        onehot = ids[None, :] == jnp.arange(num_groups)[:, None]  # [G, M]; none for past-the-end
        out = jnp.sum(jnp.where(onehot[:, :, None], every_group, 0.0), axis=0)
        return out.astype(out_dtype)

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        num_groups = group_sizes.shape[0]
        ids = group_ids(group_sizes, lhs.shape[0])
        in_group = (ids[None, :] == jnp.arange(num_groups)[:, None])[:, :, None]  # [G, M, 1]
        # Each group's rows selected for it, on both operands: a one-hot multiply would not
        # keep a NaN or inf (another group's row, or a row past the groups, which may hold NaN
        # under JAXMOE_POISON) out of this group's sum, since NaN * 0 = NaN.
        out = jnp.einsum(
            "gmk,gmn->gkn",
            jnp.where(in_group, lhs.astype(jnp.float32)[None], 0.0),
            jnp.where(in_group, rhs.astype(jnp.float32)[None], 0.0),
            precision=_HIGHEST,
        )
        return out.astype(out_dtype)
