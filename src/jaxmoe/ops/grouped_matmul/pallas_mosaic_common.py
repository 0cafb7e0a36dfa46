"""What the Mosaic GPU kernels here share: their warpgroup layout and register split, the grid
size (SMs), the interpreter's parameters on a CPU, and the tile order (an L2 swizzle)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.ops.grouped_matmul import pallas_triton

NUM_COMPUTE_WARPGROUPS = 2
# The memory warpgroup only issues TMA copies; giving it few registers leaves more to the
# compute warpgroups' accumulators (Hopper redistributes registers between warpgroups).
MEMORY_REGISTERS = 40
_H100_SMS = 132


def interpret_params(interpret: bool | None):
    """``None`` on a GPU; Mosaic GPU's interpreter elsewhere (or when asked)."""
    if not pallas_triton._use_interpret(interpret):
        return None
    # Not public API in jax 0.10-0.11; only the tests and CPU users reach this.
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams()


def num_sms(interpret) -> int:
    """The persistent grid's size: one CTA per SM."""
    if interpret is not None:
        return 2  # The interpreter simulates every CTA; two exercise the persistent loop.
    # Lowering for a GPU from a CPU-only host (the tests do) has no GPU to ask: an H100's count.
    return getattr(jax.devices()[0], "core_count", _H100_SMS)


def swizzle(index, num_rows: int, num_cols: int, group: int):
    """Maps a flat index onto (row, col), walking ``group`` rows at a time along the cols."""
    per_band = group * num_cols
    band = index // per_band
    first_row = band * group
    rows_in_band = jnp.minimum(num_rows - first_row, group)
    inner = index % per_band
    return first_row + inner % rows_in_band, inner // rows_in_band
