"""The row gather on XLA: ``jnp.take`` with zeros for out-of-range indices."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gather_rows(
    values: jax.Array, index: jax.Array, row_scale: jax.Array | None = None
) -> jax.Array:
    """``out[i] = values[index[i]]``, zeros where ``index[i]`` is outside ``[0, len(values))``;
    with ``row_scale``, ``row_scale[i] * values[index[i]]`` in float32, cast back.

    XLA fuses it with the elementwise work around it (a weight, a cast, a sum over copies),
    which a kernel of its own cannot offer; on its own it writes ~1.3 TB/s on an H100 and ~1.5
    on an H200 (``benchmarks/results/raw/h200-run32/call3``)."""
    # jnp.take counts negative entries from the end; here they are out of range, as in the
    # kernel (the permutation never passes any).
    index = jnp.where(index < 0, values.shape[0], index)
    rows = jnp.take(values, index, axis=0, mode="fill", fill_value=0)
    if row_scale is None:
        return rows
    scaled = rows.astype(jnp.float32) * row_scale.astype(jnp.float32)[:, None]
    return scaled.astype(values.dtype)
