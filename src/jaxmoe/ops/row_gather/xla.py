"""The row gather on XLA: one ``lax.gather`` with zeros for out-of-range indices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def gather_rows(
    values: jax.Array, index: jax.Array, row_scale: jax.Array | None = None
) -> jax.Array:
    """``out[i] = values[index[i]]``, zeros where ``index[i]`` is outside ``[0, len(values))``
    (``values`` of any rank, rows along its first axis); with ``row_scale``, ``row_scale[i] *
    values[index[i]]`` in float32, cast back.

    XLA fuses it with the elementwise work around it (a weight, a cast, a sum over copies),
    which a kernel of its own cannot offer; on its own it writes about half the kernel's
    bandwidth (docs/kernels.md, 'Row gather')."""
    # lax.gather itself rather than jnp.take, which first counts negative entries from the end
    # (one more select on the indices): here they are out of range, as in the kernel.
    dimensions = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(1, values.ndim)), collapsed_slice_dims=(0,), start_index_map=(0,)
    )
    rows = lax.gather(
        values,
        index[:, None],
        dimensions,
        slice_sizes=(1, *values.shape[1:]),
        mode=lax.GatherScatterMode.FILL_OR_DROP,
        fill_value=0,
    )
    if row_scale is None:
        return rows
    scaled = rows.astype(jnp.float32) * row_scale.astype(jnp.float32)[:, None]
    return scaled.astype(values.dtype)
