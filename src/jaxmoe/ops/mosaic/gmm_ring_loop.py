"""The Mosaic ``gmm``'s loop over a CTA's tiles on the hand-written ring (``cfg.ring``).

:func:`.gmm_kernel.mosaic_gmm_body` lays out the kernel (buffers, work list, each tile's
``wgmma`` step and epilogue) and, with ``ring``, hands its scope (:class:`KernelScope`) to
:func:`ring_tiles`: the memory warpgroup loads each unit's K steps (then a cut unit's parts, then
the epilogue operands' steps) into the next free slot of :mod:`.ring`; the compute warpgroups
walk the same units in the same order (docs/kernels.md, 'The operand ring').
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.mosaic import schedule
from jaxmoe.ops.mosaic.persistent_loop import cta_tile_count, cta_tile_index
from jaxmoe.ops.mosaic.ring import ring_consume, ring_produce
from jaxmoe.ops.mosaic.ring_operands import RingOperands
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig
from jaxmoe.ops.mosaic.warpgroups import CLUSTER_AXIS, COMPUTE_REGISTERS, NUM_COMPUTE_WARPGROUPS


@dataclasses.dataclass(frozen=True)
class KernelScope:
    """What the ring loop reads of the kernel body's scope.

    Attributes:
      cfg: the tiles; ``k``: the contraction length; ``wg``: this warpgroup's index.
      pairs: ``(lhs, weights)`` per pair of the K loop (two with ``paired``).
      on_ring: the epilogue operands on the ring (``ring_operands``), or ``None``.
      work: the work list; ``num_n_tiles``: column tiles per work item.
      unit_tile: ``unit -> (group, row0, lo, hi, col0, shared)``.
      rhs_block_source: ``(weights, group, col0) -> `` the column block of one group's weights.
      make_mma: ``(group, row0, col0) -> mma``, one K step's ``wgmma``.
      make_context: ``(group, row0, lo, hi, col0, partial_slot, ring_epilogue) -> context``, the
        tile's main loop and epilogue around ``eval_steps``.
    """

    cfg: MosaicTileConfig
    k: int
    wg: Any
    pairs: list
    paired: bool
    transpose_rhs: bool
    on_ring: RingOperands | None
    work: schedule.WorkList
    num_n_tiles: int
    interpreted: bool
    unit_tile: Callable
    rhs_block_source: Callable
    make_mma: Callable
    make_context: Callable


def copy_weights(cfg: MosaicTileConfig, block, slot_ref, barrier, shared) -> None:
    """Loads a weight block into its ring slot: with ``multicast_weights`` one TMA multicast into
    both CTAs of the cluster where the pair ``shared`` its group, else a CTA's own copy."""
    if not cfg.multicast_weights:
        plgpu.copy_gmem_to_smem(block, slot_ref, barrier)
        return

    # Both CTAs of the cluster take the same branch (``shared`` is the pair's), so
    # each slot's barrier expects one copy of the whole block either way.
    @pl.when(shared)
    def _multicast():
        plgpu.copy_gmem_to_smem(block, slot_ref, barrier, collective_axes=CLUSTER_AXIS)

    @pl.when(jnp.logical_not(shared))
    def _own():
        plgpu.copy_gmem_to_smem(block, slot_ref, barrier)


