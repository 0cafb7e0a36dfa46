r"""A multilinear map as one JAX primitive: its own transposes, forward mode and batching.

The token permutation, the expert-parallel exchange and the overflow windows' tangent are maps
linear in some operands, with a transpose worth choosing by hand (a gather by the inverse map
rather than JAX's scatter-add; the reverse exchange). A ``jax.custom_vjp`` gives the transpose
but no forward mode; :func:`multilinear` gives both, and leaves reverse mode computing what the
custom VJP computed::

    out = apply(*groups, *operands)          linear in each group of arrays separately
    d out = sum_g apply(.., d group_g, ..)   (forward mode: the same map, on the tangent)
    group_g_bar = transposes[g](out_bar, *every other array)      (reverse mode, unchanged)

``operands`` (after the groups) are indices and sizes: not differentiated (their tangents, if
any, enter through JAX's own JVP of ``apply``). A group is one array (the rows a permutation
moves) or several arrays linear jointly (the tangents of the overflow's inputs). ``apply`` and
each transpose are plain functions: ``apply`` lowers through
:func:`jax.interpreters.mlir.lower_fun` (so a Pallas kernel in it still runs), and JAX
differentiates a transpose like any code, so every higher order works.

**Batching.** ``jax.vmap`` binds the primitive again with ``apply`` and the transposes vmapped
(every group's arrays made batched along axis 0 first), so a vmapped map keeps its transposes.

**shard_map.** The arrays are cast to vary over the same manual axes before binding (the
grouped matmul's rule), so the output varies over their union.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxmoe import compat

multilinear_p = Primitive("jaxmoe_multilinear")


def multilinear(
    apply: Callable,
    transposes: tuple[Callable, ...],
    groups: tuple[tuple[jax.Array, ...], ...],
    operands: tuple = (),
    *,
    out: jax.ShapeDtypeStruct,
    **static,
) -> jax.Array:
    """``apply(*group arrays, *operands, **static)``, linear in each group separately.

    Args:
      apply: the map; returns one array of ``out``'s shape and dtype.
      transposes: one per group: ``transposes[g](cotangent, *every array but group g's,
        **static)`` returns group ``g``'s cotangents (a tuple, or one array for a group of one).
      groups: tuples of arrays, in ``apply``'s argument order.
      operands: the remaining (non-linear) arrays, after the groups.
      out: the output's shape and dtype (``apply`` is not traced to find them: it may refuse).
      static: hashable keyword arguments of ``apply`` and every transpose.
    """
    arrays = [value for group in groups for value in group] + list(operands)
    axes = set()
    for value in arrays:
        axes |= compat.varying_axes(value) or frozenset()
    arrays = [compat.vary(value, tuple(sorted(axes))) for value in arrays]
    return multilinear_p.bind(
        *arrays,
        apply=apply,
        transposes=tuple(transposes),
        group_sizes=tuple(len(group) for group in groups),
        out_shape=tuple(out.shape),
        out_dtype=jnp.dtype(out.dtype),
        static=tuple(sorted(static.items())),
    )


def _impl(*arrays, apply, transposes, group_sizes, out_shape, out_dtype, static):
    return apply(*arrays, **dict(static))


def _abstract_eval(*avals, apply, transposes, group_sizes, out_shape, out_dtype, static):
    like = avals[0]  # every array varies over the same axes (multilinear's cast)
    spec = jax.sharding.PartitionSpec(*([None] * len(out_shape)))
    return like.update(
        shape=out_shape, dtype=out_dtype, weak_type=False, sharding=like.sharding.update(spec=spec)
    )


multilinear_p.def_impl(_impl)
multilinear_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(multilinear_p, mlir.lower_fun(_impl, multiple_results=False))


def _group_slices(group_sizes) -> list[slice]:
    starts = np.cumsum((0, *group_sizes))
    return [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:], strict=True)]


def _is_zero(tangent) -> bool:
    return type(tangent) is ad.Zero or jnp.dtype(tangent.dtype) == jax.dtypes.float0


def _jvp(primals, tangents, **params):
    out = multilinear_p.bind(*primals, **params)
    terms = []
    slices = _group_slices(params["group_sizes"])
    for group in slices:
        if all(_is_zero(t) for t in tangents[group]):
            continue
        # The same map with group g replaced by its tangent: linear in it, the others fixed.
        group_tangents = [
            ad.instantiate_zeros(t) if type(t) is ad.Zero else t for t in tangents[group]
        ]
        arrays = [*primals[: group.start], *group_tangents, *primals[group.stop :]]
        terms.append(multilinear_p.bind(*arrays, **params))
    moving = [i for i in range(slices[-1].stop, len(primals)) if not _is_zero(tangents[i])]
    if moving:
        # A non-linear operand with a tangent (a float residual, at a higher order): JAX's own
        # JVP of the plain map.
        def along(*values):
            arrays = list(primals)
            for i, value in zip(moving, values, strict=True):
                arrays[i] = value
            return _impl(*arrays, **params)

        terms.append(jax.jvp(along, [primals[i] for i in moving], [tangents[i] for i in moving])[1])
    if not terms:
        return out, ad.Zero.from_primal_value(out)
    return out, functools.reduce(jnp.add, terms)


def _transpose(cotangent, *arrays, apply, transposes, group_sizes, out_shape, out_dtype, static):
    undefined = [i for i, value in enumerate(arrays) if ad.is_undefined_primal(value)]
    slices = _group_slices(group_sizes)
    owners = {
        g for g, group in enumerate(slices) for i in undefined if group.start <= i < group.stop
    }
    if len(owners) != 1 or max(undefined) >= slices[-1].stop:
        # Linearizing yields one group's tangent at a time, the operands known: anything else
        # is not a linear use of this map.
        raise NotImplementedError(
            f"jaxmoe.multilinear ({getattr(apply, '__name__', apply)}): transposed with respect "
            f"to arrays {undefined}, not the arrays of one linear group {slices}"
        )
    (g,) = owners
    group = slices[g]
    if type(cotangent) is ad.Zero:
        group_cts = [None] * (group.stop - group.start)
    else:
        others = [*arrays[: group.start], *arrays[group.stop :]]
        group_cts = transposes[g](cotangent, *others, **dict(static))
        if group.stop - group.start == 1 and not isinstance(group_cts, tuple | list):
            group_cts = [group_cts]
    return [group_cts[i - group.start] if i in undefined else None for i in range(len(arrays))]


ad.primitive_jvps[multilinear_p] = _jvp
ad.primitive_transposes[multilinear_p] = _transpose


@dataclasses.dataclass(frozen=True)
class _Vmapped:
    """``function`` vmapped over ``in_axes`` (output batched along axis 0), hashable."""

    function: Callable
    in_axes: tuple

    def __call__(self, *arrays, **static):
        return jax.vmap(functools.partial(self.function, **static), in_axes=self.in_axes)(*arrays)


def _batch(arrays, dims, *, apply, transposes, group_sizes, out_shape, out_dtype, static):
    size = next(a.shape[d] for a, d in zip(arrays, dims, strict=True) if d is not None)
    linear_end = sum(group_sizes)
    moved, axes = [], []
    for i, (value, dim) in enumerate(zip(arrays, dims, strict=True)):
        if i < linear_end or dim is not None:
            # Every linear array batched (a transpose must return a batched cotangent; an
            # unbatched one is broadcast, whose transpose sums the batch back).
            moved.append(batching.bdim_at_front(value, dim, size))
            axes.append(0)
        else:
            moved.append(value)
            axes.append(None)
    slices = _group_slices(group_sizes)
    batched_transposes = tuple(
        _Vmapped(transpose, (0, *axes[: group.start], *axes[group.stop :]))
        for transpose, group in zip(transposes, slices, strict=True)
    )
    out = multilinear_p.bind(
        *moved,
        apply=_Vmapped(apply, tuple(axes)),
        transposes=batched_transposes,
        group_sizes=group_sizes,
        out_shape=(size, *out_shape),
        out_dtype=out_dtype,
        static=static,
    )
    return out, 0


batching.primitive_batchers[multilinear_p] = _batch
