"""MXFP4 (OCP Microscaling, FP4 E2M1 elements) dequantization, as gpt-oss's Hub checkpoints
store their expert weights.

The format: a row of ``N`` values is cut into blocks of 32 along the row. Each value is an FP4
E2M1 code (1 sign bit, 2 exponent bits, 1 mantissa bit: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6),
two codes packed per byte, the even element of the pair in the low nibble and the odd one in the
high nibble; each block shares one E8M0 scale byte ``s`` (a power of two, ``2 ** (s - 127)``;
``s = 255`` is NaN). Stored as ``{name}_blocks`` ``[..., rows, N / 32, 16]`` (uint8) and
``{name}_scales`` ``[..., rows, N / 32]`` (uint8).

Every such value is exact in float32 (and in bfloat16), so dequantizing loses nothing.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32  # values per shared scale
SCALE_BIAS = 127  # E8M0: scale byte s means 2 ** (s - 127)
SCALE_NAN = 255  # E8M0's NaN
# FP4 E2M1 code -> value (code bit 3 is the sign).
E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray, name: str = "tensor") -> np.ndarray:
    """MXFP4 ``blocks`` ``[..., G, 16]`` and ``scales`` ``[..., G]`` as float32 ``[..., G * 32]``.

    Raises:
      ValueError: the shapes or dtypes are not MXFP4's, or a scale byte is 255 (NaN in E8M0,
        which no trained weight holds: the checkpoint is damaged).
    """
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    if (
        blocks.dtype != np.uint8
        or scales.dtype != np.uint8
        or blocks.shape[-1:] != (BLOCK // 2,)
        or blocks.shape[:-1] != scales.shape
    ):
        raise ValueError(
            f"jaxmoe.hf: the MXFP4 {name} must be uint8 blocks [..., G, {BLOCK // 2}] with uint8 "
            f"scales [..., G]; got blocks {blocks.dtype} {list(blocks.shape)} and scales "
            f"{scales.dtype} {list(scales.shape)}. The checkpoint's *_blocks / *_scales tensors "
            "are not MXFP4."
        )
    if np.any(scales == SCALE_NAN):
        raise ValueError(
            f"jaxmoe.hf: the MXFP4 {name} has scale byte {SCALE_NAN} (NaN in E8M0); a trained "
            "weight never has one. The checkpoint is damaged: download it again."
        )
    pairs = np.stack([E2M1_VALUES[blocks & 0x0F], E2M1_VALUES[blocks >> 4]], axis=-1)
    values = pairs.reshape(*blocks.shape[:-1], BLOCK)  # element 2j low nibble, 2j + 1 high
    exponents = scales.astype(np.int32)[..., None] - SCALE_BIAS
    return np.ldexp(values, exponents).reshape(*blocks.shape[:-2], -1)


__all__ = ["BLOCK", "E2M1_VALUES", "dequantize_mxfp4"]
