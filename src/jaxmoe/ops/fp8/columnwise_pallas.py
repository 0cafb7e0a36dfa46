r"""The FP8 wgrad's columnwise quantization in two Pallas (Triton) passes, no gather, no XLA
transpose.

:func:`jaxmoe.ops.fp8.columnwise.quantize_columnwise` in XLA gathers each padded column's row
and casts it into the transposed ``[K, Mp]`` layout in one loop fusion, which runs at about
0.1 TB/s on an H100: slower than the FP8 wgrad saves. Here:

* Each 128-column block of the padded layout holds up to 128 *contiguous* rows of one group
  (a group's rows are contiguous, and its padded columns start at a multiple of 128): block
  ``b`` is rows ``[src_b, src_b + count_b)`` of ``x``, zero-padded. XLA computes the three
  ``[Mp / 128]`` block tables (source row, row count, group) from the group sizes.
* Pass 1, grid ``(Mp / 128, K / bk)``: each program loads its block's rows (a masked load at a
  dynamic row offset: the gather, for free) and folds their column maxima ``[bk]`` into its
  group's row of ``amax [G, K]`` with an atomic max (zeros first: every maximum is >= 0, and
  a maximum is exact in any order). XLA's per-group reduction of the block maxima, a scatter,
  took longer than the pass itself (docs/kernels.md, 'FP8 quantizers'). XLA turns the maxima
  into scales with :func:`quantize.scale_from_amax`, as the XLA path does.
* Pass 2, same grid: loads the rows again, divides by its group's ``bk`` scales, casts
  (:func:`quantize.cast_scaled`) and stores the ``[bk, 128]`` transposed tile: 128 contiguous
  bytes per row of the output.

Reads ``2 + 2`` bytes and writes 1 per element; bit for bit the XLA path, several times its
bandwidth (measured: docs/kernels.md, 'FP8 quantizers').

Exactness: the maxima are exact in any order; the division is Triton's ``/``, which on an H100
rounds as XLA's GPU division (here and in :mod:`.weight_quantize_pallas`); in Pallas'
interpreter on a CPU one quotient in ~180 k landed on an e4m3 rounding tie XLA's did not
(tests/test_fp8_wgrad.py allows one step there). Rows past the groups are
never loaded (masked), so NaN there stays out.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxmoe.compat import quiet_triton_deprecation
from jaxmoe.ops.fp8.columnwise import ALIGN, block_tables, quantize_columnwise
from jaxmoe.ops.fp8.quantize import E4M3, cast_scaled, scale_from_amax
from jaxmoe.ops.fp8.weight_quantize_pallas import fit_block
from jaxmoe.ops.pallas_common import use_interpret

Array = jax.Array

BLOCK_K = 128
NUM_WARPS = 8
X_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def supports(x_shape, x_dtype, fp8_dtype) -> bool:
    """Whether the kernels take ``x [M, K]``: a 2- or 4-byte float, e4m3, ``K % 16 == 0``."""
    return (
        len(x_shape) == 2
        and x_shape[1] % 16 == 0
        and jnp.dtype(x_dtype) in X_DTYPES
        and jnp.dtype(fp8_dtype) == E4M3
    )


def _block_rows(x_ref, source, count, k0, block_k):
    """The block's ``[128, bk]`` rows as float32, zeros past its ``count`` rows."""
    rows = jax.lax.broadcasted_iota(jnp.int32, (ALIGN, block_k), 0)
    values = plgpu.load(
        x_ref.at[pl.ds(source, ALIGN), pl.ds(k0, block_k)], mask=rows < count, other=0
    )
    return values.astype(jnp.float32)


def _amax_kernel(source_ref, count_ref, group_ref, x_ref, zeros_ref, amax_ref, *, block_k: int):
    del zeros_ref  # amax_ref's initial value (aliased)
    k0 = pl.program_id(1) * block_k
    values = _block_rows(x_ref, source_ref[0], count_ref[0], k0, block_k)
    # A block past the groups (count 0) folds zeros into the last group: no change.
    target = (group_ref[0], pl.ds(k0, block_k))
    plgpu.atomic_max(amax_ref, target, jnp.max(jnp.abs(values), axis=0))


def _cast_kernel(source_ref, count_ref, group_ref, scale_ref, x_ref, q_t_ref, *, block_k: int):
    k0 = pl.program_id(1) * block_k
    values = _block_rows(x_ref, source_ref[0], count_ref[0], k0, block_k)
    scale = plgpu.load(scale_ref.at[group_ref[0], pl.ds(k0, block_k)])
    q_t_ref[...] = cast_scaled(values / scale[None, :], E4M3).T


def quantize_columnwise_pallas(
    x: Array, group_sizes: Array, *, interpret: bool | None = None
) -> tuple[Array, Array, Array]:
    """:func:`jaxmoe.ops.fp8.columnwise.quantize_columnwise` (e4m3) in the two Pallas passes."""
    num_rows, width = x.shape
    if not supports(x.shape, x.dtype, E4M3):
        raise ValueError(
            f"quantize_columnwise_pallas: x {x.shape} {x.dtype} needs [M, K] with K % 16 == 0 "
            "in bf16, fp16 or float32. Use jaxmoe.ops.fp8.columnwise.quantize_columnwise."
        )
    num_groups = group_sizes.shape[0]
    if num_rows == 0 or num_groups == 0:  # nothing to load: the XLA path's zeros
        return quantize_columnwise(x, group_sizes, E4M3)
    interpret = use_interpret(interpret)
    block_k = fit_block(width, BLOCK_K, "K")
    starts, source, count, group = block_tables(group_sizes, num_rows)
    num_blocks = source.shape[0]
    grid = (num_blocks, width // block_k)
    scalar = pl.BlockSpec((1,), lambda i, j: (i,))
    whole = pl.BlockSpec(memory_space=pl.ANY)
    params = plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1)
    with quiet_triton_deprecation():
        amax = pl.pallas_call(
            functools.partial(_amax_kernel, block_k=block_k),
            out_shape=jax.ShapeDtypeStruct((num_groups, width), jnp.float32),
            grid=grid,
            in_specs=[scalar, scalar, scalar, whole, whole],
            out_specs=whole,
            input_output_aliases={4: 0},
            compiler_params=params,
            interpret=interpret,
            name="jaxmoe_columnwise_amax",
        )(source, count, group, x, jnp.zeros((num_groups, width), jnp.float32))
        scale = scale_from_amax(amax, E4M3)  # an empty group's amax stays 0: the floor scale
        q_t = pl.pallas_call(
            functools.partial(_cast_kernel, block_k=block_k),
            out_shape=jax.ShapeDtypeStruct((width, num_blocks * ALIGN), E4M3),
            grid=grid,
            in_specs=[scalar, scalar, scalar, whole, whole],
            out_specs=pl.BlockSpec((block_k, ALIGN), lambda i, j: (j, i)),
            compiler_params=params,
            interpret=interpret,
            name="jaxmoe_columnwise_cast",
        )(source, count, group, scale, x)
    return q_t, scale, starts
