"""Grouped matmul through ``jax.lax.ragged_dot_general`` (XLA's own lowering).

Fine on CPU. On GPU, XLA rewrites it into a dense masked dot whose cost grows with the number of
groups (see the benchmarks), which is why the Pallas backend exists.

**Non-finite values stay in their group.** XLA lowers ``ragged_dot`` to one dense product over
every group: ``lhs`` is broadcast to ``[G, M, K]``, each row zeroed (a select) outside its own
group, and contracted with all of ``rhs``. A NaN or inf in ``rhs[g]`` then meets the zeros of
every other group's rows (``0 * inf = NaN``) and spreads to every row. :func:`ragged_dot_confined`
keeps that product for finite weights (its results unchanged, bit for bit) and, only when some
``rhs[g]`` column holds a non-finite value, takes that group's rows of that column from a
per-group product instead, so row ``m`` depends on ``lhs[m]`` and ``rhs[group(m)]`` only. The
weight gradient (``tgmm``) needs no such care: XLA selects both of its operands per group.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxmoe import compat
from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend, group_ids


def _dims(lhs_contract, rhs_contract, *, lhs_ragged, rhs_group):
    return jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((lhs_contract,), (rhs_contract,)), ((), ())),
        lhs_ragged_dimensions=[lhs_ragged],
        rhs_group_dimensions=rhs_group,
    )


def _per_group_product(lhs, rhs, group_sizes, *, transpose_rhs):
    """``[M, N]`` float32: each row times its own group's matrix, one dense product per group
    (a loop, so that only ``[M, N]`` is live), rows past the groups zero."""
    ids = group_ids(group_sizes, lhs.shape[0])
    contract = 2 if transpose_rhs else 1

    def one_group(group, out):
        dims = (((1,), (contract - 1,)), ((), ()))
        product = jax.lax.dot_general(lhs, rhs[group], dims, preferred_element_type=jnp.float32)
        return jnp.where((ids == group)[:, None], product, out)

    # The loop's carry has one type: inside shard_map, varying over the operands' axes.
    axes = frozenset().union(*(compat.varying_axes(a) or () for a in (lhs, rhs, group_sizes)))
    out = compat.vary(jnp.zeros((lhs.shape[0], rhs.shape[3 - contract]), jnp.float32), tuple(axes))
    return jax.lax.fori_loop(0, rhs.shape[0], one_group, out)


def ragged_dot_confined(lhs, rhs, group_sizes, *, transpose_rhs: bool = False):
    """``lax.ragged_dot`` in float32 whose rows of group ``g`` depend on ``lhs_g`` and ``rhs[g]``
    only, non-finite values included (see the module docstring).

    ``lhs [M, K]``, ``rhs [G, K, N]`` (``[G, N, K]`` with ``transpose_rhs``), ``group_sizes
    [G]`` summing to at most ``M``; returns ``[M, N]`` float32 with zero rows past the groups.
    """
    contract = 2 if transpose_rhs else 1
    dims = _dims(1, contract, lhs_ragged=0, rhs_group=[0])

    def ragged(lhs, weights):
        return jax.lax.ragged_dot_general(
            lhs, weights, group_sizes, dims, preferred_element_type=jnp.float32
        )

    finite = jnp.isfinite(rhs)
    column_finite = jnp.all(finite, axis=contract)  # [G, N]

    def confined():
        # Finite columns from the same product on weights whose non-finite entries are zeroed
        # (each row's own group is unchanged there, so these are the finite run's bits; for float8
        # as far as XLA's float8 dot accumulates as its float32 one, as on CPU); the
        # rest from the per-group product. Float8 operands are multiplied in float32 here
        # (their products are exact there), so the float8 product stays the fast path's one dot.
        wide_lhs, wide_rhs = (
            a.astype(jnp.float32) if a.dtype.itemsize == 1 else a for a in (lhs, rhs)
        )
        out = ragged(wide_lhs, jnp.where(finite, wide_rhs, jnp.zeros((), wide_rhs.dtype)))
        exact = _per_group_product(wide_lhs, wide_rhs, group_sizes, transpose_rhs=transpose_rhs)
        ids = group_ids(group_sizes, lhs.shape[0])
        row_finite = jnp.take(column_finite, ids, axis=0, mode="fill", fill_value=True)
        return jnp.where(row_finite, out, exact)

    if rhs.shape[0] == 0 or rhs.size == 0:
        return ragged(lhs, rhs)
    return jax.lax.cond(jnp.all(column_finite), lambda: ragged(lhs, rhs), confined)


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
