"""Grouped matmul through ``jax.lax.ragged_dot_general`` (XLA's own lowering).

Fine on CPU. On GPU, XLA rewrites it into a dense masked dot whose cost grows with the number of
groups (see the benchmarks), which is why the Pallas backend exists.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend


def _dims(lhs_contract, rhs_contract, *, lhs_ragged, rhs_group):
    return jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((lhs_contract,), (rhs_contract,)), ((), ())),
        lhs_ragged_dimensions=[lhs_ragged],
        rhs_group_dimensions=rhs_group,
    )


@dataclasses.dataclass(frozen=True)
class XlaGroupedMatmul(GroupedMatmulBackend):
    """``lax.ragged_dot_general`` with float32 accumulation."""

    name: str = dataclasses.field(default="xla", init=False)

    def gmm(self, lhs, rhs, group_sizes, *, transpose_rhs, out_dtype):
        dims = _dims(1, 2 if transpose_rhs else 1, lhs_ragged=0, rhs_group=[0])
        out = jax.lax.ragged_dot_general(
            lhs, rhs, group_sizes, dims, preferred_element_type=jnp.float32
        )
        return out.astype(out_dtype)

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        # Ragged contracting dim: the result gets a leading group dim.
        dims = _dims(0, 0, lhs_ragged=0, rhs_group=[])
        out = jax.lax.ragged_dot_general(
            lhs, rhs, group_sizes, dims, preferred_element_type=jnp.float32
        )
        return out.astype(out_dtype)
