"""What the Mosaic GPU kernels here share: their warpgroup layout and register split, the grid
size (SMs), the interpreter's parameters on a CPU, and the tile order (an L2 swizzle)."""

from __future__ import annotations

import jax

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


# One tile order for every Pallas kernel here (neighbouring tiles share their operands in L2).
swizzle = pallas_triton.swizzle
