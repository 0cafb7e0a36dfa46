"""Grouped matmul on Hopper in Pallas Mosaic GPU: a persistent, warp-specialized ``gmm``, and the
entry points that check its operands, build its work list and launch it (``gmm``, ``gmm_pair``,
``launch_gmm``). The kernel body and its layout: :mod:`.pallas_mosaic_kernel`.

Why a second lowering: the Triton kernel (``pallas_triton``) is not persistent and cannot overlap
its epilogue with the next tile's main loop, which costs most on short-K shapes.

Limits: bf16/fp16 operands and a 2-byte result, ``M % bm == 0``, ``K % bk == 0``, ``N % bn == 0``
(TMA boxes never cross the array edge), and a Hopper GPU (compute capability 9.x: ``wgmma``).
On a CPU the kernel runs in Mosaic GPU's interpreter (jax's GPU interpret mode), which the tests
use; the interpreter has no transposed ``wgmma`` operand (dgrad).

Measured against the Triton kernel, jax's pipelines and ``torch._grouped_mm``:
docs/kernels.md, 'Mosaic gmm: the persistent kernel with one ring' and 'Grouped matmul: the
auto backend'.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxmoe.ops.mosaic import gmm_kernel, persistent_loop, schedule
from jaxmoe.ops.mosaic.persistent_loop import grid_size, persistent_kernel
from jaxmoe.ops.mosaic.tiles import (
    MosaicTileConfig,
    check_tiles,
    cluster_ctas,
    default_mosaic_gmm_tiles,
    unsupported_reason,
)
from jaxmoe.ops.pallas_common import check_gmm_operands

Array = jax.Array


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
    check_gmm_operands(lhs, rhs, group_sizes, transpose_rhs, name)
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    cfg = tiles or default_mosaic_gmm_tiles(m, k, n)
    check_tiles(cfg)
    interpret_params = persistent_loop.interpret_params(interpret)
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
    ring_operands: bool = False,
):
    """The kernel on checked operands: builds the work list and launches one CTA per SM.

    ``epilogue`` and ``epilogue_operands`` (GPU memory refs it reads): see the kernel body.
    ``more_rhs`` (weights shaped like ``rhs``, multiplied by the same lhs blocks), ``combine``
    and ``num_outputs`` (then a tuple of ``[M, N]`` results is returned), ``k_step_scale`` (per
    K step scales, reading ``epilogue_operands`` too), ``second_pair`` (``(lhs2, rhs2)`` shaped
    like ``(lhs, rhs)``: the result is ``lhs @ rhs + lhs2 @ rhs2`` per group, on the ring):
    see the kernel body. ``ring_operands``: the ``epilogue_operands`` ride the ring
    (:mod:`.pallas_mosaic_ring_operands`). ``cfg.split_last_round`` applies to a plain product
    or pair only (no ``epilogue``, ``more_rhs``, ``combine`` or ``k_step_scale``: its fix-up
    adds float32 partial sums of the accumulator itself); the others run without it.
    """
    split = cfg.split_last_round and not (epilogue or more_rhs or combine or k_step_scale)
    cfg = dataclasses.replace(cfg, split_last_round=split)
    m, k = lhs.shape
    num_groups = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    work = schedule.WorkList.of(group_sizes, m, cfg)
    # The items with rows to multiply, then the tail's (rows written as zeros).
    work_counts = jnp.stack([work.num_work, jnp.sum(work.group == num_groups).astype(jnp.int32)])
    body = functools.partial(
        gmm_kernel.mosaic_gmm_body,
        cfg=cfg,
        num_groups=num_groups,
        transpose_rhs=transpose_rhs,
        epilogue=epilogue,
        num_rhs=1 + len(more_rhs),
        combine=combine,
        num_outputs=num_outputs,
        k_step_scale=k_step_scale,
        paired=bool(second_pair),
        ring_operands=ring_operands,
        interpreted=interpret_params is not None,
    )
    out_types = (jax.ShapeDtypeStruct((m, n), out_dtype),) * num_outputs
    workers = grid_size(interpret_params, cluster_ctas(cfg))
    if split:  # one slot per part of a cut unit, per CTA of a cluster
        workspace_rows = schedule.workspace_slots(workers) * cluster_ctas(cfg)
        out_types += (
            jax.ShapeDtypeStruct((workspace_rows, cfg.block_m, cfg.block_n), jnp.float32),
        )
    kernel = persistent_kernel(
        body,
        out_types[0] if len(out_types) == 1 else out_types,
        interpret_params,
        cluster_ctas=cluster_ctas(cfg),
        approx_math=cfg.approx_math,
    )
    results = kernel(
        work_counts,
        work.group,
        work.first_row,
        work.offsets,
        lhs,
        rhs,
        *more_rhs,
        *second_pair,
        *epilogue_operands,
    )
    if not split:
        return results
    out, workspace = results
    return schedule.last_round_fixup(
        out,
        workspace,
        work,
        workers=workers,
        steps=schedule.unit_steps(k, cfg, paired=bool(second_pair)),
        num_n_tiles=n // cfg.block_n,
        cfg=cfg,
    )