def ring_tiles(ring, scope: KernelScope) -> None:
    """The CTA's units on :mod:`.ring`'s ring: ``k / bk`` steps each
    (per pair: ``paired`` runs the second pair's steps after the first's), or with
    ``split_last_round`` the whole units, then this CTA's parts of cut units, if any
    (:mod:`.schedule`)."""
    cfg, k, wg, pairs, on_ring = scope.cfg, scope.k, scope.wg, scope.pairs, scope.on_ring
    bm, bk = cfg.block_m, cfg.block_k
    work, num_n_tiles, transpose_rhs = scope.work, scope.num_n_tiles, scope.transpose_rhs
    unit_tile, rhs_block_source = scope.unit_tile, scope.rhs_block_source
    make_mma, make_context = scope.make_mma, scope.make_context
    steps = k // bk
    unit_steps = schedule.unit_steps(k, cfg, scope.paired)
    # The epilogue's steps per tile on the ring, after its K steps (ring_operands).
    epilogue_steps = 0 if on_ring is None else on_ring.steps
    operand_views = ()
    if on_ring is not None:
        ring, operand_views = on_ring.split_ring(ring)
    units = schedule.num_units(work, num_n_tiles, cfg)
    if cfg.split_last_round:
        split = schedule.LastRound.of(units, lax.axis_size("sm"), unit_steps)
        my_whole = cta_tile_count(split.whole_units)
        my_parts = split.parts_of(lax.axis_index("sm"))
    else:
        my_whole = cta_tile_count(units)

    # The whole units (a static K loop), then this CTA's parts of cut units (a dynamic
    # one). Each gives ``(tile, first K step, K steps, workspace slot of a partial
    # sum)``.
    def whole_parts(local_tile):
        return unit_tile(cta_tile_index(local_tile)), 0, unit_steps, None

    def cut_parts(index):
        unit, first_step, count, slot = split.part(lax.axis_index("sm"), index)
        return unit_tile(unit), first_step, count, slot

    def producer_steps(parts):
        def tile_steps(local_tile):
            tile_info, first_step, count, _ = parts(local_tile)
            return (tile_info, first_step), count + epilogue_steps

        return tile_steps

    @pl.when(wg == NUM_COMPUTE_WARPGROUPS)
    def _memory_warpgroup():
        def load_blocks(pair_lhs, pair_rhs, info, i, slot):
            group, row0, _, _, col0, shared = info
            barrier = ring["loaded"].at[slot]
            k_cols = pl.ds(i * bk, bk)
            lhs_block = pair_lhs.at[pl.ds(row0, bm), k_cols]
            plgpu.copy_gmem_to_smem(lhs_block, ring["lhs"].at[slot], barrier)
            for rhs, rhs_ring in zip(pair_rhs, ring["rhs"], strict=True):
                source = rhs_block_source(rhs, group, col0)
                block = source.at[:, k_cols] if transpose_rhs else source.at[k_cols, :]
                copy_weights(cfg, block, rhs_ring.at[slot], barrier, shared)

        def load(info, i, slot):
            info, first_step = info
            i = i + first_step
            if on_ring is not None:

                @pl.when(i < steps)
                def _k_step():
                    load_blocks(*pairs[0], info, i, slot)

                @pl.when(i >= steps)
                def _epilogue_step():
                    _, row0, _, _, col0, _ = info
                    barrier = ring["loaded"].at[slot]
                    on_ring.load(operand_views, row0, col0, i - steps, slot, barrier)

                return
            if len(pairs) == 1:
                load_blocks(*pairs[0], info, i, slot)
                return
            for index, (pair_lhs, pair_rhs) in enumerate(pairs):
                # Each branch issues the same copies into the same slot and barrier.
                @pl.when((i >= index * steps) & (i < (index + 1) * steps))
                def _load_pair(pair_lhs=pair_lhs, pair_rhs=pair_rhs, index=index):
                    load_blocks(pair_lhs, pair_rhs, info, i - index * steps, slot)

        ring_produce(
            my_whole,
            producer_steps(whole_parts),
            load,
            stages=cfg.stages,
            released=ring["released"],
            then=(my_parts, producer_steps(cut_parts)) if cfg.split_last_round else None,
        )

    @pl.when(wg < NUM_COMPUTE_WARPGROUPS)
    def _compute_warpgroups():
        plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")

        def tiles(parts):
            def tile(local_tile, step):
                """One unit or part from global ring step ``step``; the next's."""
                tile_info, first_step, count, partial_slot = parts(local_tile)
                group, row0, lo, hi, col0, _ = tile_info
                mma = make_mma(group, row0, col0)

                def eval_steps(acc):
                    def one_step(i, ring_slot, acc):
                        rhs_smems = [rhs_ring.at[ring_slot] for rhs_ring in ring["rhs"]]
                        lhs_smem = ring["lhs"].at[ring_slot]
                        return mma((first_step + i,), lhs_smem, *rhs_smems, acc)

                    return ring_consume(
                        step,
                        count,
                        one_step,
                        acc,
                        stages=cfg.stages,
                        loaded=ring["loaded"],
                        released=ring["released"],
                    )

                ring_epilogue = None
                if on_ring is not None:
                    ring_epilogue = functools.partial(
                        on_ring.epilogue,
                        views=operand_views,
                        first_step=step + count,
                        wg=wg,
                        loaded=ring["loaded"],
                        released=ring["released"],
                        interpreted=scope.interpreted,
                    )
                make_context(group, row0, lo, hi, col0, partial_slot, ring_epilogue)(eval_steps)
                return step + count + epilogue_steps

            return tile

        step = lax.fori_loop(0, my_whole, tiles(whole_parts), jnp.int32(0))
        if cfg.split_last_round:
            lax.fori_loop(0, my_parts, tiles(cut_parts), step)
