"""Debug switches.

``JAXMOE_POISON=1`` (environment, read when a function is traced) fills every buffer row that
the library allocates but must never read back (the tail of the permuted buffer past the expert
blocks, unused expert-parallel receive space) with NaN instead of zeros. CPUs zero-fill what a
GPU leaves uninitialised; with poison on, any kernel that reads such a row, or fails to write an
output row, turns the layer's result into NaN, so the mistake cannot hide.

The switch is read when a function is traced, and ``jit`` reuses earlier traces: set it before
the first call (e.g. in the environment at process start), or trace a fresh function (or call
``jax.clear_caches()``) after changing it. Otherwise a cached, unpoisoned trace keeps running.
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp

POISON_ENV = "JAXMOE_POISON"


def poison_enabled() -> bool:
    """Whether the NaN-poison debug mode is on (``JAXMOE_POISON`` not in ``"", "0"``)."""
    return os.environ.get(POISON_ENV, "0") not in ("", "0")


@contextlib.contextmanager
def poison_buffers(enabled: bool = True):
    """Context manager that turns the poison mode on (or off) for functions traced inside it."""
    previous = os.environ.get(POISON_ENV)
    os.environ[POISON_ENV] = "1" if enabled else "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[POISON_ENV]
        else:
            os.environ[POISON_ENV] = previous


def poison_rows(rows: jax.Array, live_rows) -> jax.Array:
    """Rows at or past ``live_rows`` become NaN when poisoning is on; unchanged otherwise.

    ``rows`` is ``[..., R, H]`` and ``live_rows`` broadcasts against its leading dims: a scalar
    for one buffer ``[R, H]``, ``[ep]`` for the slots ``[ep, P, H]`` of an exchange. Integer
    rows (e.g. FP8 rows packed as bytes) hold no NaN and stay unchanged: poison their scales.
    """
    if not poison_enabled() or not jnp.issubdtype(rows.dtype, jnp.inexact):
        return rows
    live_rows = jnp.asarray(live_rows)
    positions = jnp.arange(rows.shape[-2]).reshape((1,) * live_rows.ndim + (-1,))
    is_live = positions < live_rows[..., None]
    return jnp.where(is_live[..., None], rows, jnp.asarray(jnp.nan, rows.dtype))
