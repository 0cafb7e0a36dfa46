"""The bf16/fp16 grouped wgrad's kernel body on Hopper in Pallas Mosaic GPU: ``tgmm`` on the
shared ring of :mod:`.tgmm_ring`.

``out[g] = lhs[rows of g].T @ rhs[rows of g]`` (``[G, K, N]``), a contraction over each group's
rows, whose count is only known on the device: ``lhs [M, K]`` and ``rhs [M, N]`` row-major, a
tile's ring steps its group's ``block_m``-row blocks, the rows of a neighbour zeroed in shared
memory before the ``wgmma`` (:func:`mosaic_tgmm_body`); the row-block arithmetic it walks, and
that walk in plain JAX for the tests (:func:`simulate_tgmm`). Tiles, plan and launch:
:mod:`.tgmm_launch`. How it is built and measured: docs/kernels.md, 'The wgrad' and 'Mosaic
wgrad'.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.mosaic.persistent_loop import cta_tile_count, cta_tile_index
from jaxmoe.ops.mosaic.tgmm_ring import (
    SlotBuffer,
    epilogue_cols,
    run_wgrad_ring,
    store_tile,
    warpgroup_tile,
)
from jaxmoe.ops.mosaic.tiles import swizzle_transforms
from jaxmoe.ops.mosaic.warpgroups import CLUSTER_AXIS, MULTICAST_CLUSTER_CTAS
from jaxmoe.ops.pallas_common import swizzle


def cluster_ctas(cfg) -> int:
    """CTAs per cluster of a ``MosaicTgmmTileConfig``: two with ``multicast_rhs``, else one."""
    return MULTICAST_CLUSTER_CTAS if cfg.multicast_rhs else 1


def group_offsets(group_sizes: jax.Array, num_rows: int) -> jax.Array:
    """``[0, end_0, ..., end_{G-1}]``, ends clipped to ``num_rows`` (sizes may sum past ``M``):
    the bf16 wgrad's groups, as its kernel reads them."""
    ends = jnp.minimum(jnp.cumsum(group_sizes.astype(jnp.int32)), num_rows)
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), ends]).astype(jnp.int32)


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


def mosaic_tgmm_body(group_order_gmem, offsets_gmem, lhs_gmem, rhs_gmem, out_gmem, *, cfg) -> None:
    """The bf16/fp16 wgrad's kernel (:func:`.tgmm_launch.launch_tgmm` launches it): ``lhs
    [M, K]`` and ``rhs [M, N]`` row-major, groups ``offsets`` (:func:`group_offsets`) visited in
    ``group_order`` (:func:`.tgmm_ring.largest_first`), ``cfg`` a ``MosaicTgmmTileConfig``. A
    tile's steps are its group's row blocks; an empty group's tile takes one fully masked step
    (zeros, like every other tile's path)."""
    run_wgrad_ring(
        _RowBlockWgrad(cfg, group_order_gmem, offsets_gmem, lhs_gmem, rhs_gmem, out_gmem)
    )


