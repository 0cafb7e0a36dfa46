"""Running the Mosaic GPU ``gmm``: the plan of one call (:class:`GmmPlan`, decided once, before
tracing, by :func:`plan_gmm` or an op's own planner), the launcher that runs a plan
(:func:`launch_gmm`: the work list, one CTA per SM) and the checked entry points for direct
callers (:func:`gmm`, :func:`gmm_pair`). The kernel body: :mod:`.gmm_kernel`.

Limits: bf16/fp16 operands and a 2-byte result, ``M % bm == K % bk == N % bn == 0`` (TMA boxes
never cross the array edge), a Hopper GPU, or Mosaic GPU's interpreter on a CPU (no transposed
``wgmma`` operand there: no dgrad). Measured: docs/kernels.md, 'Mosaic gmm: the persistent
kernel with one ring' and 'Grouped matmul: the auto backend'.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxmoe.ops.mosaic import gmm_kernel, persistent_loop, schedule
from jaxmoe.ops.mosaic import tiles as mosaic_tiles
from jaxmoe.ops.mosaic.persistent_loop import grid_size, persistent_kernel
from jaxmoe.ops.mosaic.tiles import (
    MosaicTileConfig,
    check_tiles,
    cluster_ctas,
    unsupported_reason,
)
from jaxmoe.ops.mosaic.variant import PLAIN, GmmVariant
from jaxmoe.ops.pallas_common import check_gmm_operands

Array = jax.Array
PAIRED = GmmVariant(paired=True)


@dataclasses.dataclass(frozen=True)
class GmmPlan:
    """How the Mosaic ``gmm`` runs one call, decided once, before tracing, by whoever calls
    :func:`launch_gmm` (a backend, or a checked entry point such as :func:`gmm`).

    Attributes:
      tiles: the block sizes (already checked by :func:`.tiles.check_tiles`).
      transpose_rhs: whether the kernel reads ``rhs[g]`` as ``[N, K]``.
      out_dtype: the result's dtype.
      interpret_params: Mosaic GPU's interpreter parameters, ``None`` on a GPU.
      unsupported: why the kernel cannot take the operands, ``None`` if it can; a plan that says
        why is never launched (the caller raises or falls back).
    """

    tiles: MosaicTileConfig
    transpose_rhs: bool
    out_dtype: jnp.dtype
    interpret_params: Any
    unsupported: str | None = None

    @property
    def interpreted(self) -> bool:
        return self.interpret_params is not None


def plan_gmm(
    lhs_shape, rhs_shape, dtype, *, transpose_rhs: bool, out_dtype, tiles, interpret
) -> GmmPlan:
    """The plan of a plain (bf16/fp16) ``gmm`` of ``lhs [M, K]`` by ``rhs [G, K, N]`` (``[G, N,
    K]`` with ``transpose_rhs``): ``tiles`` or the default, checked; whether it runs in the
    interpreter; and :func:`.tiles.unsupported_reason`. ``ValueError`` for tiles that cannot be
    lowered."""
    m, k = lhs_shape
    n = rhs_shape[1] if transpose_rhs else rhs_shape[2]
    out_dtype = jnp.dtype(out_dtype or dtype)
    cfg = tiles or mosaic_tiles.default_mosaic_gmm_tiles(m, k, n)
    check_tiles(cfg)
    interpret_params = persistent_loop.interpret_params(interpret)
    reason = unsupported_reason(
        lhs_shape, rhs_shape, dtype, out_dtype, transpose_rhs, cfg, interpret_params is not None
    )
    return GmmPlan(cfg, transpose_rhs, out_dtype, interpret_params, reason)


def check_pair_tiles(cfg: MosaicTileConfig) -> None:
    """``NotImplementedError`` unless :func:`gmm_pair`'s two products can run on ``cfg``."""
    if not cfg.ring:
        raise NotImplementedError(
            "mosaic gmm_pair runs on the hand-written ring only: pass tiles with ring=True "
            "(the default tiles)."
        )


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
    :func:`.tiles.supports` (bf16/fp16, dims divisible by the blocks). Checks its arguments
    (``ValueError``) and refuses what the kernel cannot take (``NotImplementedError``, why).
    """
    plan = _checked_plan(lhs, rhs, group_sizes, transpose_rhs, out_dtype, tiles, interpret, "gmm")
    return launch_gmm(lhs, rhs, group_sizes, plan)


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
    runs over the first pair, then the second, into one float32 accumulator, rounded once (the
    gated FFN's input gradient ``gate_bar Wg^T + up_bar Wu^T`` in one launch).

    ``(lhs2, rhs2)`` must have the shapes and dtypes of ``(lhs, rhs)``; the tiles must run on
    the ring (the default tiles do). Otherwise as :func:`gmm`.
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
    plan = _checked_plan(
        lhs, rhs, group_sizes, transpose_rhs, out_dtype, tiles, interpret, "gmm_pair"
    )
    check_pair_tiles(plan.tiles)
    return launch_gmm(lhs, rhs, group_sizes, plan, PAIRED, second_pair=(lhs2, rhs2))


def _checked_plan(lhs, rhs, group_sizes, transpose_rhs, out_dtype, tiles, interpret, name):
    """The plan of a direct call: ``ValueError`` for bad arguments, ``NotImplementedError``
    (why) for operands the kernel cannot take."""
    check_gmm_operands(lhs, rhs, group_sizes, transpose_rhs, name)
    plan = plan_gmm(
        lhs.shape,
        rhs.shape,
        lhs.dtype,
        transpose_rhs=transpose_rhs,
        out_dtype=out_dtype,
        tiles=tiles,
        interpret=interpret,
    )
    if plan.unsupported is not None:
        raise NotImplementedError(
            f"mosaic {name}: lhs {lhs.shape} {lhs.dtype}, rhs {rhs.shape}, out "
            f"{plan.out_dtype}: {plan.unsupported}. Use backend='pallas_triton', or 'auto', "
            "which picks the Triton kernel for these."
        )
    return plan


def launch_gmm(
    lhs,
    rhs,
    group_sizes,
    plan: GmmPlan,
    variant: GmmVariant = PLAIN,
    *,
    more_rhs=(),
    second_pair=(),
    epilogue_operands=(),
):
    """The kernel on checked operands, as ``plan`` says, computing ``variant``: builds the work
    list and launches one CTA per SM. ``NotImplementedError`` for a plan that says the kernel
    cannot run.

    ``more_rhs``: the variant's other ``num_rhs - 1`` weights, shaped like ``rhs``;
    ``second_pair``: ``(lhs2, rhs2)`` shaped like ``(lhs, rhs)`` for a ``paired`` variant;
    ``epilogue_operands``: the GPU memory operands its ``epilogue`` or ``k_step_scale`` reads.
    Returns one ``[M, N]`` result, or a tuple of the variant's ``num_outputs``. The tiles'
    ``split_last_round`` applies to a variant with a plain accumulator only
    (:attr:`.variant.GmmVariant.plain_accumulator`); the others run without it.
    """
    if plan.unsupported is not None:
        raise NotImplementedError(f"mosaic gmm: the plan refuses the operands: {plan.unsupported}")
    if len(more_rhs) != variant.num_rhs - 1 or bool(second_pair) != variant.paired:
        raise ValueError(
            f"mosaic gmm: {len(more_rhs)} `more_rhs` and second_pair={bool(second_pair)} do not "
            f"match the variant's num_rhs={variant.num_rhs}, paired={variant.paired}."
        )
    transpose_rhs, out_dtype, cfg = plan.transpose_rhs, plan.out_dtype, plan.tiles
    interpret_params = plan.interpret_params
    split = cfg.split_last_round and variant.plain_accumulator
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
        variant=variant,
        interpreted=interpret_params is not None,
    )
    out_types = (jax.ShapeDtypeStruct((m, n), out_dtype),) * variant.num_outputs
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
