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
        onehot = (ids[:, None] == jnp.arange(num_groups)[None, :]).astype(jnp.float32)  # [M, G]
        # Rows past the groups may hold anything (NaN under JAXMOE_POISON): select them away,
        # since the one-hot's zeros would not (NaN * 0 = NaN).
        in_group = (ids < num_groups)[:, None]
        out = jnp.einsum(
            "mk,mg,mn->gkn",
            jnp.where(in_group, lhs.astype(jnp.float32), 0.0),
            onehot,
            jnp.where(in_group, rhs.astype(jnp.float32), 0.0),
            precision=_HIGHEST,
        )
        return out.astype(out_dtype)
