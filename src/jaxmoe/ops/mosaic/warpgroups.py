"""The warpgroups of a Mosaic GPU kernel here: two compute warpgroups and one memory
warpgroup per CTA, their register split, how the compute ones share a tile, and the cluster of
two CTAs the multicasting kernels run in."""

from __future__ import annotations

from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

NUM_COMPUTE_WARPGROUPS = 2
# A warpgroup's result is staged in shared memory at most this many columns at a time (a wider
# one, rows split between the warpgroups at 256 columns, in parts), so that the staging buffers
# leave room for a fourth ring slot.
STAGE_MAX_COLS = 128
# The memory warpgroup only issues TMA copies; giving it few registers leaves more to the
# compute warpgroups' accumulators (Hopper redistributes registers between warpgroups).
MEMORY_REGISTERS = 40
# The compute warpgroups' share next to it (as jax's pipeline splits them: the 512 per thread of
# one warpgroup, less the memory one's, halved, at most 256, a multiple of 8).
COMPUTE_REGISTERS = min(256, (512 - MEMORY_REGISTERS) // NUM_COMPUTE_WARPGROUPS // 8 * 8)
# The cluster axis of a kernel launched with ``cluster_ctas=2``
# (:func:`.persistent_loop.persistent_kernel`): its two CTAs run on neighbouring SMs and can
# multicast a TMA copy into both shared memories.
CLUSTER_AXIS = "cluster"
# The CTAs of a cluster in the kernels that multicast an operand (the gmm's weights, the
# wgrad's ``rhs``): two, CUTLASS's 2x1 cluster.
MULTICAST_CLUSTER_CTAS = 2


def warpgroup_share(rows: int, cols: int, split_rows: bool) -> tuple[int, int]:
    """The ``(rows, columns)`` of a ``rows x cols`` tile that one of the two compute warpgroups
    multiplies when they share it: half the rows (``split_rows``), or half the columns."""
    if split_rows:
        return rows // NUM_COMPUTE_WARPGROUPS, cols
    return rows, cols // NUM_COMPUTE_WARPGROUPS


def split_warpgroups(memory, compute) -> None:
    """Inside a CTA of :func:`.persistent_loop.persistent_kernel`: the memory warpgroup (the
    last) runs ``memory()`` (its :func:`.ring.ring_produce`), each compute warpgroup
    ``compute(wg)`` with the larger register share."""
    wg = lax.axis_index("wg")

    @pl.when(wg == NUM_COMPUTE_WARPGROUPS)
    def _memory_warpgroup():
        memory()

    @pl.when(wg < NUM_COMPUTE_WARPGROUPS)
    def _compute_warpgroups():
        plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
        compute(wg)
