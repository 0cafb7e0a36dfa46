r"""The grouped matmul as two JAX primitives, with their own batching, JVP and transpose rules.

``gmm``  ``(lhs [M, K], rhs [G, K, N], group_sizes [G]) -> [M, N]`` (``[G, N, K]`` rhs when
         ``transpose_rhs``): each group's rows of ``lhs`` times its matrix; rows past the
         groups get zeros.
``tgmm`` ``(lhs [M, K], rhs [M, N], group_sizes [G]) -> [G, K, N]``: each group's rows of
         ``lhs`` transposed times the same rows of ``rhs`` (the weight gradient).

Each is bilinear in ``(lhs, rhs)``, and each of its transposes is again one of the two, so any
order of differentiation (``grad`` of ``grad``, ``jax.hessian``, ``jacfwd``) stays on the
backend's kernels::

    out = gmm(x, w)            d out = gmm(dx, w) + gmm(x, dw)
      x_bar = gmm(out_bar, w, transpose_rhs)      w_bar = tgmm(x, out_bar)
    out = gmm(x, w, transpose_rhs)
      x_bar = gmm(out_bar, w)                      w_bar = tgmm(out_bar, x)
    out = tgmm(a, b)
      a_bar = gmm(b, out_bar, transpose_rhs)       b_bar = gmm(a, out_bar)

(an ``x_bar`` row past the groups is 0, as the forward ignores it). A backend kernel is never
differentiated by JAX; it lowers through :func:`jax.interpreters.mlir.lower_fun`.

**Batching.** ``jax.vmap`` of a backend's kernel would reach ``lax.ragged_dot``'s rule
(``NotImplementedError`` for any batch dim but 0) or a Pallas kernel's. The rule here folds the
batch into the rows and the groups, then binds the unbatched primitive once, on any backend::

    batch b, group g  (B batches of G groups over M rows each)
      rhs batched   [B, G, K, N]: group b*G + g of B*G groups, rhs reshaped to [B*G, K, N]
      rhs shared    [G, K, N]:    group g of G, its rows gathered from every batch
                                  (group size sum_b group_sizes[b, g]); no copy of rhs

A stable sort of the B*M rows by that folded group (rows past a batch's groups last) lays them
out as one grouped matmul wants; a gather by the inverse permutation puts the result back.
Nested ``vmap``\s fold once per level.

**shard_map.** The operands are cast to vary over the same manual axes before binding (as JAX's
own binary ops do), so the output varies over their union; the cast's transpose sums a
cotangent back over the axes its operand did not vary over.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxmoe import compat
from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend, group_ids

Array = jax.Array

gmm_p = Primitive("jaxmoe_grouped_matmul")
tgmm_p = Primitive("jaxmoe_transposed_grouped_matmul")


def bind_varying(primitive: Primitive, *operands, **params):
    """Binds ``primitive`` with its operands varying over the same manual axes (inside
    ``shard_map``; elsewhere a plain bind)."""
    axes = set()
    for value in operands:
        axes |= compat.varying_axes(value) or frozenset()
    return primitive.bind(*(compat.vary(value, tuple(axes)) for value in operands), **params)


def gmm(lhs, rhs, group_sizes, *, impl: GroupedMatmulBackend, transpose_rhs: bool, out_dtype):
    """``[M, N]``: ``lhs``'s group-``g`` rows times ``rhs[g]`` (``rhs[g]^T`` if transposed)."""
    return bind_varying(
        gmm_p,
        lhs,
        rhs,
        group_sizes,
        impl=impl,
        transpose_rhs=transpose_rhs,
        out_dtype=jnp.dtype(out_dtype),
    )


def tgmm(lhs, rhs, group_sizes, *, impl: GroupedMatmulBackend, out_dtype):
    """``[G, K, N]``: ``lhs_g^T @ rhs_g`` over each group's rows ``g``."""
    return bind_varying(tgmm_p, lhs, rhs, group_sizes, impl=impl, out_dtype=jnp.dtype(out_dtype))


# --- evaluation: shapes, the kernel call, its lowering ----------------------------------------


