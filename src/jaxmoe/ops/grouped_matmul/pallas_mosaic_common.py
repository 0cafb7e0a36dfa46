"""What the Mosaic GPU kernels here share: their warpgroup layout and register split, the grid
size (SMs), the interpreter's parameters on a CPU, the tile order (an L2 swizzle), and the
shared-memory ring that runs across a CTA's tiles (:func:`ring_produce`, :func:`ring_consume`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.grouped_matmul import pallas_triton

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
_H100_SMS = 132


def warpgroup_share(rows: int, cols: int, split_rows: bool) -> tuple[int, int]:
    """The ``(rows, columns)`` of a ``rows x cols`` tile that one of the two compute warpgroups
    multiplies when they share it: half the rows (``split_rows``), or half the columns."""
    if split_rows:
        return rows // NUM_COMPUTE_WARPGROUPS, cols
    return rows, cols // NUM_COMPUTE_WARPGROUPS


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


# --- A shared-memory ring across a CTA's tiles -------------------------------------------------
#
# The memory warpgroup and the compute warpgroups walk the same (tile, step) sequence; a global
# step counter ``step`` (all earlier tiles' steps plus this one's) names the slot ``step %
# stages``. ``loaded[slot]`` completes when the slot's TMA copies have landed; ``released[slot]``
# when both compute warpgroups are done reading it. So the next tile's first blocks load while
# this tile finishes its last ``wgmma`` and its epilogue (jax's warp-specialized pipeline drains
# at each tile's end, and its pipeline of pipelines takes no dynamic step count).


def ring_produce(num_tiles, tile_steps, load, *, stages: int, released, then=None) -> None:
    """The memory warpgroup's side: for each of the CTA's ``num_tiles`` tiles, ``info, count =
    tile_steps(t)`` (``count >= 0`` steps: a tile of none loads nothing), then for each step
    waits until the slot is released and calls ``load(info, i, slot)`` to start its TMA copies
    (each arriving on the slot's ``loaded`` barrier); at the end, waits for the last slots'
    releases. ``then``: a second ``(num_tiles, tile_steps)`` loop after the first, on the same
    ring (the compute side runs the same two loops)."""
    plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")

    def tiles(tile_steps):
        def tile(t, step):
            info, count = tile_steps(t)

            def one(i, step):
                slot = lax.rem(step, stages)

                @pl.when(step >= stages)
                def _wait_released():
                    plgpu.barrier_wait(released.at[slot])

                load(info, i, slot)
                return step + 1

            return lax.fori_loop(0, count, one, step)

        return tile

    steps = lax.fori_loop(0, num_tiles, tiles(tile_steps), jnp.int32(0))
    if then is not None:
        steps = lax.fori_loop(0, then[0], tiles(then[1]), steps)

    # Observe the last slots' releases too, so that every barrier ends each phase it began
    # (the kernel ends after the compute warpgroups' last release; Mosaic GPU's interpreter
    # checks that no phase of a barrier goes unobserved).
    @pl.loop(jnp.maximum(steps - stages, 0), steps)
    def _observe_last_releases(step):
        plgpu.barrier_wait(released.at[lax.rem(step, stages)])


def ring_consume(step, count, mma, carry, *, stages: int, loaded, released):
    """A compute warpgroup's side for one tile of ``count >= 1`` steps from global ``step``:
    waits for each slot's loads, ``carry = mma(i, slot, carry)`` issues the step's ``wgmma``
    (without waiting), keeps one ``wgmma`` in flight and releases each slot one step late.
    Returns ``carry`` once the tile's ``wgmma`` are done and all its slots released."""

    def one(i, state):
        step, carry = state
        slot = lax.rem(step, stages)
        plgpu.barrier_wait(loaded.at[slot])
        carry = mma(i, slot, carry)
        plgpu.wgmma_wait(1)  # the previous step's wgmma is done: its slot can go

        @pl.when(i > 0)
        def _release_previous():
            plgpu.barrier_arrive(released.at[lax.rem(step + stages - 1, stages)])

        return step + 1, carry

    step, carry = lax.fori_loop(0, count, one, (step, carry))
    plgpu.wgmma_wait(0)
    plgpu.barrier_arrive(released.at[lax.rem(step + stages - 1, stages)])
    return carry


def split_warpgroups(memory, compute) -> None:
    """Inside a CTA of :func:`persistent_kernel`: the memory warpgroup (the last) runs
    ``memory()`` (its :func:`ring_produce`), each compute warpgroup ``compute(wg)`` with the
    larger register share."""
    wg = lax.axis_index("wg")

    @pl.when(wg == NUM_COMPUTE_WARPGROUPS)
    def _memory_warpgroup():
        memory()

    @pl.when(wg < NUM_COMPUTE_WARPGROUPS)
    def _compute_warpgroups():
        plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
        compute(wg)


def ring_barriers(stages: int, copies_per_step: int, *, cluster_wide: bool = False) -> dict:
    """``loaded`` (one arrival per TMA copy of a step) and ``released`` (one per compute
    warpgroup) barriers, ``stages`` of each, for ``pl.run_scoped``.

    ``cluster_wide``: ``released`` is a cluster barrier (axis ``CLUSTER_AXIS``): each release
    arrives in both CTAs of the cluster, so a memory warpgroup reuses a slot only once both
    CTAs are done with it, as a copy multicast into the partner's slot needs."""
    if cluster_wide:
        released = plgpu.ClusterBarrier(
            collective_axes=(CLUSTER_AXIS,),
            num_arrivals=NUM_COMPUTE_WARPGROUPS,
            num_barriers=stages,
        )
    else:
        released = plgpu.Barrier(num_arrivals=NUM_COMPUTE_WARPGROUPS, num_barriers=stages)
    return {
        "loaded": plgpu.Barrier(num_arrivals=copies_per_step, num_barriers=stages),
        "released": released,
    }


# The cluster axis of a kernel launched with ``cluster_ctas=2`` (:func:`persistent_kernel`):
# its two CTAs run on neighbouring SMs and can multicast a TMA copy into both shared memories.
CLUSTER_AXIS = "cluster"
# The CTAs of a cluster in the kernels that multicast an operand (the gmm's weights, the
# wgrad's ``rhs``): two, CUTLASS's 2x1 cluster.
MULTICAST_CLUSTER_CTAS = 2


def persistent_kernel(
    body, out_type, interpret_params, *, cluster_ctas: int = 1, approx_math: bool = False
):
    """``body`` as a persistent kernel: one CTA per SM, the compute warpgroups and the memory one
    (thread axis ``"wg"``), warpgroup lowering semantics; ``approx_math``: Mosaic GPU's
    approximate transcendental instructions (``MosaicTileConfig.approx_math``).

    The grid axis ``"sm"`` numbers the CTAs, or with ``cluster_ctas=2`` the clusters of two CTAs
    (each CTA's place in its cluster: axis ``CLUSTER_AXIS``)."""
    clusters = {}
    if cluster_ctas > 1:
        clusters = dict(cluster=(cluster_ctas,), cluster_names=(CLUSTER_AXIS,))
    return plgpu.kernel(
        body,
        out_type=out_type,
        grid=(grid_size(interpret_params, cluster_ctas),),
        grid_names=("sm",),
        **clusters,
        num_threads=NUM_COMPUTE_WARPGROUPS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup, approx_math=approx_math
        ),
        interpret=interpret_params,
    )


