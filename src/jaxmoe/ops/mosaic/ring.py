"""The shared-memory ring that runs across a CTA's tiles: the memory warpgroup's side
(:func:`ring_produce`), a compute warpgroup's (:func:`ring_consume`) and their barriers."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.mosaic.warpgroups import CLUSTER_AXIS, MEMORY_REGISTERS, NUM_COMPUTE_WARPGROUPS

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
