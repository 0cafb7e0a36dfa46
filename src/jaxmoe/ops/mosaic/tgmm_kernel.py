"""Grouped wgrad on Hopper in Pallas Mosaic GPU: a persistent, warp-specialized ``tgmm``.

``out[g] = lhs[rows of g].T @ rhs[rows of g]`` (``[G, K, N]``), a contraction over each group's
rows, whose count is only known on the device: its tiles (:class:`MosaicTgmmTileConfig`), the
checks, the kernel body, its plan (:class:`TgmmPlan`) and launch. The FP8 wgrad shares the tile
order, the stores and :class:`TgmmPlan`. How it is built and measured: docs/kernels.md, 'The
wgrad' and 'Mosaic wgrad'.
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

from jaxmoe.ops.mosaic import persistent_loop
from jaxmoe.ops.mosaic.persistent_loop import cta_tile_count, cta_tile_index, persistent_kernel
from jaxmoe.ops.mosaic.ring import ring_barriers, ring_consume, ring_produce
from jaxmoe.ops.mosaic.tiles import tile_shape_reasons
from jaxmoe.ops.mosaic.warpgroups import (
    CLUSTER_AXIS,
    MULTICAST_CLUSTER_CTAS,
    NUM_COMPUTE_WARPGROUPS,
    STAGE_MAX_COLS,
    split_warpgroups,
    warpgroup_share,
)
from jaxmoe.ops.pallas_common import check_tgmm_operands, swizzle

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class MosaicTgmmTileConfig:
    """Block sizes of the Mosaic GPU ``tgmm`` (docs/kernels.md, 'The wgrad').

    ``block_m`` rows of the contraction per ring step; the output tile is ``block_k x block_n``
    (``block_k`` is ``wgmma``'s M: 64 or 128); ``stages``: the ring's depth; ``epilogue_rows``:
    the slab that stages a warpgroup's result (``None``: ``block_k``; ``block_k // 2`` stores it
    in halves and frees room for a fourth slot). ``split_rows`` (``block_k`` 128): the compute
    warpgroups split the tile's rows, as the ``gmm``'s option of that name; on in
    :func:`default_mosaic_tgmm_tiles`, off here so that a config naming ``block_k`` 64 stays
    valid. ``multicast_rhs``: clusters of two CTAs take neighbouring K tiles of one (group, N
    tile) and share each ``rhs`` block by TMA multicast; needs an even ``K / block_k``; off by
    default (exact, no faster).
    """

    block_m: int = 64
    block_k: int = 128
    block_n: int = 256
    stages: int = 4
    group_swizzle: int = 8
    epilogue_rows: int | None = 64
    split_rows: bool = False
    multicast_rhs: bool = False


def default_mosaic_tgmm_tiles(m: int, k: int, n: int) -> MosaicTgmmTileConfig:
    """Block sizes of the Mosaic ``tgmm``: ``64 x 128 x 256`` tiles, a 4-deep ring made to fit by
    storing the result in 64-row halves, and the compute warpgroups splitting the rows
    (``split_rows``); each the fastest of the variants measured (docs/kernels.md, 'Mosaic
    wgrad')."""
    del m, k, n
    return MosaicTgmmTileConfig(split_rows=True)


def check_tgmm_tiles(
    cfg: MosaicTgmmTileConfig, operand_bytes: int = 2, block_ms: tuple[int, ...] = (64, 128)
) -> None:
    """Raises ``ValueError`` for block sizes the kernel cannot lower or fit in shared memory
    (``operand_bytes``: 2 for bf16/fp16, 1 for the FP8 wgrad's; ``block_ms``: the contraction
    blocks its swizzle takes)."""
    problems = []
    smem = smem_bytes(cfg, operand_bytes)
    if cfg.block_m not in block_ms:
        problems.append(f"block_m={cfg.block_m} must be {' or '.join(map(str, block_ms))}")
    if cfg.block_k not in (64, 128):
        problems.append(f"block_k={cfg.block_k} must be 64 or 128 (wgmma's M per warpgroup)")
    if cfg.block_n not in (128, 256):
        problems.append(f"block_n={cfg.block_n} must be 128 or 256 (two warpgroups take half)")
    if cfg.stages < 2:
        problems.append(f"stages={cfg.stages} must be >= 2")
    if cfg.group_swizzle < 1:
        problems.append(f"group_swizzle={cfg.group_swizzle} must be >= 1")
    if getattr(cfg, "split_rows", False) and cfg.block_k != 128:
        problems.append(
            f"split_rows=True needs block_k=128 (64 rows, one wgmma M tile, per warpgroup), "
            f"not {cfg.block_k}"
        )
    if epilogue_rows(cfg) not in (cfg.block_k, cfg.block_k // 2) or epilogue_rows(cfg) < 64:
        problems.append(
            f"epilogue_rows={epilogue_rows(cfg)} must be block_k or block_k // 2, and >= 64 "
            "(wgmma's row blocks)"
        )
    if smem > SMEM_LIMIT:
        problems.append(f"{smem} bytes of shared memory > {SMEM_LIMIT} (fewer stages)")
    if problems:
        raise ValueError(f"{type(cfg).__name__}: " + "; ".join(problems) + ".")


SMEM_LIMIT = 227 * 1024  # an H100's per-block opt-in maximum


def epilogue_rows(cfg) -> int:
    """The rows of a warpgroup's epilogue slab (``cfg.epilogue_rows``, ``None`` meaning
    ``block_k``, at most a warpgroup's rows), for this kernel's and the FP8 wgrad's configs."""
    return min(cfg.epilogue_rows or cfg.block_k, warpgroup_tile(cfg)[0])


def warpgroup_tile(cfg) -> tuple[int, int]:
    """The ``(rows, columns)`` of an output tile one compute warpgroup multiplies: half the rows
    with ``split_rows``, otherwise half the columns (the FP8 wgrad's configs: always)."""
    return warpgroup_share(cfg.block_k, cfg.block_n, getattr(cfg, "split_rows", False))


def epilogue_cols(cfg) -> int:
    """The columns of a warpgroup's epilogue slab: its tile's, at most
    ``STAGE_MAX_COLS`` (a wider tile is staged in parts)."""
    return min(warpgroup_tile(cfg)[1], STAGE_MAX_COLS)


def smem_bytes(cfg: MosaicTgmmTileConfig, operand_bytes: int = 2) -> int:
    """The ring (``operand_bytes`` per element) and both warpgroups' 2-byte epilogue slabs."""
    ring = cfg.stages * cfg.block_m * (cfg.block_k + cfg.block_n) * operand_bytes
    return ring + NUM_COMPUTE_WARPGROUPS * epilogue_rows(cfg) * epilogue_cols(cfg) * 2


def unsupported_tgmm_reason(
    lhs_shape, rhs_shape, dtype, out_dtype, cfg: MosaicTgmmTileConfig, interpret: bool = False
) -> str | None:
    """Why the Mosaic ``tgmm`` cannot take ``lhs [M, K]``, ``rhs [M, N]``, or ``None``."""
    m, k = lhs_shape
    n = rhs_shape[1]
    reasons = []
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        reasons.append(f"operands are {jnp.dtype(dtype)}, not bf16/fp16")
    reasons += tile_shape_reasons(m, k, n, cfg, out_dtype, interpret)
    k_tiles = k // cfg.block_k
    if cfg.multicast_rhs and k % cfg.block_k == 0 and k_tiles % cluster_ctas(cfg):
        reasons.append(
            f"multicast_rhs=True pairs neighbouring K tiles, and K / block_k = {k_tiles} is odd"
        )
    if interpret:
        reasons.append("Mosaic GPU's interpreter has no transposed wgmma operand (wgrad)")
    return "; ".join(reasons) or None


def cluster_ctas(cfg: MosaicTgmmTileConfig) -> int:
    """CTAs per cluster: two with ``multicast_rhs``, else one."""
    return MULTICAST_CLUSTER_CTAS if cfg.multicast_rhs else 1


def unit_tile(
    index, cluster_cta, num_k_tiles: int, num_n_tiles: int, group_swizzle: int, ctas: int
):
    """The output tile CTA ``cluster_cta`` of a cluster of ``ctas`` takes for the cluster's
    ``index``-th unit of work: ``(group slot, K tile, N tile)``, the slot indexing the groups'
    largest-first order. A unit is ``ctas`` neighbouring K tiles (``ctas * u + cluster_cta``) of
    one (group, N tile), so the cluster's CTAs contract the same ``rhs`` rows; a group's units
    are swizzled as its tiles are without clusters (``ctas`` 1: the tile order itself)."""
    k_units = num_k_tiles // ctas
    units_per_group = k_units * num_n_tiles
    k_unit, n_tile = swizzle(index % units_per_group, k_units, num_n_tiles, group_swizzle)
    return index // units_per_group, k_unit * ctas + cluster_cta, n_tile


def group_row_blocks(start, end, block_m: int):
    """The ``block_m``-aligned row blocks that hold rows ``[start, end)``: (first, count)."""
    first = start // block_m
    count = jnp.where(end > start, pl.cdiv(end, block_m) - first, 0)
    return first, count


def rows_in_group(start, end, row0, block_m: int):
    """Rows ``[lo, hi)`` of the block starting at ``row0`` are in the group ``[start, end)``."""
    return jnp.clip(start - row0, 0, block_m), jnp.clip(end - row0, 0, block_m)


def _jaxmoe_mosaic_tgmm(
    group_order_gmem, offsets_gmem, lhs_gmem, rhs_gmem, out_gmem, *, cfg: MosaicTgmmTileConfig
):
    """The kernel (see the module docstring), on the ring of :mod:`.ring`: a
    tile's steps are its group's row blocks; an empty group's tile takes one fully masked step
    (zeros, like every other tile's path)."""
    bm, bk, bn, stages = cfg.block_m, cfg.block_k, cfg.block_n, cfg.stages
    wg_k, wg_n = warpgroup_tile(cfg)
    num_groups, k, n = out_gmem.shape
    num_row_blocks = lhs_gmem.shape[0] // bm
    num_k_tiles, num_n_tiles = k // bk, n // bn
    ctas = cluster_ctas(cfg)
    # The cluster's units of work (one tile each without clusters), round-robin over the grid.
    my_tiles = cta_tile_count(num_groups * (num_k_tiles // ctas) * num_n_tiles)
    cluster_cta = lax.axis_index(CLUSTER_AXIS) if ctas > 1 else 0
    out_dtype = out_gmem.dtype
    dtype = lhs_gmem.dtype
    itemsize = jnp.dtype(dtype).itemsize
    swizzle = plgpu.find_swizzle(64 * itemsize * 8)
    transforms = (
        plgpu.TilingTransform((8, swizzle // itemsize)),
        plgpu.SwizzleTransform(swizzle),
    )

    def tile_info(local_tile):
        group_slot, k_tile, n_tile = unit_tile(
            cta_tile_index(local_tile),
            cluster_cta,
            num_k_tiles,
            num_n_tiles,
            cfg.group_swizzle,
            ctas,
        )
        group = group_order_gmem[group_slot]
        start, end = offsets_gmem[group], offsets_gmem[group + 1]
        first_block, num_blocks = group_row_blocks(start, end, bm)
        # An empty group still takes one (fully masked) step, on a block that exists.
        first_block = jnp.minimum(first_block, num_row_blocks - 1)
        info = (group, k_tile * bk, n_tile * bn, start, end, first_block)
        return info, jnp.maximum(num_blocks, 1)

    @functools.partial(
        pl.run_scoped,
        lhs_ring=plgpu.SMEM((stages, bm, bk), dtype, transforms=transforms),
        rhs_ring=plgpu.SMEM((stages, bm, bn), dtype, transforms=transforms),
        out_smem=plgpu.SMEM(
            (NUM_COMPUTE_WARPGROUPS, epilogue_rows(cfg), epilogue_cols(cfg)),
            out_dtype,
            transforms=transforms,
        ),
        **ring_barriers(stages, copies_per_step=2, cluster_wide=ctas > 1),
        collective_axes="wg",
    )
    def _scope(lhs_ring, rhs_ring, out_smem, loaded, released):
        def memory_warpgroup():
            def load(info, i, slot):
                _, k0, col0, _, _, first_block = info
                rows = pl.ds((first_block + i) * bm, bm)
                barrier = loaded.at[slot]
                plgpu.copy_gmem_to_smem(
                    lhs_gmem.at[rows, pl.ds(k0, bk)], lhs_ring.at[slot], barrier
                )
                # With clusters both CTAs take these rows and columns: the copy is multicast
                # (each loads half; the slot's barrier expects the whole block either way).
                plgpu.copy_gmem_to_smem(
                    rhs_gmem.at[rows, pl.ds(col0, bn)],
                    rhs_ring.at[slot],
                    barrier,
                    collective_axes=CLUSTER_AXIS if ctas > 1 else None,
                )

            ring_produce(my_tiles, tile_info, load, stages=stages, released=released)

        def compute_warpgroup(wg):
            # The warpgroup's first output row (a column of lhs) and column in a tile.
            wg_row = wg * wg_k if cfg.split_rows else 0
            wg_col = 0 if cfg.split_rows else wg * wg_n
            lhs_cols, wg_cols = pl.ds(wg_row, wg_k), pl.ds(wg_col, wg_n)

            def tile(local_tile, step):
                (group, k0, col0, start, end, first_block), count = tile_info(local_tile)

                def acc_scope(acc_ref):
                    def mma(i, slot, carry):
                        lhs_block = lhs_ring.at[slot].at[:, lhs_cols]
                        rhs_block = rhs_ring.at[slot].at[:, wg_cols]
                        lo, hi = rows_in_group(start, end, (first_block + i) * bm, bm)

                        @pl.when((lo > 0) | (hi < bm))
                        def _mask_rows_outside_group():
                            # The warpgroup's own blocks, at most 128 columns at a time (the
                            # registers); with split rows both zero the whole rhs block alike.
                            parts = [
                                (block.at[:, pl.ds(first, min(width, 128))], min(width, 128))
                                for block, width in ((lhs_block, wg_k), (rhs_block, wg_n))
                                for first in range(0, width, 128)
                            ]
                            _zero_rows_outside(parts, lo, hi, bm)

                        plgpu.wgmma(acc_ref, plgpu.transpose_ref(lhs_block, (1, 0)), rhs_block)
                        return carry

                    ring_consume(
                        step, count, mma, None, stages=stages, loaded=loaded, released=released
                    )
                    values = acc_ref[...].astype(out_dtype)
                    cols = epilogue_cols(cfg)
                    for first in range(0, wg_n, cols):
                        store_tile(
                            values if cols == wg_n else values[:, first : first + cols],
                            out_smem.at[wg],
                            out_gmem.at[
                                group, pl.ds(k0 + wg_row, wg_k), pl.ds(col0 + wg_col + first, cols)
                            ],
                        )

                pl.run_scoped(acc_scope, plgpu.ACC((wg_k, wg_n), jnp.float32))
                return step + count

            lax.fori_loop(0, my_tiles, tile, jnp.int32(0))
            plgpu.wait_smem_to_gmem(0)

        split_warpgroups(memory_warpgroup, compute_warpgroup)


def _zero_rows_outside(refs_and_widths, lo, hi, block_m: int) -> None:
    """Sets the rows outside ``[lo, hi)`` of each ``[block_m, width]`` shared-memory block to zero
    (not just ignored: ``0 * NaN`` would leak a neighbour's NaN into the sum)."""
    for ref, width in refs_and_widths:
        rows = plgpu.layout_cast(
            lax.broadcasted_iota(jnp.int32, (block_m, width), 0), plgpu.Layout.WGMMA
        )
        values = ref[...]
        ref[...] = jnp.where((rows >= lo) & (rows < hi), values, 0).astype(values.dtype)
    plgpu.commit_smem()  # generic-proxy writes, then wgmma's async-proxy reads


def store_tile(values, stage, out_ref) -> None:
    """Stages a compute warpgroup's tile in shared memory and stores it by TMA, not waiting: the
    next tile waits only until this stage has been read. A ``stage`` of fewer rows than
    ``values`` takes them in parts, each waiting until the previous part has been read."""
    rows = stage.shape[0]
    for first in range(0, values.shape[0], rows):
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        stage[...] = values if rows == values.shape[0] else values[first : first + rows]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(stage, out_ref.at[pl.ds(first, rows)])


def largest_first(group_sizes) -> jax.Array:
    """``[G]`` int32: the groups in the wgrads' tile order, largest first (a tile's cost is its
    group's row count, so the long ones start first); stable, so equal sizes keep their order
    and neighbours share L2."""
    return jnp.argsort(-group_sizes, stable=True).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class TgmmPlan:
    """How a Mosaic ``tgmm`` (this one or the FP8 wgrad) runs one call, decided once, before
    tracing: its ``tiles`` (checked), ``out_dtype``, ``interpret_params`` (``None`` on a GPU)
    and ``unsupported``, why the kernel cannot take the operands (``None`` if it can; such a
    plan is never launched)."""

    tiles: Any
    out_dtype: jnp.dtype
    interpret_params: Any
    unsupported: str | None = None

    @property
    def interpreted(self) -> bool:
        return self.interpret_params is not None

    def refuse(self) -> None:
        """``NotImplementedError`` for a plan that says the kernel cannot run."""
        if self.unsupported is not None:
            raise NotImplementedError(
                f"mosaic tgmm: the plan refuses the operands: {self.unsupported}"
            )


def plan_tgmm(lhs_shape, rhs_shape, dtype, *, out_dtype, tiles, interpret) -> TgmmPlan:
    """The plan of ``tgmm(lhs [M, K], rhs [M, N])``: ``tiles`` or the default, checked; whether
    it runs in the interpreter; and :func:`unsupported_tgmm_reason`."""
    m, k = lhs_shape
    n = rhs_shape[1]
    out_dtype = jnp.dtype(out_dtype or dtype)
    cfg = tiles or default_mosaic_tgmm_tiles(m, k, n)
    check_tgmm_tiles(cfg)
    interpret_params = persistent_loop.interpret_params(interpret)
    reason = unsupported_tgmm_reason(
        lhs_shape, rhs_shape, dtype, out_dtype, cfg, interpret_params is not None
    )
    return TgmmPlan(cfg, out_dtype, interpret_params, reason)


def tgmm(
    lhs: Array,
    rhs: Array,
    group_sizes: Array,
    *,
    out_dtype=None,
    tiles: MosaicTgmmTileConfig | None = None,
    interpret: bool | None = None,
) -> Array:
    """``out[g] = lhs[rows of g]^T @ rhs[rows of g]``; zeros for empty groups; ``[G, K, N]``.

    Same contract as :func:`jaxmoe.ops.grouped_matmul.pallas_triton.tgmm`; the operands must pass
    :func:`unsupported_tgmm_reason` (bf16/fp16, dims divisible by the blocks, a Hopper GPU).
    Checks its arguments (``ValueError``) and refuses what the kernel cannot take
    (``NotImplementedError``, why).
    """
    check_tgmm_operands(lhs, rhs, group_sizes)
    plan = plan_tgmm(
        lhs.shape, rhs.shape, lhs.dtype, out_dtype=out_dtype, tiles=tiles, interpret=interpret
    )
    if plan.unsupported is not None:
        raise NotImplementedError(
            f"mosaic tgmm: lhs {lhs.shape} {lhs.dtype}, rhs {rhs.shape}, out {plan.out_dtype}: "
            f"{plan.unsupported}. Use backend='pallas_triton', or 'auto', which picks the "
            "Triton kernel."
        )
    return launch_tgmm(lhs, rhs, group_sizes, plan)


def launch_tgmm(lhs: Array, rhs: Array, group_sizes: Array, plan: TgmmPlan) -> Array:
    """The kernel on checked operands, as ``plan`` says: one CTA per SM."""
    plan.refuse()
    m, k = lhs.shape
    n = rhs.shape[1]
    num_groups = group_sizes.shape[0]
    cfg, out_dtype, interpret_params = plan.tiles, plan.out_dtype, plan.interpret_params
    if num_groups == 0:
        return jnp.zeros((0, k, n), out_dtype)
    offsets = _offsets(group_sizes, m)
    group_order = largest_first(offsets[1:] - offsets[:-1])
    kernel = persistent_kernel(
        functools.partial(_jaxmoe_mosaic_tgmm, cfg=cfg),
        jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
        interpret_params,
        cluster_ctas=cluster_ctas(cfg),
    )
    return kernel(group_order, offsets, lhs, rhs)


def _offsets(group_sizes: Array, num_rows: int) -> Array:
    """``[0, end_0, ..., end_{G-1}]``, ends clipped to ``num_rows`` (sizes may sum past ``M``)."""
    ends = jnp.minimum(jnp.cumsum(group_sizes.astype(jnp.int32)), num_rows)
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), ends]).astype(jnp.int32)


def simulate_tgmm(lhs, rhs, group_sizes, block_m: int) -> Array:
    """The kernel's row-block walk in plain JAX (float32): the same blocks, masks and zeros.

    For the tests, where Mosaic GPU's interpreter cannot run the kernel: every group visits
    :func:`group_row_blocks` and zeroes the rows :func:`rows_in_group` excludes, in both operands.
    (An empty group visits no block here; the kernel takes one block with every row masked:
    zeros either way.)
    """
    m = lhs.shape[0]
    offsets = _offsets(group_sizes, m)
    lhs_blocks = lhs.astype(jnp.float32).reshape(m // block_m, block_m, -1)
    rhs_blocks = rhs.astype(jnp.float32).reshape(m // block_m, block_m, -1)
    rows = jnp.arange(block_m)[:, None]

    def one_group(start, end):
        first, count = group_row_blocks(start, end, block_m)

        def step(i, acc):
            block = jnp.minimum(first + i, m // block_m - 1)  # the loop never reads past count
            lo, hi = rows_in_group(start, end, block * block_m, block_m)
            keep = (rows >= lo) & (rows < hi)
            a = jnp.where(keep, lhs_blocks[block], 0)
            b = jnp.where(keep, rhs_blocks[block], 0)
            return acc + jnp.dot(a.T, b, precision=lax.Precision.HIGHEST)

        zero = jnp.zeros((lhs.shape[1], rhs.shape[1]), jnp.float32)
        return lax.fori_loop(0, count, step, zero)

    return jax.vmap(one_group)(offsets[:-1], offsets[1:])