def out_aval(like, shape, dtype, leading_from_like: bool):
    """An aval of ``shape``/``dtype`` with ``like``'s manual axes; its sharding keeps ``like``'s
    leading (row) dimension when ``leading_from_like``, and replicates the rest."""
    sharding = like.sharding
    spec = sharding.spec
    leading = spec[0] if leading_from_like and len(spec) else None
    new_spec = jax.sharding.PartitionSpec(leading, *([None] * (len(shape) - 1)))
    return like.update(
        shape=shape, dtype=dtype, weak_type=False, sharding=sharding.update(spec=new_spec)
    )


def _gmm_abstract(lhs, rhs, group_sizes, *, impl, transpose_rhs, out_dtype):
    num_out = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    return out_aval(lhs, (lhs.shape[0], num_out), out_dtype, leading_from_like=True)


def _tgmm_abstract(lhs, rhs, group_sizes, *, impl, out_dtype):
    shape = (group_sizes.shape[0], lhs.shape[1], rhs.shape[1])
    return out_aval(lhs, shape, out_dtype, leading_from_like=False)


def _gmm_kernel(lhs, rhs, group_sizes, *, impl, transpose_rhs, out_dtype):
    return impl.gmm(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs, out_dtype=out_dtype)


def _tgmm_kernel(lhs, rhs, group_sizes, *, impl, out_dtype):
    return impl.tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype)


def with_kernel_effects(abstract, kernel):
    """An abstract eval that also declares the kernel's effects: none on a GPU, but Mosaic GPU's
    interpreter (the CPU tests) runs through ordered host callbacks, which the lowering must
    thread tokens through."""

    def abstract_eval(*avals, **params):
        shapes = tuple((aval.shape, aval.dtype) for aval in avals)
        effects = _kernel_effects(kernel, shapes, tuple(sorted(params.items())))
        return abstract(*avals, **params), effects

    return abstract_eval


@functools.lru_cache(maxsize=256)
def _kernel_effects(kernel, shapes, params):
    # Effects depend on the backend and shapes only (not on manual axes): trace plain arrays.
    avals = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    return jax.make_jaxpr(functools.partial(kernel, **dict(params)))(*avals).effects


gmm_p.def_effectful_abstract_eval(with_kernel_effects(_gmm_abstract, _gmm_kernel))
tgmm_p.def_effectful_abstract_eval(with_kernel_effects(_tgmm_abstract, _tgmm_kernel))
gmm_p.def_impl(_gmm_kernel)
tgmm_p.def_impl(_tgmm_kernel)
mlir.register_lowering(gmm_p, mlir.lower_fun(_gmm_kernel, multiple_results=False))
mlir.register_lowering(tgmm_p, mlir.lower_fun(_tgmm_kernel, multiple_results=False))


# --- differentiation: bilinear JVPs, transposes that are grouped matmuls ----------------------


def _is_zero(tangent) -> bool:
    return type(tangent) is ad.Zero


def _bilinear_jvp(op, primals, tangents, **params):
    lhs, rhs, group_sizes = primals
    lhs_dot, rhs_dot, _ = tangents
    out = op(lhs, rhs, group_sizes, **params)
    terms = []
    if not _is_zero(lhs_dot):
        terms.append(op(lhs_dot, rhs, group_sizes, **params))
    if not _is_zero(rhs_dot):
        terms.append(op(lhs, rhs_dot, group_sizes, **params))
    if not terms:
        return out, ad.Zero.from_primal_value(out)
    return out, functools.reduce(jnp.add, terms)


def _operand_dtype(operand):
    return operand.aval.dtype if ad.is_undefined_primal(operand) else operand.dtype


