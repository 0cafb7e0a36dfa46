"""The Mosaic GPU ``gmm`` kernel body: a persistent, warp-specialized grouped matmul on Hopper.

Launched by :func:`.launch.launch_gmm`, which builds the work list. How it is built (work list,
persistent loop, warpgroups, ring, epilogue, the hooks the gated and FP8 kernels use):
docs/kernels.md, 'How the kernels are built'.
"""

from __future__ import annotations

import functools

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
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, warpgroup_tile
from jaxmoe.ops.mosaic.warpgroups import (
    CLUSTER_AXIS,
    MEMORY_REGISTERS,
    MULTICAST_CLUSTER_CTAS,
    NUM_COMPUTE_WARPGROUPS,
)


def mosaic_gmm_body(
    work_counts_gmem,
    work_group_gmem,
    work_first_row_gmem,
    offsets_gmem,
    lhs_gmem,
    *rhs_epilogue_and_out_gmem,
    cfg: MosaicTileConfig,
    num_groups: int,
    transpose_rhs: bool,
    epilogue=None,
    num_rhs: int = 1,
    combine=None,
    num_outputs: int = 1,
    k_step_scale=None,
    paired: bool = False,
    ring_operands: bool = False,
    interpreted: bool = False,
):
    # ``paired``: a second ``(lhs, rhs)`` pair follows the rhs operands, of the same shapes, and
    # the result is ``lhs @ rhs[g] + lhs2 @ rhs2[g]``: the ring's K steps run over the first
    # pair, then the second, into one accumulator (the gated FFN's input gradient, ``gate_bar
    # Wg^T + up_bar Wu^T``, in one kernel). On the ring only; one rhs, no epilogue.
    # ``epilogue(acc, *epilogue_gmem, group=, row0=, col0=)`` maps one epilogue slab of a
    # compute warpgroup's float32 accumulator (``[epilogue_rows, wg_n]``, rows from ``row0``,
    # columns from ``col0``) before the cast, to one result or a tuple of ``num_outputs``: the FP8
    # kernel's scales, the gated FFN's activation derivative (two results).
    # ``num_rhs`` weights share each lhs block (one accumulator each, same columns); ``combine``
    # maps the accumulators to the ``num_outputs`` float32 results (the fused gated kernel's
    # ``act(gate) * up``); without it the one accumulator is the one result.
    # ``k_step_scale(partial, *epilogue_gmem, k_step=, group=, row0=, col0=)``: scales applied
    # per K step (the FP8 blockwise recipe: one K step is one scale block). Each step's product
    # goes into a fresh float32 ``wgmma`` accumulator; the main accumulator (a register value
    # carried by the pipeline) adds ``k_step_scale(partial)``. One rhs, no ``combine``.
    # ``ring_operands``: the epilogue's operands (two ``[M, N]`` refs) ride the ring as a few
    # more steps per tile (:mod:`.ring_operands`), and ``epilogue(acc_part,
    # *operand_blocks, group=, row0=, col0=)`` gets their blocks in registers, a column part of
    # the warpgroup's accumulator at a time.
    # ``cfg.split_last_round``: the last round's units may be cut into pieces of their K loop
    # (:mod:`.schedule`); a workspace ref (``[workspace_slots(workers) * cluster
    # CTAs, bm, bn]`` float32) follows the outputs.
    assert k_step_scale is None or (num_rhs == 1 and combine is None)
    assert not paired or (cfg.ring and num_rhs == 1 and epilogue is None and combine is None)
    assert not cfg.split_last_round or (
        cfg.ring and num_rhs == 1 and epilogue is None and combine is None and k_step_scale is None
    )
    assert not ring_operands or (
        num_rhs == 1 and not paired and combine is None and k_step_scale is None
    )
    rhs_gmems = rhs_epilogue_and_out_gmem[:num_rhs]
    # (lhs, its weights) per pair of the K loop: one, or two when ``paired``.
    pairs = [(lhs_gmem, rhs_gmems)]
    if paired:
        lhs2_gmem, rhs2_gmem = rhs_epilogue_and_out_gmem[num_rhs : num_rhs + 2]
        pairs.append((lhs2_gmem, (rhs2_gmem,)))
    num_out_refs = num_outputs + cfg.split_last_round
    epilogue_gmem = rhs_epilogue_and_out_gmem[num_rhs + 2 * paired : -num_out_refs]
    out_gmems = rhs_epilogue_and_out_gmem[-num_out_refs:][:num_outputs]
    workspace_gmem = rhs_epilogue_and_out_gmem[-1] if cfg.split_last_round else None
    out_gmem = out_gmems[0]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    wg_m, wg_n = warpgroup_tile(cfg)
    k = lhs_gmem.shape[1]
    n = out_gmem.shape[1]
    num_n_tiles = n // bn
    out_dtype = out_gmem.dtype
    itemsize = jnp.dtype(lhs_gmem.dtype).itemsize
    swizzle = plgpu.find_swizzle(bk * itemsize * 8)
    transforms = (
        plgpu.TilingTransform((8, swizzle // itemsize)),
        plgpu.SwizzleTransform(swizzle),
    )
    lhs_spec = plgpu.BlockSpec((bm, bk), lambda kk: (0, kk), transforms=transforms)
    if transpose_rhs:
        rhs_spec = plgpu.BlockSpec((bn, bk), lambda kk: (0, kk), transforms=transforms)
    else:
        rhs_spec = plgpu.BlockSpec((bk, bn), lambda kk: (kk, 0), transforms=transforms)
    chained = chains_tiles(cfg, k)
    on_ring = RingOperands(cfg, epilogue_gmem, transforms) if ring_operands else None

    def make_pipeline(body, context, state=None):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k // bk,),
            memory_registers=MEMORY_REGISTERS,
            in_specs=[lhs_spec] + [rhs_spec] * num_rhs,
            wg_axis="wg",
            num_compute_wgs=NUM_COMPUTE_WARPGROUPS,
            max_concurrent_steps=cfg.stages,
            compute_context=context,
            pipeline_state=state,
        )

    def rhs_block_source(rhs_gmem, group, col0):
        rhs_g = rhs_gmem.at[group]
        return rhs_g.at[pl.ds(col0, bn), :] if transpose_rhs else rhs_g.at[:, pl.ds(col0, bn)]

    def unused(*args, **kwargs):
        del args, kwargs

    if cfg.ring:
        rhs_block = (bn, bk) if transpose_rhs else (bk, bn)
        lhs_alloc = plgpu.SMEM((cfg.stages, bm, bk), lhs_gmem.dtype, transforms=transforms)
        rhs_allocs = [
            plgpu.SMEM((cfg.stages, *rhs_block), rhs.dtype, transforms=transforms)
            for rhs in rhs_gmems
        ]
        if on_ring is not None:  # each buffer also viewed as one operand's blocks
            lhs_alloc, rhs_allocs[0] = on_ring.allocations(
                lhs_alloc, rhs_allocs[0], interpreted=interpreted
            )
        allocations = {
            "lhs": lhs_alloc,
            "rhs": rhs_allocs,
            # The interpreter has no cluster barriers (and runs a multicast copy as a local
            # copy of the whole block, so a CTA's own releases suffice there).
            **ring_barriers(
                cfg.stages,
                copies_per_step=1 + num_rhs,
                cluster_wide=cfg.multicast_weights and not interpreted,
            ),
        }
    else:
        allocations = make_pipeline(unused, unused).get_allocations(
            lhs_gmem.at[pl.ds(0, bm), :], *(rhs_block_source(rhs, 0, 0) for rhs in rhs_gmems)
        )

    # Results stored a run of columns at a time (ring_operands) are staged that wide.
    slab_cols = None if on_ring is None else on_ring.apply_cols
    out_alloc = epilogue_allocation(cfg, out_dtype, interpreted, slab_cols)

    @functools.partial(
        pl.run_scoped,
        pipeline_allocs=allocations,
        out_smem=out_alloc,
        collective_axes="wg",
    )
    def _scope(pipeline_allocs, out_smem):
        wg = lax.axis_index("wg")
        # A compute warpgroup's first row and column in its tile: the two split the rows or
        # the columns.
        wg_row = wg * wg_m if cfg.split_rows else 0
        wg_col = 0 if cfg.split_rows else wg * wg_n
        wg_rows, wg_cols = pl.ds(wg_row, wg_m), pl.ds(wg_col, wg_n)
        stores = EpilogueStores(
            cfg, out_smem, out_gmems, wg=wg, wg_row=wg_row, wg_col=wg_col, slab_cols=slab_cols
        )
        num_compute_work = work_counts_gmem[0]
        # Read here, not in the loops: Mosaic GPU's interpreter (jax 0.10) resolves a cluster
        # axis index only outside them.
        cluster_cta = lax.axis_index(CLUSTER_AXIS) if cfg.multicast_weights else 0
        num_tail_work = work_counts_gmem[1]

        work = schedule.WorkList(
            work_group_gmem,
            work_first_row_gmem,
            offsets_gmem,
            num_compute_work,
            num_groups=num_groups,
            num_rows=lhs_gmem.shape[0],
        )

        @pl.when(wg < NUM_COMPUTE_WARPGROUPS)
        def _zero_tail():  # rows at or past sum(group_sizes): GPU memory is uninitialised.
            # Every CTA takes its own tail tiles, also the two of a cluster.
            per_cta = cfg.multicast_weights

            @pl.loop(0, cta_tile_count(num_tail_work * num_n_tiles, per_cta=per_cta))
            def _tail_loop(local_tile):
                index = cta_tile_index(local_tile, per_cta=per_cta)
                _, row0, lo, hi = schedule.item_rows(
                    work, num_compute_work + index // num_n_tiles, cfg
                )
                col0 = (index % num_n_tiles) * bn
                zeros = (jnp.zeros((stores.stage_rows, wg_n), out_dtype),) * num_outputs
                stores.store(lambda first_row: zeros, row0, col0, lo, hi)  # each its half

        def make_context(group, row0, lo, hi, col0, partial_slot=None, ring_epilogue=None):
            """The tile's main loop and epilogue; for a part of a cut unit the accumulator goes
            to workspace slot ``partial_slot`` instead. ``ring_epilogue(acc, apply=)``: the
            epilogue's steps on the ring (``ring_operands``: :meth:`RingOperands.epilogue`)."""

            def context(eval_pipeline):
                if k_step_scale is not None:  # the main accumulator is the pipeline's carry
                    acc = eval_pipeline(jnp.zeros((wg_m, wg_n), jnp.float32))
                    slab_results = stores.epilogue_slabs(
                        epilogue, epilogue_gmem, acc, group, row0, col0
                    )
                    stores.store(slab_results, row0, col0, lo, hi)
                    return

                def acc_scope(*acc_refs):
                    # The scopes name the regions of Mosaic GPU's on-device profiler (when a
                    # kernel is compiled with a profile_space; otherwise they cost nothing).
                    with jax.named_scope("main_loop"):
                        eval_pipeline(acc_refs)
                    with jax.named_scope("epilogue"):
                        accs = [acc_ref[...] for acc_ref in acc_refs]
                        if combine is not None:
                            stores.store(stores.slabs_of(combine(*accs)), row0, col0, lo, hi)
                            return
                        (acc,) = accs
                        if ring_epilogue is not None:
                            ring_epilogue(
                                acc,
                                apply=on_ring.store_columns(
                                    stores, epilogue, group, row0, lo, hi, col0
                                ),
                            )
                            return

                        def store_result():
                            slab_results = stores.epilogue_slabs(
                                epilogue, epilogue_gmem, acc, group, row0, col0
                            )
                            stores.store(slab_results, row0, col0, lo, hi)

                        if partial_slot is None:
                            store_result()
                            return
                        ctas = MULTICAST_CLUSTER_CTAS if cfg.multicast_weights else 1
                        workspace_tile = workspace_gmem.at[partial_slot * ctas + cluster_cta]
                        stores.store_partial(acc, workspace_tile)

                pl.run_scoped(acc_scope, *[plgpu.ACC((wg_m, wg_n), jnp.float32)] * num_rhs)

            return context

        def make_mma(group, row0, col0):
            """One K step's ``wgmma`` (per rhs). On the ring they stay in flight (the ring
            waits); in jax's pipeline the step waits for them."""

            def mma(indices, lhs_smem, *rhs_smems_and_accs):
                *rhs_smems, acc_refs = rhs_smems_and_accs
                lhs_smem = lhs_smem.at[wg_rows] if cfg.split_rows else lhs_smem
                rhs_blocks = [
                    plgpu.transpose_ref(rhs_smem.at[wg_cols, :], (1, 0))
                    if transpose_rhs
                    else rhs_smem.at[:, wg_cols]
                    for rhs_smem in rhs_smems
                ]
                if k_step_scale is not None:  # acc_refs is the carried float32 accumulator

                    def step_product(partial_ref):
                        plgpu.wgmma(partial_ref, lhs_smem, rhs_blocks[0])
                        plgpu.wgmma_wait(0)
                        return partial_ref[...]

                    partial = pl.run_scoped(step_product, plgpu.ACC((wg_m, wg_n), jnp.float32))
                    (k_step,) = indices
                    return acc_refs + k_step_scale(
                        partial,
                        *epilogue_gmem,
                        k_step=k_step,
                        group=group,
                        row0=row0 + wg_row,
                        col0=col0 + wg_col,
                    )
                for rhs_block, acc_ref in zip(rhs_blocks, acc_refs, strict=True):
                    plgpu.wgmma(acc_ref, lhs_smem, rhs_block)
                if not cfg.ring:
                    plgpu.wgmma_wait(0)
                return acc_refs

            return mma

        num_tiles = num_compute_work * num_n_tiles

        def unit_tile(unit):
            return schedule.unit_tile(work, unit, cluster_cta, num_n_tiles, cfg)

        if cfg.ring:
            gmm_ring_loop.ring_tiles(
                pipeline_allocs,
                gmm_ring_loop.KernelScope(
                    cfg=cfg,
                    k=k,
                    wg=wg,
                    pairs=pairs,
                    paired=paired,
                    transpose_rhs=transpose_rhs,
                    on_ring=on_ring,
                    work=work,
                    num_n_tiles=num_n_tiles,
                    interpreted=interpreted,
                    unit_tile=unit_tile,
                    rhs_block_source=rhs_block_source,
                    make_mma=make_mma,
                    make_context=make_context,
                ),
            )
        else:
            # The compute work items come first in the work list: [0, num_compute_work).
            @plgpu.nd_loop((num_tiles,), collective_axes="sm")
            def _tile_loop(loop_info):
                (index,) = loop_info.index
                group, row0, lo, hi, col0, _ = unit_tile(index)
                context = make_context(group, row0, lo, hi, col0)
                mma = make_mma(group, row0, col0)
                operands = (
                    lhs_gmem.at[pl.ds(row0, bm), :],
                    *(rhs_block_source(rhs, group, col0) for rhs in rhs_gmems),
                )
                if not chained:
                    make_pipeline(mma, context)(*operands, allocations=pipeline_allocs)
                    return
                # One pipeline across this CTA's tiles: the memory warpgroup loads the next tile
                # while the compute warpgroups finish this one (no drain between tiles).
                local, count = loop_info.local_index, loop_info.num_local_steps
                state = jnp.where(
                    local == 0, plgpu.PipelinePipeline.START, plgpu.PipelinePipeline.STEADY
                )
                state = jnp.where(local == count - 1, plgpu.PipelinePipeline.STOP, state)

                @pl.when(count == 1)  # START and STOP at once: a plain pipeline.
                def _single():
                    make_pipeline(mma, context)(*operands, allocations=pipeline_allocs)

                @pl.when(count > 1)
                def _chain():
                    make_pipeline(mma, context, state)(*operands, allocations=pipeline_allocs)

        @pl.when(wg < NUM_COMPUTE_WARPGROUPS)
        def _drain():
            plgpu.wait_smem_to_gmem(0)


def chains_tiles(cfg: MosaicTileConfig, k: int) -> bool:
    # jax's pipeline of pipelines needs the K loop to be a whole number of ring turns.
    return cfg.pipelined_tiles and (k // cfg.block_k) % cfg.stages == 0