def grid_size(interpret_params, cluster_ctas: int = 1) -> int:
    """The persistent grid's workers: one CTA per SM, or one cluster per ``cluster_ctas``."""
    return max(num_sms(interpret_params) // cluster_ctas, 1)


def _worker(per_cta: bool):
    """``(index, count)`` of the workers sharing a loop: the grid's (CTAs, or clusters whose
    two CTAs take the same items), or with ``per_cta`` every CTA of a clustered grid."""
    index, count = lax.axis_index("sm"), lax.axis_size("sm")
    if per_cta:
        ctas = lax.axis_size(CLUSTER_AXIS)
        index, count = index * ctas + lax.axis_index(CLUSTER_AXIS), count * ctas
    return index, count


def round_robin_count(num_items, worker, num_workers):
    """How many of ``num_items`` items dealt round-robin to ``num_workers`` workers (items
    ``worker``, ``worker + num_workers``, ...) worker ``worker`` takes."""
    return jnp.maximum(num_items - worker + num_workers - 1, 0) // num_workers


def round_robin_index(local_item, worker, num_workers):
    """The global index of worker ``worker``'s ``local_item``-th item (as
    :func:`round_robin_count` deals them)."""
    return worker + local_item * num_workers


def cta_tile_count(num_tiles, *, per_cta: bool = False):
    """How many of ``num_tiles`` tiles (round-robin over the grid's CTAs or clusters; over all
    CTAs with ``per_cta``, in a clustered grid) this CTA takes."""
    return round_robin_count(num_tiles, *_worker(per_cta))


def cta_tile_index(local_tile, *, per_cta: bool = False):
    """The global index of this CTA's ``local_tile``-th tile (round-robin, as
    :func:`cta_tile_count`)."""
    return round_robin_index(local_tile, *_worker(per_cta))
