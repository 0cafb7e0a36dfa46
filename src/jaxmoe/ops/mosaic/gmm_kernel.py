"""The Mosaic GPU ``gmm`` kernel body: a persistent, warp-specialized grouped matmul on Hopper.

Launched by :func:`.launch.launch_gmm`, which builds the work list. What the kernel computes
besides ``lhs @ rhs[g]`` is a :class:`.variant.GmmVariant`; the body splits along it and reads
top to bottom:

- :class:`GmmRefs`: the operand refs as the variant lays them out;
- :func:`operand_buffers`: the K loop's shared-memory buffers (the hand-written ring, or jax's
  pipeline), then per CTA, in one scope (:func:`cta_scope`):
- :func:`zero_tail`: rows past ``sum(group_sizes)`` written as zeros;
- the tiles, on the ring (:func:`.gmm_ring_loop.ring_tiles`) or in jax's pipeline
  (:func:`pipelined_tiles`); each tile's K step is :func:`tile_mma`, its main loop and
  epilogue :func:`tile_context`.

How it is built (work list, persistent loop, warpgroups, ring, epilogue, the variants' hooks):
docs/kernels.md, 'How the kernels are built'.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.mosaic import gmm_ring_loop, schedule
from jaxmoe.ops.mosaic.epilogue import EpilogueStores, epilogue_allocation
from jaxmoe.ops.mosaic.persistent_loop import cta_tile_count, cta_tile_index
from jaxmoe.ops.mosaic.ring import ring_barriers
from jaxmoe.ops.mosaic.ring_operands import RingOperands
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, swizzle_transforms, warpgroup_tile
from jaxmoe.ops.mosaic.variant import GmmVariant
from jaxmoe.ops.mosaic.warpgroups import (
    CLUSTER_AXIS,
    MEMORY_REGISTERS,
    MULTICAST_CLUSTER_CTAS,
    NUM_COMPUTE_WARPGROUPS,
)


@dataclasses.dataclass(frozen=True)
class GmmRefs:
    """The kernel's GPU memory refs, in the launcher's order: the work list, ``lhs``, the
    ``num_rhs`` weights, the second pair (``paired``), the epilogue's operands, the results,
    the last round's workspace (``split_last_round``: ``[slots * cluster CTAs, bm, bn]``
    float32)."""

    work_counts: Any
    work_group: Any
    work_first_row: Any
    offsets: Any
    lhs: Any
    rhs: tuple
    pairs: list  # (lhs, weights) per pair of the K loop
    epilogue: tuple
    outs: tuple
    workspace: Any

    @classmethod
    def unpack(cls, refs, variant: GmmVariant, cfg: MosaicTileConfig) -> GmmRefs:
        work_counts, work_group, work_first_row, offsets, lhs, *rest = refs
        num_rhs = variant.num_rhs
        rhs = tuple(rest[:num_rhs])
        pairs = [(lhs, rhs)]
        if variant.paired:
            lhs2, rhs2 = rest[num_rhs : num_rhs + 2]
            pairs.append((lhs2, (rhs2,)))
        num_out_refs = variant.num_outputs + cfg.split_last_round
        return cls(
            work_counts,
            work_group,
            work_first_row,
            offsets,
            lhs,
            rhs,
            pairs,
            epilogue=tuple(rest[num_rhs + 2 * variant.paired : -num_out_refs]),
            outs=tuple(rest[-num_out_refs:][: variant.num_outputs]),
            workspace=rest[-1] if cfg.split_last_round else None,
        )


@dataclasses.dataclass(frozen=True)
class GmmLayout:
    """The kernel's static layout: tiles, variant, operand orientation and shared-memory
    transforms, and the epilogue operands on the ring (``ring_operands``) or ``None``."""

    cfg: MosaicTileConfig
    variant: GmmVariant
    transpose_rhs: bool
    num_groups: int
    interpreted: bool
    transforms: tuple
    on_ring: RingOperands | None

    def rhs_block_source(self, rhs_gmem, group, col0):
        """The ``block_n`` columns of ``rhs[group]`` from ``col0`` (rows, when transposed)."""
        rhs_g = rhs_gmem.at[group]
        bn = self.cfg.block_n
        return rhs_g.at[pl.ds(col0, bn), :] if self.transpose_rhs else rhs_g.at[:, pl.ds(col0, bn)]

    def jax_pipeline(self, k: int, body, context, state=None):
        """jax's warp-specialized pipeline over ``k / bk`` steps (tiles off the ring)."""
        bm, bn, bk = self.cfg.block_m, self.cfg.block_n, self.cfg.block_k
        lhs_spec = plgpu.BlockSpec((bm, bk), lambda kk: (0, kk), transforms=self.transforms)
        if self.transpose_rhs:
            rhs_spec = plgpu.BlockSpec((bn, bk), lambda kk: (0, kk), transforms=self.transforms)
        else:
            rhs_spec = plgpu.BlockSpec((bk, bn), lambda kk: (kk, 0), transforms=self.transforms)
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k // bk,),
            memory_registers=MEMORY_REGISTERS,
            in_specs=[lhs_spec] + [rhs_spec] * self.variant.num_rhs,
            wg_axis="wg",
            num_compute_wgs=NUM_COMPUTE_WARPGROUPS,
            max_concurrent_steps=self.cfg.stages,
            compute_context=context,
            pipeline_state=state,
        )


