r"""The grouped matmul's own batching rule: a batch of grouped matmuls is one grouped matmul.

``jax.vmap`` of a backend's primitives would otherwise reach ``lax.ragged_dot``'s batching rule
(``NotImplementedError`` for any batch dim but 0) or a Pallas kernel's. Here each primitive is a
``jax.custom_batching.custom_vmap`` (inside a bilinear ``custom_jvp``) whose rule folds the batch
into the rows and the groups, then calls the unbatched primitive once, on any backend::

    batch b, group g  (B batches of G groups over M rows each)
      rhs batched   [B, G, K, N]: group b*G + g of B*G groups, rhs reshaped to [B*G, K, N]
      rhs shared    [G, K, N]:    group g of G, its rows gathered from every batch
                                  (group size sum_b group_sizes[b, g]); no copy of rhs

A stable sort of the B*M rows by that folded group (rows past a batch's groups last) lays them
out as one grouped matmul wants; a gather by the inverse permutation puts the result back. The
rule calls the primitive again, so nested ``vmap``\s (``jax.hessian``, ``vmap`` over ``vmap``)
fold once per level. Reverse mode over reverse mode (``grad`` of ``grad``) is not supported:
``custom_vmap`` has no transpose. ``api.grouped_matmul``'s custom VJP wraps these primitives
(the ``jax.custom_vjp``-outside-``custom_vmap`` composition JAX documents), so its forward and
backward both batch through here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend, group_ids

Array = jax.Array


def _lead(value: Array, batched: bool, axis_size: int) -> Array:
    return value if batched else jnp.broadcast_to(value, (axis_size, *value.shape))


def _sort_rows(row_groups: Array, num_folded_groups: int) -> tuple[Array, Array]:
    """The stable permutation sorting rows by folded group, rows past the groups last, and its
    inverse."""
    keys = jnp.where(row_groups < 0, num_folded_groups, row_groups).reshape(-1)
    order = jnp.argsort(keys, stable=True)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    return order, inverse


def _batched_row_groups(group_sizes: Array, num_rows: int) -> Array:
    """``[B, M]``: each row's group in its batch, -1 past the batch's groups."""
    num_groups = group_sizes.shape[-1]
    ids = jax.vmap(group_ids, in_axes=(0, None))(group_sizes, num_rows)
    return jnp.where(ids < num_groups, ids, -1)


def _bilinear(op):
    """``op`` (bilinear in its first two arguments) as a ``custom_jvp`` whose tangent is ``op``
    again, so forward mode (``jax.hessian``, ``jacfwd``) never differentiates a backend kernel
    and every tangent batches through the folding rule."""
    op = jax.custom_jvp(op)
    op.defjvps(
        lambda lhs_dot, _, lhs, rhs, group_sizes: op(lhs_dot, rhs, group_sizes),
        lambda rhs_dot, _, lhs, rhs, group_sizes: op(lhs, rhs_dot, group_sizes),
        None,
    )
    return op


def gmm_op(impl: GroupedMatmulBackend, *, transpose_rhs: bool, out_dtype):
    """``(lhs [M, K], rhs [G, K, N], group_sizes [G]) -> [M, N]`` with the folding batch rule."""

    @jax.custom_batching.custom_vmap
    def gmm_unbatched(lhs, rhs, group_sizes):
        return impl.gmm(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs, out_dtype=out_dtype)

    gmm = _bilinear(gmm_unbatched)

    @gmm_unbatched.def_vmap
    def gmm_rule(axis_size, in_batched, lhs, rhs, group_sizes):
        lhs_batched, rhs_batched, sizes_batched = in_batched
        lhs = _lead(lhs, lhs_batched, axis_size)
        group_sizes = _lead(group_sizes, sizes_batched, axis_size)
        _, num_rows, k = lhs.shape
        num_groups = group_sizes.shape[-1]
        ids = _batched_row_groups(group_sizes, num_rows)
        batch = jnp.arange(axis_size, dtype=ids.dtype)[:, None]
        if rhs_batched:  # B*G matrices: batch-major groups, sizes as they are
            folded = jnp.where(ids < 0, -1, batch * num_groups + ids)
            rhs = rhs.reshape(axis_size * num_groups, *rhs.shape[2:])
            sizes = group_sizes.reshape(-1)
        else:  # G shared matrices: group-major rows, sizes summed over the batch
            folded = jnp.where(ids < 0, -1, ids * axis_size + batch)
            sizes = group_sizes.sum(axis=0, dtype=jnp.int32)
        order, inverse = _sort_rows(folded, axis_size * num_groups)
        out = gmm(lhs.reshape(-1, k)[order], rhs, sizes)[inverse]
        return out.reshape(axis_size, num_rows, out.shape[-1]), True

    return gmm


def tgmm_op(impl: GroupedMatmulBackend, *, out_dtype):
    """``(lhs [M, K], rhs [M, N], group_sizes [G]) -> [G, K, N]`` with the folding batch rule."""

    @jax.custom_batching.custom_vmap
    def tgmm_unbatched(lhs, rhs, group_sizes):
        return impl.tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype)

    tgmm = _bilinear(tgmm_unbatched)

    @tgmm_unbatched.def_vmap
    def tgmm_rule(axis_size, in_batched, lhs, rhs, group_sizes):
        lhs, rhs, group_sizes = (
            _lead(value, batched, axis_size)
            for value, batched in zip((lhs, rhs, group_sizes), in_batched, strict=True)
        )
        _, num_rows, k = lhs.shape
        num_groups = group_sizes.shape[-1]
        ids = _batched_row_groups(group_sizes, num_rows)
        batch = jnp.arange(axis_size, dtype=ids.dtype)[:, None]
        folded = jnp.where(ids < 0, -1, batch * num_groups + ids)
        order, _ = _sort_rows(folded, axis_size * num_groups)
        out = tgmm(
            lhs.reshape(-1, k)[order],
            rhs.reshape(-1, rhs.shape[-1])[order],
            group_sizes.reshape(-1),
        )
        return out.reshape(axis_size, num_groups, *out.shape[1:]), True

    return tgmm
