r"""The rowwise FP8 recipe's two weight quantizations in two passes over the weights (Pallas).

Per training step the rowwise recipe quantizes each expert weight ``w[G, K, N]`` twice::

    forward  (out = x @ w, contraction over K): one scale per output channel n
        scale_fwd[g, 0, n]  = max(amax_k |w[g, k, n]|, SCALE_EPS) / 448
        q_fwd[g, k, n]      = e4m3(clip(w[g, k, n] / scale_fwd[g, 0, n], -448, 448))
        stored K-major, q_fwd_nk[g, n, k] = q_fwd[g, k, n]   (FP8 wgmma reads K-major)
    dgrad    (dx = dout @ w^T, contraction over N): one scale per input channel k
        scale_dgrad[g, k, 0] = max(amax_n |w[g, k, n]|, SCALE_EPS) / 448
        q_dgrad[g, k, n]     = e4m3(clip(w[g, k, n] / scale_dgrad[g, k, 0], -448, 448))
        stored [G, K, N] as given (N contiguous: K-major for that product)

XLA does this in five or six passes (a bf16 transpose, two amax reductions, the casts, one of
them fused with a transpose of 1-byte elements at 1.3 TB/s: ~2.9 ms per Mixtral
``[8, 4096, 14336]`` weight on an H100). Both amaxes need all of a row or column before any
cast, so two passes is the minimum; this module does exactly two, reading 2 + 2 bytes and
writing 1 + 1 per weight (6 bytes, ~0.6 ms for a Mixtral weight at 3 TB/s):

1. :func:`_amax_kernel`, grid ``(G, K / bk, N / bn)``: each program reads one ``[bk, bn]``
   tile of ``|w|`` and writes its row maxima (``[bk]``, to ``row_partials[g, j, k-tile]``) and
   column maxima (``[bn]``, to ``col_partials[g, i, n-tile]``). XLA reduces the partials
   (``1/bn`` and ``1/bk`` of the weight) and forms both scales with
   :func:`quantize.scale_from_amax`, as :func:`quantize.quantize` does. Maxima are exact in
   any order, so the scales are the XLA path's bits.
2. :func:`_cast_kernel`, grid ``(G, K / bk, N / bn)``: each program reads one tile and its
   ``bn`` forward and ``bk`` dgrad scales, and writes the ``q_dgrad`` tile in place and the
   transposed tile of ``q_fwd_nk``. With 128 x 128 tiles each row of the transposed store is
   128 contiguous bytes. The cast is :func:`quantize.cast_scaled`, as in ``quantize``.

Exactness. Every step is the XLA path's float32 operation on the same values: the bf16 -> f32
widening, the IEEE max, ``max(amax, SCALE_EPS) / 448`` (in XLA, both paths), the division, the
clip and the round-to-nearest-even cast (the Triton lowering casts with ``RTNE``; values are
clipped first, so saturation never matters). The one trap is the division: it must round as
XLA's does *on the same platform*. On the CPU (the interpreter) both are XLA's IEEE division.
On the GPU, Triton lowers float32 ``/`` to PTX ``div.full.f32`` (approximate, <= 2 ulp), and
XLA's GPU division rounds the same way (measured; its PTX was not inspected): with Triton's
``/`` the kernel matches the XLA path bit for bit, while the correctly rounded ``div.rn.f32``
(inline PTX, ``ieee_division=True``) differs and is slower (docs/kernels.md, 'FP8
quantizers'). So the kernel keeps Triton's ``/``; ``ieee_division`` stays as the benchmark's
control.

Backend: ``pl.pallas_call`` with BlockSpecs on Pallas' Triton backend (float8_e4m3fn stores
need compute capability >= 8.9: Hopper's is 9.0), or Pallas' interpreter when JAX's default
backend is not a GPU (the tests). Tile sizes are powers of two (Triton's rule): each block is
the configured size, halved until it divides its dim, down to 16; a dim that 16 does not divide
is refused with a ValueError (the caller keeps the XLA path). Every weight shape of the
benchmarks is a multiple of 128.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxmoe.compat import quiet_triton_deprecation
from jaxmoe.ops.fp8.quantize import E4M3, cast_scaled, quantize, scale_from_amax
from jaxmoe.ops.pallas_common import use_interpret

Array = jax.Array

MIN_BLOCK = 16
WEIGHT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class WeightQuantizeTiles:
    """Tile sizes and Triton warps of the two kernels (powers of two; shrunk to fit the dims).

    ``cast_block_k`` is the length of each contiguous row of the transposed ``q_fwd_nk`` store
    (1 byte per element): 64-128 keeps the stores coalesced.
    """

    amax_block_k: int = 128
    amax_block_n: int = 256
    amax_num_warps: int = 8
    cast_block_k: int = 128
    cast_block_n: int = 128
    cast_num_warps: int = 8

    def __post_init__(self):
        for field in ("amax_block_k", "amax_block_n", "cast_block_k", "cast_block_n"):
            size = getattr(self, field)
            if not isinstance(size, int) or size < MIN_BLOCK or size & (size - 1):
                raise ValueError(
                    f"WeightQuantizeTiles.{field} must be a power of two >= {MIN_BLOCK}; "
                    f"got {size!r}."
                )


def fit_block(dim: int, want: int, what: str) -> int:
    """The largest power of two ``<= want`` that divides ``dim``, or ValueError below 16.

    ``what`` names the dim in the message (e.g. ``"w.shape[1] (K)"``).
    """
    block = want
    while block > MIN_BLOCK and dim % block:
        block //= 2
    if dim % block:
        raise ValueError(
            f"quantize_weights_rowwise_pallas: {what} = {dim} must be a multiple of "
            f"{MIN_BLOCK} (the smallest tile); use the XLA path (quantize) for this weight."
        )
    return block


def supports(w_shape, w_dtype, fp8_dtype) -> bool:
    """Whether :func:`quantize_weights_rowwise_pallas` takes a ``w_shape`` ``w_dtype`` weight
    quantized to ``fp8_dtype`` (else the caller keeps XLA's :func:`quantize`)."""
    return (
        len(w_shape) == 3
        and w_shape[0] >= 1
        and w_shape[1] % MIN_BLOCK == 0
        and w_shape[2] % MIN_BLOCK == 0
        and jnp.dtype(w_dtype) in WEIGHT_DTYPES
        and jnp.dtype(fp8_dtype) == E4M3
    )


def check_weight(w) -> None:
    """ValueError unless ``w`` is a non-empty ``[G, K, N]`` bf16/f16/f32 weight."""
    if getattr(w, "ndim", None) != 3:
        raise ValueError(
            "quantize_weights_rowwise_pallas: `w` must be a 3-D expert weight [G, K, N]; "
            f"got shape {getattr(w, 'shape', None)}."
        )
    if jnp.dtype(w.dtype) not in WEIGHT_DTYPES:
        raise ValueError(
            "quantize_weights_rowwise_pallas: `w` must be bfloat16, float16 or float32; "
            f"got {w.dtype}."
        )
    if w.shape[0] < 1:
        raise ValueError(
            f"quantize_weights_rowwise_pallas: `w` has no experts (shape {w.shape}); "
            "G must be >= 1."
        )


def _amax_kernel(w_ref, row_partial_ref, col_partial_ref):
    """One ``[bk, bn]`` tile: ``row_partial[k] = max_n |w|``, ``col_partial[n] = max_k |w|``."""
    magnitude = jnp.abs(w_ref[...].astype(jnp.float32))
    row_partial_ref[...] = jnp.max(magnitude, axis=1)
    col_partial_ref[...] = jnp.max(magnitude, axis=0)


def _divide(numerator: Array, denominator: Array, *, interpret: bool, ieee: bool) -> Array:
    """``numerator / denominator`` in float32, rounded as the XLA path rounds it here.

    By default Triton's ``/`` (``div.full.f32`` on the GPU, as XLA's; IEEE in the interpreter).
    ``ieee=True`` emits PTX ``div.rn.f32`` on the GPU (correctly rounded, by inline assembly;
    both operands have the tile's shape): the control that showed XLA's GPU division is not it.
    """
    if interpret or not ieee:
        return numerator / denominator
    (quotient,) = plgpu.elementwise_inline_asm(
        "div.rn.f32 $0, $1, $2;",
        args=[numerator, denominator],
        constraints="=r,r,r",
        pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(numerator.shape, jnp.float32)],
    )
    return quotient


