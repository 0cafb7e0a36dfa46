r"""FP8 quantization with float32 scales: one scale per block of a tensor, amax-based.

For a block ``B`` of ``x`` and an FP8 format whose largest finite value is ``fmax`` (448 for
``float8_e4m3fn``, 57344 for ``float8_e5m2``)::

    scale_B = max(amax(|x_B|), SCALE_EPS) / fmax            # float32
    q_B     = cast_fp8(clip(x_B / scale_B, -fmax, fmax))    # round to nearest, ties to even
    x_B    ~= q_B * scale_B                                  # dequantize

The cast is jnp's own (``jnp.float8_e4m3fn`` etc.), so the rounding is exactly that of FP8
hardware. ``SCALE_EPS`` keeps an all-zero block finite (it quantizes to zeros and dequantizes to
zeros). The clip matters: ``x_B / scale_B`` can exceed ``fmax`` by a float32 rounding, and
e4m3fn has no infinity, so an unclipped overflow would become NaN (saturation instead).

Error bound (e4m3, 3 mantissa bits): a value ``|x / scale_B| >= 2**-6`` (a normal e4m3 number)
rounds to within a relative ``2**-4`` (half an ulp); below that, the subnormal spacing is
``2**-9``. So every element obeys ``|x - q * scale_B| <= 2**-4 * |x| + 2**-10 * scale_B``.

Block shapes are given per dimension: an int is the block's extent along that dim (``1``: one
scale per index), ``None`` means the whole dim. A dim that the block does not divide gets a
last, partial block (padded with zeros for the amax only). The scale has one entry per block:
shape ``ceil(dim / block)`` on each dim (``1`` where the block is ``None``), so it broadcasts
against ``x`` after :func:`expand_scale`.

Example::

    q, scale = quantize(x, (1, None))   # x: [M, K] -> one scale per row, scale: [M, 1]
    q, scale = quantize(w, (1, 128, 128))  # w: [G, K, N] -> DeepSeek-V3 weight blocks

References: Micikevicius et al. 2022, "FP8 Formats for Deep Learning" (e4m3/e5m2);
DeepSeek-AI 2024, DeepSeek-V3 technical report, section 3.3 (fine-grained block scaling).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

E4M3 = jnp.dtype(jnp.float8_e4m3fn)
E5M2 = jnp.dtype(jnp.float8_e5m2)
FP8_DTYPES = (E4M3, E5M2)
# The amax floor: below it a block counts as all-zero. Tiny next to any real activation, large
# enough that SCALE_EPS / 448 (~2.2e-15) stays a normal float32.
SCALE_EPS = 1e-12

BlockShape = Sequence[int | None]


def fp8_max(dtype) -> float:
    """The largest finite value of an FP8 dtype (448.0 for e4m3fn, 57344.0 for e5m2)."""
    return float(jnp.finfo(dtype).max)


def _check_dtype(dtype) -> None:
    if jnp.dtype(dtype) not in FP8_DTYPES:
        raise ValueError(
            f"quantize: `dtype` must be one of {[str(d) for d in FP8_DTYPES]}; got {dtype}. "
            "Use jnp.float8_e4m3fn (activations, weights) or jnp.float8_e5m2."
        )


def _block_extents(x_shape: tuple, block_shape: BlockShape) -> tuple[int, ...]:
    """Each block's extent along each dim (a ``None`` block spans the dim), or ValueError."""
    if len(block_shape) != len(x_shape):
        raise ValueError(
            f"quantize: `block_shape` needs one entry per dim of x (shape {x_shape}); got "
            f"{tuple(block_shape)}. Use None for a whole dim, e.g. (1, None) for per-row scales."
        )
    blocks = []
    for dim, block in zip(x_shape, block_shape, strict=True):
        if block is None:
            blocks.append(max(dim, 1))
        elif isinstance(block, int | np.integer) and not isinstance(block, bool) and block >= 1:
            blocks.append(int(block))
        else:
            raise ValueError(
                f"quantize: every entry of `block_shape` must be None or an int >= 1; got "
                f"{tuple(block_shape)}. E.g. (1, 128) for 1x128 tiles."
            )
    return tuple(blocks)


