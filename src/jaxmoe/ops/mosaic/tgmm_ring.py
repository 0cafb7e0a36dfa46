"""The shared-memory ring both grouped wgrads run on (Pallas Mosaic GPU, Hopper): persistent,
warp-specialized ``tgmm`` kernels, ``out[g] = lhs[rows of g].T @ rhs[rows of g]``.

:func:`run_wgrad_ring` is what the bf16/fp16 wgrad (:mod:`.tgmm_kernel`) and the FP8 wgrad
(:mod:`jaxmoe.ops.fp8.pallas_mosaic_wgrad`) share: the ring's buffers and barriers
(:mod:`.ring`), the warpgroups' epilogue slabs, the memory warpgroup's loop over the CTA's tiles
and each compute warpgroup's, one float32 accumulator a tile. A kernel plugs in what differs as
a :class:`WgradVariant`: its tile walk, copies, ``wgmma`` and epilogue. Beside it, the geometry
both kernels' tiles share (a warpgroup's share of a tile, the epilogue slab, the shared memory
it all takes), the stores and the tiles' order. How it is built: docs/kernels.md, 'The wgrad'.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.mosaic.ring import ring_barriers, ring_consume, ring_produce
from jaxmoe.ops.mosaic.warpgroups import (
    NUM_COMPUTE_WARPGROUPS,
    STAGE_MAX_COLS,
    split_warpgroups,
    warpgroup_share,
)

# --- The tile geometry both wgrads' configs share ----------------------------------------------


def warpgroup_tile(cfg) -> tuple[int, int]:
    """The ``(rows, columns)`` of an output tile one compute warpgroup multiplies: half the rows
    with ``split_rows``, otherwise half the columns (the FP8 wgrad's configs: always)."""
    return warpgroup_share(cfg.block_k, cfg.block_n, getattr(cfg, "split_rows", False))


def epilogue_rows(cfg) -> int:
    """The rows of a warpgroup's epilogue slab (``cfg.epilogue_rows``, ``None`` meaning
    ``block_k``, at most a warpgroup's rows), for the bf16 and the FP8 wgrad's configs."""
    return min(cfg.epilogue_rows or cfg.block_k, warpgroup_tile(cfg)[0])


def epilogue_cols(cfg) -> int:
    """The columns of a warpgroup's epilogue slab: its tile's, at most
    ``STAGE_MAX_COLS`` (a wider tile is staged in parts)."""
    return min(warpgroup_tile(cfg)[1], STAGE_MAX_COLS)


def smem_bytes(cfg, operand_bytes: int = 2) -> int:
    """What :func:`run_wgrad_ring` allocates: the ring (``operand_bytes`` per element) and both
    warpgroups' 2-byte epilogue slabs."""
    ring = cfg.stages * cfg.block_m * (cfg.block_k + cfg.block_n) * operand_bytes
    return ring + NUM_COMPUTE_WARPGROUPS * epilogue_rows(cfg) * epilogue_cols(cfg) * 2


# --- The ring both wgrads run on ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SlotBuffer:
    """An operand's block in one ring slot: its ``shape``, ``dtype`` and shared-memory
    ``transforms`` (:func:`run_wgrad_ring` allocates ``stages`` of them)."""

    shape: tuple[int, ...]
    dtype: Any
    transforms: tuple


class WgradVariant(Protocol):
    """What a wgrad brings to :func:`run_wgrad_ring`. Built inside its kernel body, so its
    attributes may be traced values; the ring calls each method where its lowering belongs.

    Attributes:
      cfg: the tiles (``block_m``, ``block_k``, ``block_n``, ``stages``, ``epilogue_rows``;
        ``split_rows`` read by :func:`warpgroup_tile` when present).
      num_tiles: this CTA's output tiles (traced).
      cluster_wide: the ring's releases are cluster barriers (an operand multicast into both
        CTAs' slots, :func:`.ring.ring_barriers`).
      lhs_slot, rhs_slot: the two blocks a ring step loads (one copy each).
      out_dtype, out_transforms: the epilogue slab's (``[epilogue_rows, epilogue_cols]`` per
        compute warpgroup).
    """

    cfg: Any
    num_tiles: Any
    cluster_wide: bool
    lhs_slot: SlotBuffer
    rhs_slot: SlotBuffer
    out_dtype: Any
    out_transforms: tuple

    def tile_steps(self, local_tile) -> tuple[Any, Any]:
        """``(info, count)`` of this CTA's ``local_tile``-th tile: what the other methods read
        of it and its ring steps (``count >= 0``), the same for every warpgroup."""

    def load(self, info, i, lhs_slot, rhs_slot, barrier) -> None:
        """Starts step ``i``'s two TMA copies into the slot's blocks, arriving on ``barrier``."""

    def warpgroup(self, wg) -> Any:
        """What compute warpgroup ``wg`` reads of its share of a tile, made once before its
        tiles and handed to :meth:`mma` and :meth:`tile_epilogue`."""

    def mma(self, share, acc_ref, info, i, lhs_slot, rhs_slot) -> None:
        """Issues step ``i``'s ``wgmma`` into ``acc_ref`` (without waiting)."""

    def tile_epilogue(self, share, info, count, out_slab) -> Callable[[Any, Callable], None]:
        """``finish(acc_ref, contract)`` for the tile, made before its accumulator's scope
        opens (the tile's output addresses are computed there): ``finish`` calls
        ``contract()`` (the tile's ring steps, :meth:`mma` on each; only for ``count >= 1``),
        then stores the warpgroup's result by way of its slab ``out_slab``
        (:func:`store_tile`). Every tile is stored, an empty group's too."""


def run_wgrad_ring(variant: WgradVariant) -> None:
    """Inside a CTA of :func:`.persistent_loop.persistent_kernel`: the ring of ``cfg.stages``
    slots (:mod:`.ring`) and the warpgroups' epilogue slabs, the memory warpgroup's loads of
    every tile's steps and each compute warpgroup's tiles, one float32 accumulator a tile;
    ``variant`` says what a tile is, loads, multiplies and stores (:class:`WgradVariant`)."""
    cfg, stages = variant.cfg, variant.cfg.stages

    def ring_buffer(slot: SlotBuffer):
        return plgpu.SMEM((stages, *slot.shape), slot.dtype, transforms=slot.transforms)

    @functools.partial(
        pl.run_scoped,
        lhs_ring=ring_buffer(variant.lhs_slot),
        rhs_ring=ring_buffer(variant.rhs_slot),
        out_smem=plgpu.SMEM(
            (NUM_COMPUTE_WARPGROUPS, epilogue_rows(cfg), epilogue_cols(cfg)),
            variant.out_dtype,
            transforms=variant.out_transforms,
        ),
        **ring_barriers(stages, copies_per_step=2, cluster_wide=variant.cluster_wide),
        collective_axes="wg",
    )
    def _scope(lhs_ring, rhs_ring, out_smem, loaded, released):
        def memory_warpgroup():
            def load(info, i, slot):
                variant.load(info, i, lhs_ring.at[slot], rhs_ring.at[slot], loaded.at[slot])

            ring_produce(
                variant.num_tiles, variant.tile_steps, load, stages=stages, released=released
            )

        def compute_warpgroup(wg):
            share = variant.warpgroup(wg)

            def tile(local_tile, step):
                info, count = variant.tile_steps(local_tile)
                finish = variant.tile_epilogue(share, info, count, out_smem.at[wg])

                def acc_scope(acc_ref):
                    def mma(i, slot, carry):
                        variant.mma(share, acc_ref, info, i, lhs_ring.at[slot], rhs_ring.at[slot])
                        return carry

                    def contract():
                        ring_consume(
                            step, count, mma, None, stages=stages, loaded=loaded, released=released
                        )

                    finish(acc_ref, contract)

                pl.run_scoped(acc_scope, plgpu.ACC(warpgroup_tile(cfg), jnp.float32))
                return step + count

            lax.fori_loop(0, variant.num_tiles, tile, jnp.int32(0))
            plgpu.wait_smem_to_gmem(0)

        split_warpgroups(memory_warpgroup, compute_warpgroup)


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