@dataclasses.dataclass(frozen=True)
class CtaScope:
    """What a tile's K step and epilogue read inside a CTA's scope: the layout and refs, the
    warpgroup's epilogue stores, its first row and column in a tile, its CTA in the cluster."""

    layout: GmmLayout
    refs: GmmRefs
    stores: EpilogueStores
    wg_row: Any
    wg_col: Any
    cluster_cta: Any


def mosaic_gmm_body(
    *refs,
    cfg: MosaicTileConfig,
    num_groups: int,
    transpose_rhs: bool,
    variant: GmmVariant,
    interpreted: bool = False,
):
    """The kernel of :func:`.launch.launch_gmm`: ``refs`` as :class:`GmmRefs` lays them out."""
    refs = GmmRefs.unpack(refs, variant, cfg)
    itemsize = jnp.dtype(refs.lhs.dtype).itemsize
    transforms = swizzle_transforms(cfg.block_k * itemsize, itemsize)
    on_ring = RingOperands(cfg, refs.epilogue, transforms) if variant.ring_operands else None
    layout = GmmLayout(cfg, variant, transpose_rhs, num_groups, interpreted, transforms, on_ring)
    # Results stored a run of columns at a time (ring_operands) are staged that wide.
    slab_cols = None if on_ring is None else on_ring.apply_cols
    pl.run_scoped(
        functools.partial(cta_scope, layout, refs, slab_cols),
        pipeline_allocs=operand_buffers(layout, refs),
        out_smem=epilogue_allocation(cfg, refs.outs[0].dtype, interpreted, slab_cols),
        collective_axes="wg",
    )


def operand_buffers(layout: GmmLayout, refs: GmmRefs):
    """The K loop's shared-memory buffers: on the ring, ``stages`` slots of lhs and of each
    weight (with ``ring_operands`` also viewed as the epilogue operands' blocks) and their
    barriers; off it, jax's pipeline's own."""
    cfg, transforms = layout.cfg, layout.transforms
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if not cfg.ring:

        def unused(*args, **kwargs):
            del args, kwargs

        return layout.jax_pipeline(refs.lhs.shape[1], unused, unused).get_allocations(
            refs.lhs.at[pl.ds(0, bm), :],
            *(layout.rhs_block_source(rhs, 0, 0) for rhs in refs.rhs),
        )
    rhs_block = (bn, bk) if layout.transpose_rhs else (bk, bn)
    lhs_alloc = plgpu.SMEM((cfg.stages, bm, bk), refs.lhs.dtype, transforms=transforms)
    rhs_allocs = [
        plgpu.SMEM((cfg.stages, *rhs_block), rhs.dtype, transforms=transforms) for rhs in refs.rhs
    ]
    if layout.on_ring is not None:  # each buffer also viewed as one operand's blocks
        lhs_alloc, rhs_allocs[0] = layout.on_ring.allocations(
            lhs_alloc, rhs_allocs[0], interpreted=layout.interpreted
        )
    return {
        "lhs": lhs_alloc,
        "rhs": rhs_allocs,
        # The interpreter has no cluster barriers (and runs a multicast copy as a local copy of
        # the whole block, so a CTA's own releases suffice there).
        **ring_barriers(
            cfg.stages,
            copies_per_step=1 + layout.variant.num_rhs,
            cluster_wide=cfg.multicast_weights and not layout.interpreted,
        ),
    }