def _cast_kernel(
    w_ref,
    scale_fwd_ref,
    scale_dgrad_ref,
    q_fwd_nk_ref,
    q_dgrad_ref,
    *,
    interpret: bool,
    ieee_division: bool,
):
    """One ``[bk, bn]`` tile: ``q_dgrad`` tile in place, ``q_fwd`` tile transposed to ``[bn, bk]``.

    ``scale_fwd_ref`` holds the tile's ``bn`` column scales, ``scale_dgrad_ref`` its ``bk``
    row scales.
    """
    w = w_ref[...].astype(jnp.float32)
    shape = w.shape
    scale_fwd = jnp.broadcast_to(scale_fwd_ref[...][None, :], shape)
    scale_dgrad = jnp.broadcast_to(scale_dgrad_ref[...][:, None], shape)
    divide = functools.partial(_divide, interpret=interpret, ieee=ieee_division)
    q_dgrad_ref[...] = cast_scaled(divide(w, scale_dgrad), E4M3)
    q_fwd_nk_ref[...] = cast_scaled(divide(w, scale_fwd), E4M3).T


def weight_amax_partials(
    w: Array, block_k: int, block_n: int, *, num_warps: int, interpret: bool
) -> tuple[Array, Array]:
    """Kernel 1: ``(row_partials [G, N/bn, K], col_partials [G, K/bk, N])`` float32 maxima of
    ``|w|`` over each tile's columns and rows (contiguous along K and N respectively)."""
    groups, k, n = w.shape
    num_k_tiles, num_n_tiles = k // block_k, n // block_n
    squeezed = pl.squeezed
    return pl.pallas_call(
        _amax_kernel,
        out_shape=(
            jax.ShapeDtypeStruct((groups, num_n_tiles, k), jnp.float32),
            jax.ShapeDtypeStruct((groups, num_k_tiles, n), jnp.float32),
        ),
        grid=(groups, num_k_tiles, num_n_tiles),
        in_specs=[pl.BlockSpec((squeezed, block_k, block_n), lambda g, i, j: (g, i, j))],
        out_specs=(
            pl.BlockSpec((squeezed, squeezed, block_k), lambda g, i, j: (g, j, i)),
            pl.BlockSpec((squeezed, squeezed, block_n), lambda g, i, j: (g, i, j)),
        ),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="jaxmoe_weight_amax",
    )(w)


