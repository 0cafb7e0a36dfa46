"""Grouped matmul on Hopper in Pallas Mosaic GPU: a persistent, warp-specialized ``gmm``.

Layout of the work (``bm, bn, bk`` are the block sizes)::

    work items   as in ``pallas_triton``: one per (m tile t, group g intersecting t), plus the
                 "tail" group G for rows at or past sum(group_sizes) (written as zeros). Their
                 list is computed on the device (``gmm_work_items``).
    schedule     one CTA per SM loops over (work item, N tile) pairs (``plgpu.nd_loop``), walking
                 ``group_swizzle`` neighbouring work items along N for L2 reuse.
    one pair     three warpgroups. The memory warpgroup streams ``[bm, bk]`` blocks of ``lhs``
                 and ``[bk, bn]`` blocks of ``rhs[g]`` (``[bn, bk]`` when transposed) into a ring
                 of ``stages`` shared-memory slots by TMA; the two compute warpgroups each
                 multiply into a ``[bm, bn / 2]`` float32 accumulator with ``wgmma``. Because the
                 memory warpgroup runs ahead, the next pair's loads overlap this pair's epilogue.
                 With ``ring`` (the default tiles) the ring is hand-written and spans all of the
                 CTA's pairs (:func:`.pallas_mosaic_common.ring_produce`): it never drains
                 between pairs, and each compute warpgroup keeps one ``wgmma`` in flight.
                 Otherwise jax's ``emit_pipeline_warp_specialized`` runs per pair (chained
                 across pairs with ``pipelined_tiles``); the FP8 and fused gated kernels' default
                 tiles still take it (the ring is not measured with them yet).
                 With ``pingpong`` (on the ring) each compute warpgroup instead multiplies whole
                 pairs into a ``[bm, bn]`` accumulator, the CTA's pairs alternating between the
                 two: one's epilogue runs under the other's ``wgmma``; each waits for (and
                 releases) the other's slots too (:func:`.pallas_mosaic_common.ring_skip`).
    epilogue     the accumulator is cast and staged in shared memory, then stored by TMA without
                 waiting for completion (the next pair waits only until the stage has been read;
                 :mod:`.pallas_mosaic_epilogue`). A tile whose rows all belong to its group is
                 one store; a tile cut by a group boundary stores its rows ``[lo, hi)`` as
                 power-of-two runs (a TMA box has a static shape). With ``swizzled_epilogue`` a
                 whole slab is instead written in 64-column chunks to a 128-byte-swizzled
                 buffer, one store left in flight.

Why a second lowering: the Triton kernel (``pallas_triton``) is not persistent and cannot overlap
its epilogue with the next tile's main loop, which costs most on short-K shapes (benchmarks/).

Limits: bf16/fp16 operands and a 2-byte result, ``M % bm == 0``, ``K % bk == 0``, ``N % bn == 0``
(TMA boxes never cross the array edge), and a Hopper GPU (compute capability 9.x: ``wgmma``).
On a CPU the kernel runs in Mosaic GPU's interpreter (jax's GPU interpret mode), which the tests
use; the interpreter has no transposed ``wgmma`` operand (dgrad).

Measured (H100, jax 0.11.2, session 8, ``benchmarks/results/raw/h100-run9/call8``): the ring with
the swizzled epilogue exact on the six shapes (balanced, skewed; fwd and dgrad) and the fastest
of five variants on 10 of 12 (shape, fwd/dgrad) cases, 1.03-1.07x ``torch._grouped_mm`` forward
in that probe. Earlier (``benchmarks/results/raw/h100-run4``): exact against a float32
reference on all six benchmark shapes, balanced and skewed with empty groups and tail rows, fwd and
dgrad (the same relative error as the Triton kernel, 1.66e-3); 1.14-1.24x the Triton kernel's
TFLOP/s on every (shape, fwd/dgrad) case with the default tiles (probe, same run).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.grouped_matmul import pallas_mosaic_common as common
from jaxmoe.ops.grouped_matmul import pallas_triton
from jaxmoe.ops.grouped_matmul.pallas_mosaic_epilogue import EpilogueStores, epilogue_allocation
from jaxmoe.ops.grouped_matmul.pallas_mosaic_tiles import (
    MosaicTileConfig,
    check_tiles,
    default_mosaic_gmm_tiles,
    unsupported_reason,
    warpgroup_cols,
)
from jaxmoe.ops.grouped_matmul.pallas_triton import gmm_work_items

Array = jax.Array


def _jaxmoe_mosaic_gmm(
    work_counts_gmem,
    work_group_gmem,
    work_tile_gmem,
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
    assert k_step_scale is None or (num_rhs == 1 and combine is None)
    assert not paired or (cfg.ring and num_rhs == 1 and epilogue is None and combine is None)
    rhs_gmems = rhs_epilogue_and_out_gmem[:num_rhs]
    pairs = [(lhs_gmem, rhs_gmems[0])]
    if paired:
        pairs.append(tuple(rhs_epilogue_and_out_gmem[num_rhs : num_rhs + 2]))
        num_rhs_and_pair = num_rhs + 2
    else:
        num_rhs_and_pair = num_rhs
    epilogue_gmem = rhs_epilogue_and_out_gmem[num_rhs_and_pair:-num_outputs]
    out_gmems = rhs_epilogue_and_out_gmem[-num_outputs:]
    out_gmem = out_gmems[0]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    wg_n = warpgroup_cols(cfg)
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
    chained = _chains_tiles(cfg, k)

    def make_pipeline(body, context, state=None):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k // bk,),
            memory_registers=common.MEMORY_REGISTERS,
            in_specs=[lhs_spec] + [rhs_spec] * num_rhs,
            wg_axis="wg",
            num_compute_wgs=common.NUM_COMPUTE_WARPGROUPS,
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
        allocations = {
            "lhs": plgpu.SMEM((cfg.stages, bm, bk), lhs_gmem.dtype, transforms=transforms),
            "rhs": [
                plgpu.SMEM((cfg.stages, *rhs_block), rhs.dtype, transforms=transforms)
                for rhs in rhs_gmems
            ],
            **common.ring_barriers(cfg.stages, copies_per_step=1 + num_rhs),
        }
    else:
        allocations = make_pipeline(unused, unused).get_allocations(
            lhs_gmem.at[pl.ds(0, bm), :], *(rhs_block_source(rhs, 0, 0) for rhs in rhs_gmems)
        )

    out_alloc = epilogue_allocation(cfg, out_dtype, interpreted)

    @functools.partial(
        pl.run_scoped,
        pipeline_allocs=allocations,
        out_smem=out_alloc,
        collective_axes="wg",
    )
    def _scope(pipeline_allocs, out_smem):
        wg = lax.axis_index("wg")
        # A compute warpgroup's first column in its tile: ping-pong tiles are a warpgroup's own.
        wg_col = 0 if cfg.pingpong else wg * wg_n
        wg_cols = pl.ds(wg_col, wg_n)
        stores = EpilogueStores(cfg, out_smem, out_gmems, wg=wg, wg_col=wg_col)
        num_compute_work = work_counts_gmem[0]
        num_tail_work = work_counts_gmem[1]

        def tile_rows(work):
            group = work_group_gmem[work]
            row0 = work_tile_gmem[work] * bm
            start = offsets_gmem[jnp.minimum(group, num_groups + 1)]
            end = offsets_gmem[jnp.minimum(group + 1, num_groups + 1)]
            return group, row0, jnp.clip(start - row0, 0, bm), jnp.clip(end - row0, 0, bm)

        @pl.when(wg < common.NUM_COMPUTE_WARPGROUPS)
        def _zero_tail():  # rows at or past sum(group_sizes): GPU memory is uninitialised.
            @plgpu.nd_loop((num_tail_work * num_n_tiles,), collective_axes="sm")
            def _tail_loop(loop_info):
                (index,) = loop_info.index
                _, row0, lo, hi = tile_rows(num_compute_work + index // num_n_tiles)
                col0 = (index % num_n_tiles) * bn
                zeros = (jnp.zeros((stores.stage_rows, wg_n), out_dtype),) * num_outputs

                # Ping-pong: a tile is one warpgroup's (they alternate); else each stores half.
                @pl.when(index % 2 == wg if cfg.pingpong else True)
                def _store_zeros():
                    stores.store(lambda first_row: zeros, row0, col0, lo, hi)

        def make_context(group, row0, lo, hi, col0):
            def context(eval_pipeline):
                if k_step_scale is not None:  # the main accumulator is the pipeline's carry
                    acc = eval_pipeline(jnp.zeros((bm, wg_n), jnp.float32))
                    slab_results = stores.epilogue_slabs(
                        epilogue, epilogue_gmem, acc, group, row0, col0
                    )
                    stores.store(slab_results, row0, col0, lo, hi)
                    return

                def acc_scope(*acc_refs):
                    eval_pipeline(acc_refs)
                    accs = [acc_ref[...] for acc_ref in acc_refs]
                    if combine is not None:
                        slab_results = stores.slabs_of(combine(*accs))
                    else:
                        (acc,) = accs
                        slab_results = stores.epilogue_slabs(
                            epilogue, epilogue_gmem, acc, group, row0, col0
                        )
                    stores.store(slab_results, row0, col0, lo, hi)

                pl.run_scoped(acc_scope, *[plgpu.ACC((bm, wg_n), jnp.float32)] * num_rhs)

            return context

        def make_mma(group, row0, col0):
            """One K step's ``wgmma`` (per rhs). On the ring they stay in flight (the ring
            waits); in jax's pipeline the step waits for them."""

            def mma(indices, lhs_smem, *rhs_smems_and_accs):
                *rhs_smems, acc_refs = rhs_smems_and_accs
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

                    partial = pl.run_scoped(step_product, plgpu.ACC((bm, wg_n), jnp.float32))
                    (k_step,) = indices
                    return acc_refs + k_step_scale(
                        partial,
                        *epilogue_gmem,
                        k_step=k_step,
                        group=group,
                        row0=row0,
                        col0=col0 + wg_col,
                    )
                for rhs_block, acc_ref in zip(rhs_blocks, acc_refs, strict=True):
                    plgpu.wgmma(acc_ref, lhs_smem, rhs_block)
                if not cfg.ring:
                    plgpu.wgmma_wait(0)
                return acc_refs

            return mma

        num_tiles = num_compute_work * num_n_tiles

        def tile_parts(index):
            work, n_tile = common.swizzle(index, num_compute_work, num_n_tiles, cfg.group_swizzle)
            group, row0, lo, hi = tile_rows(work)
            return group, row0, lo, hi, n_tile * bn

        def ring_tiles(ring):
            """The CTA's tiles on :mod:`.pallas_mosaic_common`'s ring: ``k / bk`` steps each
            (per pair: ``paired`` runs the second pair's steps after the first's)."""
            steps = k // bk
            my_tiles = common.cta_tile_count(num_tiles)

            def parts(local_tile):
                return tile_parts(common.cta_tile_index(local_tile)), steps * len(pairs)

            @pl.when(wg == common.NUM_COMPUTE_WARPGROUPS)
            def _memory_warpgroup():
                def load_blocks(pair_lhs, pair_rhs, info, i, slot):
                    group, row0, _, _, col0 = info
                    barrier = ring["loaded"].at[slot]
                    k_cols = pl.ds(i * bk, bk)
                    lhs_block = pair_lhs.at[pl.ds(row0, bm), k_cols]
                    plgpu.copy_gmem_to_smem(lhs_block, ring["lhs"].at[slot], barrier)
                    for rhs, rhs_ring in zip(pair_rhs, ring["rhs"], strict=True):
                        source = rhs_block_source(rhs, group, col0)
                        block = source.at[:, k_cols] if transpose_rhs else source.at[k_cols, :]
                        plgpu.copy_gmem_to_smem(block, rhs_ring.at[slot], barrier)

                def load(info, i, slot):
                    if not paired:
                        load_blocks(lhs_gmem, rhs_gmems, info, i, slot)
                        return
                    for index, (pair_lhs, pair_rhs) in enumerate(pairs):
                        # Each branch issues the same copies into the same slot and barrier.
                        @pl.when((i >= index * steps) & (i < (index + 1) * steps))
                        def _load_pair(pair_lhs=pair_lhs, pair_rhs=pair_rhs, index=index):
                            load_blocks(pair_lhs, [pair_rhs], info, i - index * steps, slot)

                common.ring_produce(
                    my_tiles, parts, load, stages=cfg.stages, released=ring["released"]
                )

            @pl.when(wg < common.NUM_COMPUTE_WARPGROUPS)
            def _compute_warpgroups():
                plgpu.set_max_registers(common.COMPUTE_REGISTERS, action="increase")

                def tile(local_tile, carry):
                    (group, row0, lo, hi, col0), count = parts(local_tile)
                    mma = make_mma(group, row0, col0)
                    barriers = dict(
                        stages=cfg.stages, loaded=ring["loaded"], released=ring["released"]
                    )

                    def eval_steps(acc):
                        def step(i, slot, acc):
                            rhs_smems = [rhs_ring.at[slot] for rhs_ring in ring["rhs"]]
                            return mma((i,), ring["lhs"].at[slot], *rhs_smems, acc)

                        return common.ring_consume(local_tile * count, count, step, acc, **barriers)

                    if not cfg.pingpong:
                        make_context(group, row0, lo, hi, col0)(eval_steps)
                        return carry

                    # Ping-pong: the CTA's tiles alternate between the two warpgroups.
                    mine = local_tile % common.NUM_COMPUTE_WARPGROUPS == wg

                    @pl.when(mine)
                    def _multiply():
                        make_context(group, row0, lo, hi, col0)(eval_steps)

                    @pl.when(jnp.logical_not(mine))
                    def _skip():
                        common.ring_skip(local_tile * count, count, **barriers)

                    return carry

                lax.fori_loop(0, my_tiles, tile, jnp.int32(0))

        if cfg.ring:
            ring_tiles(pipeline_allocs)
        else:
            # The compute work items come first in gmm_work_items' list: [0, num_compute_work).
            @plgpu.nd_loop((num_tiles,), collective_axes="sm")
            def _tile_loop(loop_info):
                (index,) = loop_info.index
                group, row0, lo, hi, col0 = tile_parts(index)
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

        @pl.when(wg < common.NUM_COMPUTE_WARPGROUPS)
        def _drain():
            plgpu.wait_smem_to_gmem(0)