def cta_scope(layout: GmmLayout, refs: GmmRefs, slab_cols, pipeline_allocs, out_smem):
    """One CTA's kernel: the tail's zeros, then its tiles, then the drain of its stores."""
    cfg = layout.cfg
    wg_m, wg_n = warpgroup_tile(cfg)
    wg = lax.axis_index("wg")
    # A compute warpgroup's first row and column in its tile: the two split the rows or the
    # columns.
    wg_row = wg * wg_m if cfg.split_rows else 0
    wg_col = 0 if cfg.split_rows else wg * wg_n
    stores = EpilogueStores(
        cfg, out_smem, refs.outs, wg=wg, wg_row=wg_row, wg_col=wg_col, slab_cols=slab_cols
    )
    num_compute_work = refs.work_counts[0]
    # Read here, not in the loops: Mosaic GPU's interpreter (jax 0.10) resolves a cluster axis
    # index only outside them.
    cluster_cta = lax.axis_index(CLUSTER_AXIS) if cfg.multicast_weights else 0
    num_tail_work = refs.work_counts[1]
    work = schedule.WorkList(
        refs.work_group,
        refs.work_first_row,
        refs.offsets,
        num_compute_work,
        num_groups=layout.num_groups,
        num_rows=refs.lhs.shape[0],
    )
    num_n_tiles = refs.outs[0].shape[1] // cfg.block_n
    scope = CtaScope(layout, refs, stores, wg_row, wg_col, cluster_cta)

    @pl.when(wg < NUM_COMPUTE_WARPGROUPS)
    def _zero_tail():
        zero_tail(scope, work, num_compute_work, num_tail_work, num_n_tiles)

    num_tiles = num_compute_work * num_n_tiles

    def unit_tile(unit):
        return schedule.unit_tile(work, unit, cluster_cta, num_n_tiles, cfg)

    if cfg.ring:
        gmm_ring_loop.ring_tiles(
            pipeline_allocs,
            gmm_ring_loop.KernelScope(
                cfg=cfg,
                k=refs.lhs.shape[1],
                wg=wg,
                pairs=refs.pairs,
                paired=layout.variant.paired,
                transpose_rhs=layout.transpose_rhs,
                on_ring=layout.on_ring,
                work=work,
                num_n_tiles=num_n_tiles,
                interpreted=layout.interpreted,
                unit_tile=unit_tile,
                rhs_block_source=layout.rhs_block_source,
                make_mma=functools.partial(tile_mma, scope),
                make_context=functools.partial(tile_context, scope),
            ),
        )
    else:
        pipelined_tiles(scope, pipeline_allocs, num_tiles, unit_tile)

    @pl.when(wg < NUM_COMPUTE_WARPGROUPS)
    def _drain():
        plgpu.wait_smem_to_gmem(0)


