"""Sorted search with no loop on the device: :func:`search_right`.

``jnp.searchsorted``'s default method is a ``while`` loop of ``log2(n)`` steps. On a GPU each
step's condition is copied to the host (XLA's while thunk reads its predicate back), which stalls
the stream and keeps the latency-hiding scheduler from moving an asynchronous collective across
it (found: docs/kernels.md, 'Layer: no loops on the device'). Unrolled, the same binary search
is ``log2(n)`` fused gathers, with no host round trip.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def search_right(sorted_values: jax.Array, queries: jax.Array) -> jax.Array:
    """``jnp.searchsorted(sorted_values, queries, side="right")``, int32, loop-free: for each
    query the number of entries ``<= query`` (``sorted_values`` ascending, 1-D)."""
    return jnp.searchsorted(sorted_values, queries, side="right", method="scan_unrolled").astype(
        jnp.int32
    )
