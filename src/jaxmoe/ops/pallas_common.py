"""What every Pallas kernel here shares, Triton and Mosaic GPU alike: whether it runs in an
interpreter, the operand checks a kernel entry point makes before launching, and the tile order
(an L2 swizzle)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def use_interpret(interpret: bool | None) -> bool:
    """Whether a Pallas kernel runs in its interpreter: ``interpret`` if given, else whenever
    JAX's default backend is not a GPU (the CPU tests)."""
    if interpret is not None:
        return interpret
    return jax.default_backend() != "gpu"


def check_gmm_operands(lhs, rhs, group_sizes, transpose_rhs, what):
    """Raises ValueError unless a ``gmm`` kernel (``what`` names it) can take ``lhs [M, K]``,
    ``rhs [G, K, N]`` (``[G, N, K]`` with ``transpose_rhs``) and ``group_sizes [G]``."""
    if lhs.ndim != 2 or rhs.ndim != 3:
        raise ValueError(f"{what}: `lhs` must be 2-D and `rhs` 3-D; got {lhs.shape}, {rhs.shape}.")
    if group_sizes.shape != (rhs.shape[0],):
        raise ValueError(
            f"{what}: `group_sizes` must have shape ({rhs.shape[0]},); got {group_sizes.shape}."
        )
    contract = rhs.shape[2] if transpose_rhs else rhs.shape[1]
    if lhs.shape[1] != contract:
        raise ValueError(f"{what}: contracting dims differ: `lhs` {lhs.shape}, `rhs` {rhs.shape}.")
    if lhs.dtype != rhs.dtype:
        raise ValueError(f"{what}: `lhs` ({lhs.dtype}) and `rhs` ({rhs.dtype}) dtypes differ.")


def check_tgmm_operands(lhs, rhs, group_sizes) -> None:
    """Raises ValueError unless ``tgmm`` can take ``lhs [M, K]``, ``rhs [M, N]``, ``group_sizes
    [G]`` (every backend's kernel entry point checks this before launching)."""
    if lhs.ndim != 2 or rhs.ndim != 2 or lhs.shape[0] != rhs.shape[0]:
        raise ValueError(
            f"tgmm: `lhs` [M, K] and `rhs` [M, N] expected; got {lhs.shape}, {rhs.shape}."
        )
    if lhs.dtype != rhs.dtype:
        raise ValueError(f"tgmm: `lhs` ({lhs.dtype}) and `rhs` ({rhs.dtype}) dtypes differ.")
    if group_sizes.ndim != 1:
        raise ValueError(f"tgmm: `group_sizes` must be 1-D; got shape {group_sizes.shape}.")


def swizzle(pid, num_rows: int, num_cols: int, group: int):
    """Maps a 1-D program id onto (row, col), walking ``group`` rows at a time along the cols
    (the tile order of every Pallas kernel here, Triton and Mosaic: neighbours share L2)."""
    per_band = group * num_cols
    band = pid // per_band
    first_row = band * group
    rows_in_band = jnp.minimum(num_rows - first_row, group)
    inner = pid % per_band
    return first_row + inner % rows_in_band, inner // rows_in_band