def zero_tail(scope: CtaScope, work, num_compute_work, num_tail_work, num_n_tiles: int):
    """Rows at or past ``sum(group_sizes)`` written as zeros (GPU memory is uninitialised):
    the tail's work items, after the compute items, each CTA its own tiles (also the two of a
    cluster)."""
    cfg, stores = scope.layout.cfg, scope.stores
    _, wg_n = warpgroup_tile(cfg)
    per_cta = cfg.multicast_weights
    num_outputs = scope.layout.variant.num_outputs
    out_dtype = scope.refs.outs[0].dtype

    @pl.loop(0, cta_tile_count(num_tail_work * num_n_tiles, per_cta=per_cta))
    def _tail_loop(local_tile):
        index = cta_tile_index(local_tile, per_cta=per_cta)
        _, row0, lo, hi = schedule.item_rows(work, num_compute_work + index // num_n_tiles, cfg)
        col0 = (index % num_n_tiles) * cfg.block_n
        zeros = (jnp.zeros((stores.stage_rows, wg_n), out_dtype),) * num_outputs
        stores.store(lambda first_row: zeros, row0, col0, lo, hi)  # each its half


def tile_context(scope: CtaScope, group, row0, lo, hi, col0, partial_slot=None, ring_epilogue=None):
    """The tile's main loop and epilogue, as a ``context(eval_pipeline)``. For a part of a cut
    unit the accumulator goes to workspace slot ``partial_slot`` instead; ``ring_epilogue(acc,
    apply=)``: the epilogue's steps on the ring (``ring_operands``:
    :meth:`RingOperands.epilogue`)."""
    layout, refs, stores = scope.layout, scope.refs, scope.stores
    cfg, variant = layout.cfg, layout.variant
    wg_m, wg_n = warpgroup_tile(cfg)

    def store_result(acc):
        slab_results = stores.epilogue_slabs(
            variant.epilogue, refs.epilogue, acc, group, row0, col0
        )
        stores.store(slab_results, row0, col0, lo, hi)

    def context(eval_pipeline):
        if variant.k_step_scale is not None:  # the main accumulator is the pipeline's carry
            store_result(eval_pipeline(jnp.zeros((wg_m, wg_n), jnp.float32)))
            return

        def acc_scope(*acc_refs):
            # The scopes name the regions of Mosaic GPU's on-device profiler (when a kernel is
            # compiled with a profile_space; otherwise they cost nothing).
            with jax.named_scope("main_loop"):
                eval_pipeline(acc_refs)
            with jax.named_scope("epilogue"):
                accs = [acc_ref[...] for acc_ref in acc_refs]
                if variant.combine is not None:
                    stores.store(stores.slabs_of(variant.combine(*accs)), row0, col0, lo, hi)
                    return
                (acc,) = accs
                if ring_epilogue is not None:
                    apply = layout.on_ring.store_columns(
                        stores, variant.epilogue, group, row0, lo, hi, col0
                    )
                    ring_epilogue(acc, apply=apply)
                elif partial_slot is None:
                    store_result(acc)
                else:
                    ctas = MULTICAST_CLUSTER_CTAS if cfg.multicast_weights else 1
                    workspace_tile = refs.workspace.at[partial_slot * ctas + scope.cluster_cta]
                    stores.store_partial(acc, workspace_tile)

        pl.run_scoped(acc_scope, *[plgpu.ACC((wg_m, wg_n), jnp.float32)] * variant.num_rhs)

    return context


def warpgroup_operands(scope: CtaScope, lhs_smem, rhs_smems):
    """This compute warpgroup's share of a K step's blocks: its rows of ``lhs`` (``split_rows``)
    and its columns of each weight block, read K-major when the weights are transposed."""
    layout, cfg = scope.layout, scope.layout.cfg
    wg_m, wg_n = warpgroup_tile(cfg)
    wg_rows, wg_cols = pl.ds(scope.wg_row, wg_m), pl.ds(scope.wg_col, wg_n)
    lhs_smem = lhs_smem.at[wg_rows] if cfg.split_rows else lhs_smem
    rhs_blocks = [
        plgpu.transpose_ref(rhs_smem.at[wg_cols, :], (1, 0))
        if layout.transpose_rhs
        else rhs_smem.at[:, wg_cols]
        for rhs_smem in rhs_smems
    ]
    return lhs_smem, rhs_blocks


def scaled_step(scope: CtaScope, group, row0, col0, k_step, lhs_block, rhs_block, acc):
    """One K step under ``k_step_scale`` (DeepSeek-V3's promotion): the step's product into a
    fresh float32 accumulator, then ``acc + product * scales[:, None]``. The scales are loaded
    while the ``wgmma`` runs, before the wait: 1.07-1.35x the kernel that loaded them after it
    (docs/kernels.md, 'FP8 grouped matmul (Mosaic)')."""
    wg_m, wg_n = warpgroup_tile(scope.layout.cfg)

    def step_product(partial_ref):
        plgpu.wgmma(partial_ref, lhs_block, rhs_block)
        scales = scope.layout.variant.k_step_scale(
            *scope.refs.epilogue,
            k_step=k_step,
            group=group,
            row0=row0 + scope.wg_row,
            col0=col0 + scope.wg_col,
            rows=wg_m,
            cols=wg_n,
        )
        product = plgpu.wgmma_accumulator_load(partial_ref, wait_n=0)
        return acc + product * lax.broadcast_in_dim(scales, product.shape, [0])

    return pl.run_scoped(step_product, plgpu.ACC((wg_m, wg_n), jnp.float32))


def tile_mma(scope: CtaScope, group, row0, col0):
    """One K step's ``wgmma`` (per rhs), as ``mma(indices, lhs_smem, *rhs_smems, acc)``. On the
    ring they stay in flight (the ring waits); in jax's pipeline the step waits for them. With
    ``k_step_scale`` each step is :func:`scaled_step`, which waits for its own ``wgmma``."""
    cfg = scope.layout.cfg

    def mma(indices, lhs_smem, *rhs_smems_and_accs):
        *rhs_smems, acc_refs = rhs_smems_and_accs
        lhs_block, rhs_blocks = warpgroup_operands(scope, lhs_smem, rhs_smems)
        if scope.layout.variant.k_step_scale is not None:  # acc_refs: the carried float32 sum
            (k_step,) = indices
            return scaled_step(scope, group, row0, col0, k_step, lhs_block, rhs_blocks[0], acc_refs)
        for rhs_block, acc_ref in zip(rhs_blocks, acc_refs, strict=True):
            plgpu.wgmma(acc_ref, lhs_block, rhs_block)
        if not cfg.ring:
            plgpu.wgmma_wait(0)
        return acc_refs

    return mma


def pipelined_tiles(scope: CtaScope, pipeline_allocs, num_tiles, unit_tile) -> None:
    """The tiles off the ring, in jax's pipeline: the compute work items, which come first in
    the work list, one pipeline each, or one pipeline across the CTA's tiles (``chained``)."""
    layout, refs = scope.layout, scope.refs
    cfg = layout.cfg
    k = refs.lhs.shape[1]
    chained = chains_tiles(cfg, k)

    @plgpu.nd_loop((num_tiles,), collective_axes="sm")
    def _tile_loop(loop_info):
        (index,) = loop_info.index
        group, row0, lo, hi, col0, _ = unit_tile(index)
        context = tile_context(scope, group, row0, lo, hi, col0)
        mma = tile_mma(scope, group, row0, col0)
        operands = (
            refs.lhs.at[pl.ds(row0, cfg.block_m), :],
            *(layout.rhs_block_source(rhs, group, col0) for rhs in refs.rhs),
        )
        if not chained:
            layout.jax_pipeline(k, mma, context)(*operands, allocations=pipeline_allocs)
            return
        # One pipeline across this CTA's tiles: the memory warpgroup loads the next tile while
        # the compute warpgroups finish this one (no drain between tiles).
        local, count = loop_info.local_index, loop_info.num_local_steps
        state = jnp.where(local == 0, plgpu.PipelinePipeline.START, plgpu.PipelinePipeline.STEADY)
        state = jnp.where(local == count - 1, plgpu.PipelinePipeline.STOP, state)

        @pl.when(count == 1)  # START and STOP at once: a plain pipeline.
        def _single():
            layout.jax_pipeline(k, mma, context)(*operands, allocations=pipeline_allocs)

        @pl.when(count > 1)
        def _chain():
            layout.jax_pipeline(k, mma, context, state)(*operands, allocations=pipeline_allocs)


def chains_tiles(cfg: MosaicTileConfig, k: int) -> bool:
    # jax's pipeline of pipelines needs the K loop to be a whole number of ring turns.
    return cfg.pipelined_tiles and (k // cfg.block_k) % cfg.stages == 0