def _gmm_transpose(out_bar, lhs, rhs, group_sizes, *, impl, transpose_rhs, out_dtype):
    if _is_zero(out_bar):
        return None, None, None
    lhs_bar = rhs_bar = None
    if ad.is_undefined_primal(lhs):
        dtype = _operand_dtype(lhs)
        lhs_bar = gmm(
            out_bar.astype(dtype),
            rhs,
            group_sizes,
            impl=impl,
            transpose_rhs=not transpose_rhs,
            out_dtype=dtype,
        )
    if ad.is_undefined_primal(rhs):
        dtype = _operand_dtype(rhs)
        pair = (out_bar.astype(dtype), lhs) if transpose_rhs else (lhs, out_bar.astype(dtype))
        rhs_bar = tgmm(*pair, group_sizes, impl=impl, out_dtype=dtype)
    return lhs_bar, rhs_bar, None


def _tgmm_transpose(out_bar, lhs, rhs, group_sizes, *, impl, out_dtype):
    if _is_zero(out_bar):
        return None, None, None
    lhs_bar = rhs_bar = None
    if ad.is_undefined_primal(lhs):
        dtype = _operand_dtype(lhs)
        lhs_bar = gmm(
            rhs, out_bar.astype(dtype), group_sizes, impl=impl, transpose_rhs=True, out_dtype=dtype
        )
    if ad.is_undefined_primal(rhs):
        dtype = _operand_dtype(rhs)
        rhs_bar = gmm(
            lhs, out_bar.astype(dtype), group_sizes, impl=impl, transpose_rhs=False, out_dtype=dtype
        )
    return lhs_bar, rhs_bar, None


ad.primitive_jvps[gmm_p] = functools.partial(_bilinear_jvp, gmm)
ad.primitive_jvps[tgmm_p] = functools.partial(_bilinear_jvp, tgmm)
ad.primitive_transposes[gmm_p] = _gmm_transpose
ad.primitive_transposes[tgmm_p] = _tgmm_transpose


# --- batching: a batch of grouped matmuls is one grouped matmul -------------------------------


def _lead(value: Array, batch_dim, axis_size: int) -> Array:
    """``value`` with its batch dimension first (broadcast when it has none)."""
    if batch_dim is None:
        return jnp.broadcast_to(value, (axis_size, *value.shape))
    return jnp.moveaxis(value, batch_dim, 0)


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


def _axis_size(args, dims) -> int:
    return next(arg.shape[dim] for arg, dim in zip(args, dims, strict=True) if dim is not None)


def _gmm_batch(args, dims, **params):
    lhs, rhs, group_sizes = args
    lhs_dim, rhs_dim, sizes_dim = dims
    axis_size = _axis_size(args, dims)
    lhs = _lead(lhs, lhs_dim, axis_size)
    group_sizes = _lead(group_sizes, sizes_dim, axis_size)
    _, num_rows, k = lhs.shape
    num_groups = group_sizes.shape[-1]
    ids = _batched_row_groups(group_sizes, num_rows)
    batch = jnp.arange(axis_size, dtype=ids.dtype)[:, None]
    if rhs_dim is not None:  # B*G matrices: batch-major groups
        folded = jnp.where(ids < 0, -1, batch * num_groups + ids)
        rhs = jnp.moveaxis(rhs, rhs_dim, 0)
        rhs = rhs.reshape(axis_size * num_groups, *rhs.shape[2:])
        sizes = group_sizes.reshape(-1)
    else:  # G shared matrices: group-major rows, sizes summed over the batch
        folded = jnp.where(ids < 0, -1, ids * axis_size + batch)
        sizes = group_sizes.sum(axis=0, dtype=group_sizes.dtype)
    order, inverse = _sort_rows(folded, axis_size * num_groups)
    out = gmm(lhs.reshape(-1, k)[order], rhs, sizes, **params)[inverse]
    return out.reshape(axis_size, num_rows, out.shape[-1]), 0


def _tgmm_batch(args, dims, **params):
    axis_size = _axis_size(args, dims)
    lhs, rhs, group_sizes = (_lead(a, d, axis_size) for a, d in zip(args, dims, strict=True))
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
        **params,
    )
    return out.reshape(axis_size, num_groups, *out.shape[1:]), 0


batching.primitive_batchers[gmm_p] = _gmm_batch
batching.primitive_batchers[tgmm_p] = _tgmm_batch
