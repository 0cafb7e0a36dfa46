"""Run a probe script with another register split between the Mosaic kernels' warpgroups.

The kernels give the memory warpgroup ``MEMORY_REGISTERS`` a thread (``setmaxnreg.dec``) and
each compute warpgroup ``COMPUTE_REGISTERS`` (``setmaxnreg.inc``); both are read when a kernel
is traced, so setting them before a probe runs changes every kernel it compiles::

    PYTHONPATH=src python benchmarks/with_register_split.py 24 \\
        benchmarks/ptxas_probe.py --kernel gated

The split must balance: the launch gives each of the three warpgroups 168 a thread (65536
over 384 threads, in steps of 8), so the compute warpgroups' increase must equal what the
memory one gives back, or their ``setmaxnreg.inc`` waits for registers that never come (a
hang). 40 / 232 (the default, as CUTLASS's) and 24 / 240 (as FlashAttention 3's) balance.
"""

from __future__ import annotations

import runpy
import sys

from jaxmoe.ops.grouped_matmul import pallas_mosaic_common as common

LAUNCH_REGISTERS = 168  # 65536 registers over 3 warpgroups of 128 threads, a multiple of 8


def balanced_split(memory_registers: int) -> int:
    """The compute warpgroups' registers a thread when the memory one keeps
    ``memory_registers``; ``ValueError`` where no multiple of 8 balances it."""
    freed = LAUNCH_REGISTERS - memory_registers
    compute = LAUNCH_REGISTERS + freed // common.NUM_COMPUTE_WARPGROUPS
    if memory_registers % 8 or freed % (8 * common.NUM_COMPUTE_WARPGROUPS) or compute > 256:
        raise ValueError(
            f"memory_registers={memory_registers} leaves no balanced split (the compute "
            "warpgroups' increase must equal what it gives back, in steps of 8, at most 256): "
            "pass 40 or 24."
        )
    return compute


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: with_register_split.py MEMORY_REGISTERS SCRIPT [ARGS...]")
    memory_registers = int(sys.argv[1])
    common.MEMORY_REGISTERS = memory_registers
    common.COMPUTE_REGISTERS = balanced_split(memory_registers)
    print(
        f"register split: memory {common.MEMORY_REGISTERS}, compute {common.COMPUTE_REGISTERS}",
        flush=True,
    )
    script, *args = sys.argv[2:]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