class _RowBlockWgrad:
    """The bf16/fp16 wgrad as a :class:`.tgmm_ring.WgradVariant`: ``block_m``-row blocks of both
    operands, the rows outside the group zeroed before the ``wgmma``, ``lhs`` read transposed in
    place; with ``multicast_rhs`` clusters of two CTAs share each ``rhs`` block."""

    def __init__(self, cfg, group_order_gmem, offsets_gmem, lhs_gmem, rhs_gmem, out_gmem):
        self.cfg, self.group_order, self.offsets = cfg, group_order_gmem, offsets_gmem
        self.lhs_gmem, self.rhs_gmem, self.out_gmem = lhs_gmem, rhs_gmem, out_gmem
        num_groups, k, n = out_gmem.shape
        self.num_row_blocks = lhs_gmem.shape[0] // cfg.block_m
        self.num_k_tiles, self.num_n_tiles = k // cfg.block_k, n // cfg.block_n
        self.ctas = cluster_ctas(cfg)
        # The cluster's units of work (one tile each without clusters), round-robin over the grid.
        self.num_tiles = cta_tile_count(
            num_groups * (self.num_k_tiles // self.ctas) * self.num_n_tiles
        )
        self.cluster_cta = lax.axis_index(CLUSTER_AXIS) if self.ctas > 1 else 0
        self.cluster_wide = self.ctas > 1
        self.out_dtype = out_gmem.dtype
        dtype = lhs_gmem.dtype
        itemsize = jnp.dtype(dtype).itemsize
        # One swizzle for the blocks and the slab alike: rows of 64 operand elements.
        transforms = swizzle_transforms(64 * itemsize, itemsize)
        self.lhs_slot = SlotBuffer((cfg.block_m, cfg.block_k), dtype, transforms)
        self.rhs_slot = SlotBuffer((cfg.block_m, cfg.block_n), dtype, transforms)
        self.out_transforms = transforms

    def tile_steps(self, local_tile):
        cfg, bm = self.cfg, self.cfg.block_m
        group_slot, k_tile, n_tile = unit_tile(
            cta_tile_index(local_tile),
            self.cluster_cta,
            self.num_k_tiles,
            self.num_n_tiles,
            cfg.group_swizzle,
            self.ctas,
        )
        group = self.group_order[group_slot]
        start, end = self.offsets[group], self.offsets[group + 1]
        first_block, num_blocks = group_row_blocks(start, end, bm)
        # An empty group still takes one (fully masked) step, on a block that exists.
        first_block = jnp.minimum(first_block, self.num_row_blocks - 1)
        info = (group, k_tile * cfg.block_k, n_tile * cfg.block_n, start, end, first_block)
        return info, jnp.maximum(num_blocks, 1)

    def load(self, info, i, lhs_slot, rhs_slot, barrier):
        bm = self.cfg.block_m
        _, k0, col0, _, _, first_block = info
        rows = pl.ds((first_block + i) * bm, bm)
        plgpu.copy_gmem_to_smem(
            self.lhs_gmem.at[rows, pl.ds(k0, self.cfg.block_k)], lhs_slot, barrier
        )
        # With clusters both CTAs take these rows and columns: the copy is multicast (each
        # loads half; the slot's barrier expects the whole block either way).
        plgpu.copy_gmem_to_smem(
            self.rhs_gmem.at[rows, pl.ds(col0, self.cfg.block_n)],
            rhs_slot,
            barrier,
            collective_axes=CLUSTER_AXIS if self.ctas > 1 else None,
        )

    def warpgroup(self, wg):
        # The warpgroup's first output row (a column of lhs) and column in a tile.
        wg_k, wg_n = warpgroup_tile(self.cfg)
        wg_row = wg * wg_k if self.cfg.split_rows else 0
        wg_col = 0 if self.cfg.split_rows else wg * wg_n
        return wg_row, wg_col, pl.ds(wg_row, wg_k), pl.ds(wg_col, wg_n)

    def mma(self, share, acc_ref, info, i, lhs_slot, rhs_slot):
        bm = self.cfg.block_m
        wg_k, wg_n = warpgroup_tile(self.cfg)
        _, _, lhs_cols, wg_cols = share
        _, _, _, start, end, first_block = info
        lhs_block, rhs_block = lhs_slot.at[:, lhs_cols], rhs_slot.at[:, wg_cols]
        lo, hi = rows_in_group(start, end, (first_block + i) * bm, bm)

        @pl.when((lo > 0) | (hi < bm))
        def _mask_rows_outside_group():
            # The warpgroup's own blocks, at most 128 columns at a time (the registers); with
            # split rows both zero the whole rhs block alike.
            parts = [
                (block.at[:, pl.ds(first, min(width, 128))], min(width, 128))
                for block, width in ((lhs_block, wg_k), (rhs_block, wg_n))
                for first in range(0, width, 128)
            ]
            _zero_rows_outside(parts, lo, hi, bm)

        plgpu.wgmma(acc_ref, plgpu.transpose_ref(lhs_block, (1, 0)), rhs_block)

    def tile_epilogue(self, share, info, count, out_slab):
        wg_k, wg_n = warpgroup_tile(self.cfg)
        wg_row, wg_col, _, _ = share
        group, k0, col0 = info[:3]
        cols = epilogue_cols(self.cfg)

        def finish(acc_ref, contract):
            contract()  # every tile has a step (an empty group's fully masked)
            values = acc_ref[...].astype(self.out_dtype)
            for first in range(0, wg_n, cols):
                store_tile(
                    values if cols == wg_n else values[:, first : first + cols],
                    out_slab,
                    self.out_gmem.at[
                        group, pl.ds(k0 + wg_row, wg_k), pl.ds(col0 + wg_col + first, cols)
                    ],
                )

        return finish


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


def simulate_tgmm(lhs, rhs, group_sizes, block_m: int) -> jax.Array:
    """The bf16 kernel's row-block walk in plain JAX (float32): the same blocks, masks and zeros.

    For the tests, where Mosaic GPU's interpreter cannot run the kernel: every group visits
    :func:`group_row_blocks` and zeroes the rows :func:`rows_in_group` excludes, in both operands.
    (An empty group visits no block here; the kernel takes one block with every row masked:
    zeros either way.)
    """
    m = lhs.shape[0]
    offsets = group_offsets(group_sizes, m)
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
