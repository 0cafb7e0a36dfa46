"""Grouped matmul through ``jax.lax.ragged_dot_general`` (XLA's own lowering).

Fine on CPU. On GPU, XLA rewrites it into a dense masked dot whose cost grows with the number of
groups (see the benchmarks), which is why the Pallas backend exists.

**Non-finite values stay in their group.** XLA lowers ``ragged_dot`` to one dense product over
every group: ``lhs`` is broadcast to ``[G, M, K]``, each row zeroed (a select) outside its own
group, and contracted with all of ``rhs``. A NaN or inf in ``rhs[g]`` then meets the zeros of
every other group's rows (``0 * inf = NaN``) and spreads to every row. :func:`ragged_dot_confined`
runs that product on the weights with their non-finite entries zeroed (for finite weights the
same values, so the same bits) and sets NaN where a row's own group has a non-finite weight in
the column: row ``m`` then depends on ``lhs[m]`` and ``rhs[group(m)]`` only (such an entry is NaN
even where the exact product would be an infinity). It is branch-free, so the layer's program
holds no conditional. The weight gradient (``tgmm``) needs no such care: XLA selects both of its
operands per group.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend, group_ids


def _dims(lhs_contract, rhs_contract, *, lhs_ragged, rhs_group):
    return jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((lhs_contract,), (rhs_contract,)), ((), ())),
        lhs_ragged_dimensions=[lhs_ragged],
        rhs_group_dimensions=rhs_group,
    )


def ragged_dot_confined(lhs, rhs, group_sizes, *, transpose_rhs: bool = False):
    """``lax.ragged_dot`` in float32 whose rows of group ``g`` depend on ``lhs_g`` and ``rhs[g]``
    only, non-finite values included: NaN where ``rhs[g]``'s column holds one (see the module
    docstring).

    ``lhs [M, K]``, ``rhs [G, K, N]`` (``[G, N, K]`` with ``transpose_rhs``), ``group_sizes
    [G]`` summing to at most ``M``; returns ``[M, N]`` float32 with zero rows past the groups.
    """
    contract = 2 if transpose_rhs else 1
    dims = _dims(1, contract, lhs_ragged=0, rhs_group=[0])

    def ragged(lhs, weights):
        return jax.lax.ragged_dot_general(
            lhs, weights, group_sizes, dims, preferred_element_type=jnp.float32
        )

    if rhs.shape[0] == 0 or rhs.size == 0:
        return ragged(lhs, rhs)
    finite = jnp.isfinite(rhs)
    out = ragged(lhs, jnp.where(finite, rhs, jnp.zeros((), rhs.dtype)))
    column_finite = jnp.all(finite, axis=contract)  # [G, N]
    ids = group_ids(group_sizes, lhs.shape[0])
    row_finite = jnp.take(column_finite, ids, axis=0, mode="fill", fill_value=True)  # [M, N]
    return jnp.where(row_finite, out, jnp.asarray(jnp.nan, out.dtype))


@dataclasses.dataclass(frozen=True)
class XlaGroupedMatmul(GroupedMatmulBackend):
    """``lax.ragged_dot_general`` with float32 accumulation, non-finite weights confined to
    their group's rows."""

    name: str = dataclasses.field(default="xla", init=False)

    def gmm(self, lhs, rhs, group_sizes, *, transpose_rhs, out_dtype):
        out = ragged_dot_confined(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs)
        return out.astype(out_dtype)

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        # Ragged contracting dim: the result gets a leading group dim.
        dims = _dims(0, 0, lhs_ragged=0, rhs_group=[])
        out = jax.lax.ragged_dot_general(
            lhs, rhs, group_sizes, dims, preferred_element_type=jnp.float32
        )
        return out.astype(out_dtype)