def scale_shape(x_shape: tuple, block_shape: BlockShape) -> tuple[int, ...]:
    """The shape of the scales of an ``x_shape`` tensor quantized in ``block_shape`` blocks."""
    blocks = _block_extents(tuple(x_shape), block_shape)
    return tuple(math.ceil(dim / block) for dim, block in zip(x_shape, blocks, strict=True))


def expand_scale(scale: jax.Array, x_shape: tuple, block_shape: BlockShape) -> jax.Array:
    """Repeats each block's scale over its block: the result has shape ``x_shape``."""
    blocks = _block_extents(tuple(x_shape), block_shape)
    for axis, block in enumerate(blocks):
        scale = jnp.repeat(scale, block, axis=axis) if block > 1 else scale
    return scale[tuple(slice(0, dim) for dim in x_shape)]


def scale_from_amax(amax: jax.Array, dtype=E4M3) -> jax.Array:
    """``max(amax, SCALE_EPS) / fmax(dtype)`` in float32: a block's scale from its amax."""
    return (jnp.maximum(amax, SCALE_EPS) / fp8_max(dtype)).astype(jnp.float32)


def cast_scaled(scaled: jax.Array, dtype=E4M3) -> jax.Array:
    """``cast(clip(scaled, -fmax, fmax))``: values already divided by their scale, to FP8 (the
    clip turns a float32 overshoot into saturation; plain jnp, so Pallas kernels use it too)."""
    fmax = fp8_max(dtype)
    return jnp.clip(scaled, -fmax, fmax).astype(dtype)


def quantize(x: jax.Array, block_shape: BlockShape, dtype=E4M3) -> tuple[jax.Array, jax.Array]:
    """Quantizes ``x`` to FP8 with one float32 scale per block (see the module docstring).

    Args:
      x: a floating array of any shape.
      block_shape: one entry per dim of ``x``: the block's extent, or None for the whole dim.
      dtype: ``jnp.float8_e4m3fn`` (default) or ``jnp.float8_e5m2``.

    Returns:
      ``(q, scale)``: ``q`` has ``x``'s shape and dtype ``dtype``; ``scale`` is float32 of shape
      :func:`scale_shape`, with ``x ~= dequantize(q, scale, block_shape)``.
    """
    x = jnp.asarray(x)
    _check_dtype(dtype)
    blocks = _block_extents(x.shape, block_shape)
    counts = tuple(math.ceil(dim / block) for dim, block in zip(x.shape, blocks, strict=True))
    padded = jnp.pad(
        jnp.abs(x.astype(jnp.float32)),
        [(0, n * b - dim) for n, b, dim in zip(counts, blocks, x.shape, strict=True)],
    )
    # [n0, b0, n1, b1, ...] -> amax over every b axis.
    split = padded.reshape([size for pair in zip(counts, blocks, strict=True) for size in pair])
    amax = jnp.max(split, axis=tuple(range(1, 2 * x.ndim, 2)))  # block extents are >= 1
    scale = scale_from_amax(amax, dtype)
    scaled = x.astype(jnp.float32) / expand_scale(scale, x.shape, blocks)
    return cast_scaled(scaled, dtype), scale


def dequantize(q: jax.Array, scale: jax.Array, block_shape: BlockShape, dtype=jnp.float32):
    """``q * scale`` with each block's scale, in ``dtype`` (default float32)."""
    q = jnp.asarray(q)
    expected = scale_shape(q.shape, block_shape)
    if tuple(np.shape(scale)) != expected:
        raise ValueError(
            f"dequantize: `scale` must have shape {expected} for q of shape {q.shape} in "
            f"blocks {tuple(block_shape)}; got {np.shape(scale)}. Pass the scale that "
            "quantize() returned with the same block_shape."
        )
    full = expand_scale(jnp.asarray(scale, jnp.float32), q.shape, block_shape)
    return (q.astype(jnp.float32) * full).astype(dtype)