def weight_cast(
    w: Array,
    scale_fwd: Array,
    scale_dgrad: Array,
    block_k: int,
    block_n: int,
    *,
    num_warps: int,
    interpret: bool,
    ieee_division: bool = False,
) -> tuple[Array, Array]:
    """Kernel 2: ``(q_fwd_nk [G, N, K], q_dgrad [G, K, N])`` e4m3 from ``w`` and the scales
    ``scale_fwd [G, N]``, ``scale_dgrad [G, K]`` (float32). ``ieee_division``: see
    :func:`_divide` (not XLA's bits on the GPU; the benchmark's control)."""
    groups, k, n = w.shape
    squeezed = pl.squeezed
    return pl.pallas_call(
        functools.partial(_cast_kernel, interpret=interpret, ieee_division=ieee_division),
        out_shape=(
            jax.ShapeDtypeStruct((groups, n, k), E4M3),
            jax.ShapeDtypeStruct((groups, k, n), E4M3),
        ),
        grid=(groups, k // block_k, n // block_n),
        in_specs=[
            pl.BlockSpec((squeezed, block_k, block_n), lambda g, i, j: (g, i, j)),
            pl.BlockSpec((squeezed, block_n), lambda g, i, j: (g, j)),
            pl.BlockSpec((squeezed, block_k), lambda g, i, j: (g, i)),
        ],
        out_specs=(
            pl.BlockSpec((squeezed, block_n, block_k), lambda g, i, j: (g, j, i)),
            pl.BlockSpec((squeezed, block_k, block_n), lambda g, i, j: (g, i, j)),
        ),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="jaxmoe_weight_cast",
    )(w, scale_fwd, scale_dgrad)


def quantize_weights_rowwise_pallas(
    w: Array,
    *,
    tiles: WeightQuantizeTiles | None = None,
    interpret: bool | None = None,
    ieee_division: bool = False,
) -> tuple[Array, Array, Array, Array]:
    """Both rowwise e4m3 quantizations of an expert weight in two passes (module docstring).

    Bit for bit the XLA path: ``q, s = quantize(w, (1, None, 1))`` gives
    ``(swapaxes(q, 1, 2), s)`` and ``quantize(w, (1, 1, None))`` gives the dgrad pair.

    Args:
      w: ``[G, K, N]`` bfloat16 (or float16/float32) weight; K and N multiples of 16.
      tiles: tile sizes (default :class:`WeightQuantizeTiles`), shrunk to divide K and N.
      interpret: run the kernels in Pallas' interpreter (default: when not on a GPU).
      ieee_division: on the GPU, divide with the correctly rounded ``div.rn.f32`` instead of
        ``div.full.f32`` (XLA's): then NOT the XLA path's bits (the benchmark's control).

    Returns:
      ``(q_fwd_nk [G, N, K] e4m3, scale_fwd [G, 1, N] f32, q_dgrad [G, K, N] e4m3,
      scale_dgrad [G, K, 1] f32)``.

    Raises:
      ValueError: ``w`` is not a 3-D float weight, or K or N is not a multiple of 16.
    """
    check_weight(w)
    tiles = tiles or WeightQuantizeTiles()
    interpret = use_interpret(interpret)
    groups, k, n = w.shape
    k_what, n_what = "w.shape[1] (K)", "w.shape[2] (N)"
    amax_bk = fit_block(k, tiles.amax_block_k, k_what)
    amax_bn = fit_block(n, tiles.amax_block_n, n_what)
    cast_bk = fit_block(k, tiles.cast_block_k, k_what)
    cast_bn = fit_block(n, tiles.cast_block_n, n_what)
    with quiet_triton_deprecation():
        row_partials, col_partials = weight_amax_partials(
            w, amax_bk, amax_bn, num_warps=tiles.amax_num_warps, interpret=interpret
        )
        scale_dgrad = scale_from_amax(jnp.max(row_partials, axis=1), E4M3)  # [G, K]
        scale_fwd = scale_from_amax(jnp.max(col_partials, axis=1), E4M3)  # [G, N]
        q_fwd_nk, q_dgrad = weight_cast(
            w,
            scale_fwd,
            scale_dgrad,
            cast_bk,
            cast_bn,
            num_warps=tiles.cast_num_warps,
            interpret=interpret,
            ieee_division=ieee_division,
        )
    return (
        q_fwd_nk,
        scale_fwd.reshape(groups, 1, n),
        q_dgrad,
        scale_dgrad.reshape(groups, k, 1),
    )


def quantize_weights_rowwise_xla(w: Array) -> tuple[Array, Array, Array, Array]:
    """The reference: the same four arrays from :func:`quantize.quantize` (XLA)."""
    q_fwd, scale_fwd = quantize(w, (1, None, 1), E4M3)
    q_dgrad, scale_dgrad = quantize(w, (1, 1, None), E4M3)
    return jnp.swapaxes(q_fwd, 1, 2), scale_fwd, q_dgrad, scale_dgrad
