"""Argument checks for array inputs and ``round_up``, shared by the ops and the layer (imports
nothing of jaxmoe).

The rules: a Python list or tuple (or a NumPy array) is converted with ``jnp.asarray``, as
``jax.numpy`` functions do; anything that does not convert is refused with a
``ValueError`` that names the argument and describes the value (its type and length) instead of
printing it. Checks on values (e.g. no negative sizes) run only where the value is concrete,
i.e. known in Python before tracing; a traced value's documented behaviour applies otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def round_up(value, multiple):
    """The least multiple of ``multiple`` that is ``>= value`` (ints or int arrays)."""
    return (value + multiple - 1) // multiple * multiple


def describe(value) -> str:
    """A short description of ``value`` for an error message (never the whole value)."""
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of length {len(value)}"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    return f"a {type(value).__name__}"


def as_array(value, name: str, where: str) -> jax.Array:
    """``value`` as a JAX array (lists, tuples and NumPy arrays converted by ``jnp.asarray``).

    Raises:
      ValueError: ``value`` is not an array and does not convert to one (a ragged list,
        ``None`` entries, ...). The dtype is left to the caller's own checks.
    """
    if isinstance(value, jax.Array):
        return value
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{where}: `{name}` must be an array (or a list of numbers); got {describe(value)} "
            f"that does not convert ({type(error).__name__}). Pass a rectangular list of "
            "numbers or a jnp.ndarray."
        ) from None


def concrete_value(value) -> np.ndarray | None:
    """``value`` as a NumPy array when it is known before tracing; ``None`` for a tracer."""
    if isinstance(value, jax.core.Tracer):
        return None
    try:
        return np.asarray(value)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None


def is_tracer(value) -> bool:
    """Whether ``value`` is a JAX tracer (an argument traced by ``jit``, ``grad``, ...)."""
    return isinstance(value, jax.core.Tracer)


def check_nonnegative(value, name: str, where: str, fix: str) -> None:
    """Raises ValueError when ``value`` is concrete and holds a negative entry."""
    known = concrete_value(value)
    if known is None or known.size == 0 or known.min() >= 0:
        return
    negative = np.flatnonzero(known < 0)
    first = int(negative[0])
    raise ValueError(
        f"{where}: `{name}` must be >= 0 everywhere; got {known.ravel()[first]} at index "
        f"{first} ({len(negative)} negative of {known.size}). {fix}"
    )


def check_mesh_type(mesh, where: str) -> None:
    """Raises TypeError, naming ``mesh``, unless it is None or a ``jax.sharding.Mesh``."""
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            f"{where}: `mesh` must be a jax.sharding.Mesh or None; got {describe(mesh)}. Build "
            "one with jax.make_mesh(shape, axis_names)."
        )
