"""The row gather as a Pallas Triton kernel: whole blocks of gathered rows per program.

Program ``(i, j)`` reads ``ROWS`` entries of ``index``, loads those rows' ``j``-th block of
``COLUMNS`` columns from ``values`` (a masked load: zeros where an entry is out of range) and
stores them as one ``[ROWS, COLUMNS]`` block. XLA's gather (``jnp.take``) writes the same
result at about half the speed on the MoE layer's dispatch; the block and warp count are the
fastest measured there. The scaled form (``row_scale``) spreads the combine's output gradient
in the layer's backward, in place of XLA's gather fused with the weight. Measured:
docs/kernels.md, 'Row gather'.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxmoe import compat

# Index entries (rows) and columns per program, and warps per program: measured, see above.
ROWS = 16
COLUMNS = 512
NUM_WARPS = 4


def unsupported_reason(
    values: jax.Array, index: jax.Array, *, rows: int = ROWS, columns: int = COLUMNS
) -> str | None:
    """Why the kernel (``rows`` x ``columns`` blocks) cannot gather these operands, or
    ``None`` if it can.

    A program's block is ``[rows, min(columns, H)]``, and Pallas' Triton lowering takes only
    arrays whose sizes are powers of two: ``H`` below ``columns`` must itself be one (96 is
    not), ``H`` above it a multiple of it.
    """
    if compat.varying_axes(values) or compat.varying_axes(index):
        # A Pallas output declares no mesh variance, which jax.shard_map(check_vma=True)
        # refuses (the sharded layer turns the check off where its grouped matmul is Pallas).
        return "operands vary over shard_map axes checked by check_vma=True"
    num_columns = values.shape[1]
    (num_entries,) = index.shape
    if num_columns == 0 or num_entries == 0:  # an empty grid: no program to launch
        return f"values {values.shape} or index {index.shape} has no rows to write"
    columns = min(columns, num_columns)
    if not _is_power_of_two(columns) or not _is_power_of_two(rows):
        return (
            f"the block [{rows}, {columns}] (for values with {num_columns} columns) is not a "
            "power of two in each dim, which Pallas' Triton lowering requires"
        )
    if num_columns % columns:
        return f"values has {num_columns} columns, not a multiple of the kernel's {columns}"
    if num_entries % rows:
        return f"index has {num_entries} entries, not a multiple of the kernel's {rows}"
    return None


def _is_power_of_two(size: int) -> bool:
    return size > 0 and size & (size - 1) == 0


def gather_rows(
    values: jax.Array,
    index: jax.Array,
    *,
    row_scale: jax.Array | None = None,
    rows: int = ROWS,
    columns: int = COLUMNS,
    num_warps: int = NUM_WARPS,
    interpret: bool = False,
) -> jax.Array:
    """``out[i] = values[index[i]]``, zeros where ``index[i]`` is outside ``[0, len(values))``;
    ``values`` ``[T, H]``, ``index`` ``[R]`` (see :func:`unsupported_reason`). With
    ``row_scale`` ``[R]``: ``row_scale[i] * values[index[i]]`` in float32, cast back (as
    :func:`.xla.gather_rows`, bit for bit). ``rows``, ``columns`` and ``num_warps``: the block
    and the warps per program (tunable, for a bench to sweep)."""
    reason = unsupported_reason(values, index, rows=rows, columns=columns)
    if reason is not None:
        raise NotImplementedError(f"gather_rows (pallas_triton): {reason}")
    num_values, num_columns = values.shape
    (num_out,) = index.shape
    columns = min(columns, num_columns)

    def kernel(index_ref, values_ref, *refs):
        *scale_ref, out_ref = refs
        entries = index_ref[...]
        valid = (entries >= 0) & (entries < num_values)
        safe = jnp.where(valid, entries, 0)
        # Both indices as arrays (rows down, columns across): Pallas' interpreter gathers this
        # form as Triton does (a slice beside an array index it does not take).
        column_ids = pl.program_id(1) * columns + jnp.arange(columns, dtype=jnp.int32)
        block = plgpu.load(
            values_ref.at[safe[:, None], column_ids[None, :]],
            mask=jnp.broadcast_to(valid[:, None], (rows, columns)),
            other=0,
        )
        if scale_ref:
            scale = scale_ref[0][...].astype(jnp.float32)
            block = (block.astype(jnp.float32) * scale[:, None]).astype(block.dtype)
        out_ref[...] = block

    entry_block = pl.BlockSpec((rows,), lambda i, j: (i,))
    scale_operands = () if row_scale is None else (row_scale,)
    return pl.pallas_call(
        kernel,
        grid=(num_out // rows, num_columns // columns),
        in_specs=[entry_block, pl.BlockSpec(memory_space=pl.ANY)]
        + [entry_block] * len(scale_operands),
        out_specs=pl.BlockSpec((rows, columns), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((num_out, num_columns), values.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="jaxmoe_row_gather" if row_scale is None else "jaxmoe_row_gather_scaled",
    )(index.astype(jnp.int32), values, *scale_operands)
