"""The few places where jax 0.10 and 0.11 (the versions jaxmoe supports) differ.

Everything else in jaxmoe uses one spelling of the JAX API; the floor (``jax>=0.10`` in
``pyproject.toml``) has ``jax.shard_map``, ``jax.typeof`` and ``jax.lax.pcast``.
"""

from __future__ import annotations

import contextlib
import warnings

import jax
import jax.numpy as jnp


def varying_axes(value) -> frozenset | None:
    """The mesh axes ``value`` varies over inside ``shard_map`` (``None`` outside one).

    jax 0.11 spells it ``aval.vma``; jax 0.10 ``aval.manual_axis_type.varying``.
    """
    aval = jax.typeof(value)
    vma = getattr(aval, "vma", None)
    if vma is None and hasattr(aval, "manual_axis_type"):
        vma = aval.manual_axis_type.varying
    return None if vma is None else frozenset(vma)


def vary(value, axes):
    """Marks ``value`` as varying over ``axes`` (``shard_map``'s type system), where it is not.

    Custom VJPs (the grouped matmul's) must return cotangents of their inputs' type: a weight
    replicated over the data axes gets a per-shard gradient, so it enters as varying, and the
    transpose of this cast sums the gradient over those axes.
    """
    vma = varying_axes(value)
    if vma is None:
        return value
    missing = tuple(axis for axis in axes if axis not in vma)
    if not missing:
        return value
    return jax.lax.pcast(value, missing, to="varying")


def zeros_like_typed(value):
    """Zeros of ``value``'s shape and dtype that vary over the same mesh axes as ``value``
    (a ``while_loop`` carry inside ``shard_map`` must keep one type)."""
    zeros = jnp.zeros(jnp.shape(value), jnp.result_type(value))
    return vary(zeros, tuple(varying_axes(value) or ()))


def has_explicit_axes(mesh) -> bool:
    """Whether ``mesh`` has an axis of type ``Explicit`` (``jax.make_mesh``'s default on 0.11)."""
    return any(axis_type == jax.sharding.AxisType.Explicit for axis_type in mesh.axis_types)


@contextlib.contextmanager
def quiet_triton_deprecation():
    """Silences, while inside, jax 0.11's deprecation warning for the Pallas Triton backend.

    jax >= 0.11 marks the Pallas Triton backend deprecated (in favour of Mosaic GPU) and warns in
    the ``pallas_call``'s lowering. Its kernels here are still the grouped matmuls on non-Hopper
    GPUs and the FP8 casts, so their calls silence that one message while they run; nothing
    changes for the rest of the program (no module-level filter). Under an enclosing ``jax.jit``
    the lowering happens later, in the caller's compile, where jaxmoe cannot scope a filter: there
    the warning is a ``DeprecationWarning`` raised from jax's own code, which Python's default
    filters already hide.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r".*[Tt]riton.*deprecat", category=DeprecationWarning
        )
        yield