def _chains_tiles(cfg: MosaicTileConfig, k: int) -> bool:
    # jax's pipeline of pipelines needs the K loop to be a whole number of ring turns.
    return cfg.pipelined_tiles and (k // cfg.block_k) % cfg.stages == 0


def gmm(
    lhs: Array,
    rhs: Array,
    group_sizes: Array,
    *,
    transpose_rhs: bool = False,
    out_dtype=None,
    tiles: MosaicTileConfig | None = None,
    interpret: bool | None = None,
) -> Array:
    """``out[rows of g] = lhs[rows of g] @ rhs[g]`` (``rhs[g].T`` if transposed); zeros after.

    Same contract as :func:`jaxmoe.ops.grouped_matmul.pallas_triton.gmm`; the operands must pass
    :func:`supports` (bf16/fp16, dims divisible by the blocks).
    """
    out_dtype, cfg, interpret_params = _checked(
        lhs, rhs, group_sizes, transpose_rhs, out_dtype, tiles, interpret, "gmm"
    )
    return launch_gmm(
        lhs,
        rhs,
        group_sizes,
        transpose_rhs=transpose_rhs,
        out_dtype=out_dtype,
        cfg=cfg,
        interpret_params=interpret_params,
    )


def gmm_pair(
    lhs: Array,
    rhs: Array,
    lhs2: Array,
    rhs2: Array,
    group_sizes: Array,
    *,
    transpose_rhs: bool = False,
    out_dtype=None,
    tiles: MosaicTileConfig | None = None,
    interpret: bool | None = None,
) -> Array:
    """``out[rows of g] = lhs[rows of g] @ rhs[g] + lhs2[rows of g] @ rhs2[g]`` (each ``rhs[g]``
    transposed if ``transpose_rhs``), zeros after the groups, in one kernel: each tile's K loop
    runs over the first pair, then the second, into one float32 accumulator, rounded once.

    The gated FFN's input gradient ``gate_bar Wg^T + up_bar Wu^T`` is this with
    ``transpose_rhs``: one launch instead of two plus an add, and one ``[M, N]`` result written
    instead of two. ``(lhs2, rhs2)`` must have the shapes and dtypes of ``(lhs, rhs)``; the tiles
    must run on the ring (the default tiles do). Otherwise as :func:`gmm`.
    """
    if (jnp.shape(lhs2), jnp.shape(rhs2)) != (jnp.shape(lhs), jnp.shape(rhs)) or (
        jnp.result_type(lhs2),
        jnp.result_type(rhs2),
    ) != (jnp.result_type(lhs), jnp.result_type(rhs)):
        raise ValueError(
            f"mosaic gmm_pair: `lhs2` {jnp.shape(lhs2)} {jnp.result_type(lhs2)} and `rhs2` "
            f"{jnp.shape(rhs2)} {jnp.result_type(rhs2)} must have the shapes and dtypes of "
            f"`lhs` {jnp.shape(lhs)} {jnp.result_type(lhs)} and `rhs` {jnp.shape(rhs)} "
            f"{jnp.result_type(rhs)}."
        )
    out_dtype, cfg, interpret_params = _checked(
        lhs, rhs, group_sizes, transpose_rhs, out_dtype, tiles, interpret, "gmm_pair"
    )
    if not cfg.ring:
        raise NotImplementedError(
            "mosaic gmm_pair runs on the hand-written ring only: pass tiles with ring=True "
            "(the default tiles)."
        )
    return launch_gmm(
        lhs,
        rhs,
        group_sizes,
        transpose_rhs=transpose_rhs,
        out_dtype=out_dtype,
        cfg=cfg,
        interpret_params=interpret_params,
        second_pair=(lhs2, rhs2),
    )


def _checked(lhs, rhs, group_sizes, transpose_rhs, out_dtype, tiles, interpret, name):
    """``(out_dtype, tiles, interpret_params)`` for checked operands: ``ValueError`` for bad
    arguments, ``NotImplementedError`` (why) for operands the kernel cannot take."""
    pallas_triton._check(lhs, rhs, group_sizes, transpose_rhs, name)
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    cfg = tiles or default_mosaic_gmm_tiles(m, k, n)
    check_tiles(cfg)
    interpret_params = common.interpret_params(interpret)
    reason = unsupported_reason(
        lhs.shape, rhs.shape, lhs.dtype, out_dtype, transpose_rhs, cfg, interpret_params is not None
    )
    if reason is not None:
        raise NotImplementedError(
            f"mosaic {name}: lhs {lhs.shape} {lhs.dtype}, rhs {rhs.shape}, out {out_dtype}: "
            f"{reason}. Use backend='pallas_triton', or 'auto', which picks the Triton kernel "
            "for these."
        )
    return out_dtype, cfg, interpret_params


def launch_gmm(
    lhs,
    rhs,
    group_sizes,
    *,
    transpose_rhs: bool,
    out_dtype,
    cfg: MosaicTileConfig,
    interpret_params,
    epilogue=None,
    epilogue_operands=(),
    more_rhs=(),
    combine=None,
    num_outputs: int = 1,
    k_step_scale=None,
    second_pair=(),
):
    """The kernel on checked operands: builds the work list and launches one CTA per SM.

    ``epilogue`` and ``epilogue_operands`` (GPU memory refs it reads): see the kernel body.
    ``more_rhs`` (weights shaped like ``rhs``, multiplied by the same lhs blocks), ``combine``
    and ``num_outputs`` (then a tuple of ``[M, N]`` results is returned), ``k_step_scale`` (per
    K step scales, reading ``epilogue_operands`` too), ``second_pair`` (``(lhs2, rhs2)`` shaped
    like ``(lhs, rhs)``: the result is ``lhs @ rhs + lhs2 @ rhs2`` per group, on the ring):
    see the kernel body.
    """
    m = lhs.shape[0]
    num_groups = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    work_group, work_tile, offsets = gmm_work_items(group_sizes, m, cfg.block_m)
    work_counts = jnp.stack(
        [jnp.sum(work_group < num_groups), jnp.sum(work_group == num_groups)]
    ).astype(jnp.int32)
    body = functools.partial(
        _jaxmoe_mosaic_gmm,
        cfg=cfg,
        num_groups=num_groups,
        transpose_rhs=transpose_rhs,
        epilogue=epilogue,
        num_rhs=1 + len(more_rhs),
        combine=combine,
        num_outputs=num_outputs,
        k_step_scale=k_step_scale,
        paired=bool(second_pair),
        interpreted=interpret_params is not None,
    )
    out_type = jax.ShapeDtypeStruct((m, n), out_dtype)
    kernel = common.persistent_kernel(
        body, out_type if num_outputs == 1 else (out_type,) * num_outputs, interpret_params
    )
    return kernel(
        work_counts,
        work_group,
        work_tile,
        offsets,
        lhs,
        rhs,
        *more_rhs,
        *second_pair,
        *epilogue_operands,
    )
