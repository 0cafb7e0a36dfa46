r"""Which units of work each CTA of the Mosaic ``gmm`` runs, and the stream-K split of the last
rounds (``MosaicTileConfig.stream_k``).

A *unit* is one (work item, N tile) pair (:mod:`.work_list`), or with ``multicast_weights`` one
(pair of neighbouring work items, N tile) that a cluster of two CTAs runs, each CTA its item
(:func:`unit_tile`). Every unit is a whole ``block_m x block_n`` tile multiplied over the same
``steps`` K steps, so units cost the same, and ``P`` persistent workers (CTAs, or clusters)
taking them round-robin run ``ceil(U / P)`` rounds where ``U / P`` would do: the last round
leaves ``P - U % P`` workers idle (the Mixtral layer's down projection: 552 units on 66
clusters, 8.36 rounds' work in 9).

Stream-K (Osama et al., 2023; CUTLASS's data-parallel + stream-K hybrid) evens this out: the
last ``P + U % P`` units (the last whole round and the partial one) are cut along K. Their
``(P + U % P) * steps`` K steps are split into ``P`` contiguous ranges of ``q = ceil((P + U % P)
* steps / P)`` steps, one per worker, so every worker ends within one K step of the others.
Since ``q >= steps``, a worker's range holds at most three *segments* (the end of one unit, a
whole one, the start of another) and a unit is cut by at most one range boundary: between
worker ``b - 1``'s last segment and worker ``b``'s first. A whole segment is stored as any
unit; a cut one stores its float32 partial sum in a workspace slot (``2b`` for a worker's first
segment, ``2b + 1`` for its last), and :func:`stream_k_fixup` adds slots ``2b - 1`` and ``2b``
and writes the sum's rows of the unit's tile (one XLA scatter, after the kernel).

Everything here is plain integer arithmetic on scalars, so the kernel (on values it reads from
GPU memory) and the fixup (on arrays) share it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from jaxmoe.ops.grouped_matmul import pallas_mosaic_common as common
from jaxmoe.ops.grouped_matmul import work_list
from jaxmoe.ops.grouped_matmul.pallas_mosaic_tiles import MosaicTileConfig, tile_align

Array = jax.Array

# A worker's stream-K range of q < 2 * steps K steps touches at most three units.
MAX_SEGMENTS = 3


@dataclasses.dataclass(frozen=True)
class WorkList:
    """The work list as the kernel reads it (refs) or the fixup does (arrays):
    ``group[W]``, ``first_row[W]``, ``offsets[G + 2]`` (:func:`.work_list.work_items`) and
    ``num_work``, the number of items with rows to multiply (the groups' items, first)."""

    group: Array
    first_row: Array
    offsets: Array
    num_work: Array
    num_groups: int
    num_rows: int


def num_units(work: WorkList, num_n_tiles: int, cfg: MosaicTileConfig):
    """How many units there are: (item, N tile) pairs, or (pair of items, N tile) with
    ``multicast_weights``."""
    items = (work.num_work + 1) // 2 if cfg.multicast_weights else work.num_work
    return items * num_n_tiles


def unit_tile(work: WorkList, unit, cta, num_n_tiles: int, cfg: MosaicTileConfig):
    """``(group, row0, lo, hi, col0, shared)`` of CTA ``cta``'s tile of ``unit``: its group, the
    tile's first row and column, the rows ``[lo, hi)`` of the tile it owns, and (with
    ``multicast_weights``) whether the unit's two items share a group, so their weight block is
    multicast. Units walk ``group_swizzle`` neighbouring items along N (neighbours share their
    operands in L2); with ``multicast_weights`` the cluster's unit is items ``2p`` (CTA 0) and
    ``2p + 1`` (CTA 1), an odd last item's partner recomputing it."""
    if cfg.multicast_weights:
        pair, n_tile = common.swizzle(
            unit, (work.num_work + 1) // 2, num_n_tiles, cfg.group_swizzle
        )
        first = 2 * pair
        second = jnp.minimum(first + 1, work.num_work - 1)
        item = jnp.where(cta == 0, first, second)
        shared = work.group[first] == work.group[second]
    else:
        item, n_tile = common.swizzle(unit, work.num_work, num_n_tiles, cfg.group_swizzle)
        shared = False
    return *item_rows(work, item, cfg), n_tile * cfg.block_n, shared


def item_rows(work: WorkList, item, cfg: MosaicTileConfig):
    """``(group, row0, lo, hi)`` of work item ``item``: its group, its tile's first row, and
    the rows ``[lo, hi)`` of the tile it owns."""
    group = work.group[item]
    first_row = work.first_row[item]
    row0 = work_list.tile_first_row(
        first_row, cfg.block_m, work.num_rows, tile_align=tile_align(cfg)
    )
    end = work.offsets[jnp.minimum(group + 1, work.num_groups + 1)]
    return group, row0, *work_list.rows_in_tile(first_row, row0, end, cfg.block_m)


@dataclasses.dataclass(frozen=True)
class StreamK:
    """The stream-K split of ``units`` units of ``steps`` K steps each over ``workers``
    workers: the first ``data_parallel_units`` round-robin, whole; the rest
    (``stream_k_units``, none when the units fill whole rounds or one round at most) in ranges
    of ``steps_per_worker`` K steps."""

    data_parallel_units: Array
    stream_k_units: Array
    steps_per_worker: Array
    steps: int

    @classmethod
    def of(cls, units, workers: int, steps: int) -> StreamK:
        rest = units % workers
        on = (units >= workers) & (rest > 0)
        stream_k_units = jnp.where(on, workers + rest, 0)
        return cls(
            data_parallel_units=units - stream_k_units,
            stream_k_units=stream_k_units,
            steps_per_worker=(stream_k_units * steps + workers - 1) // workers,
            steps=steps,
        )

    def segment(self, worker, index):
        """Segment ``index`` (``0 .. MAX_SEGMENTS - 1``) of ``worker``'s range: ``(unit,
        first_step, count, partial, slot)``. ``count`` (K steps from ``first_step``) is 0 for a
        segment past the range's end (``unit`` is then a valid unit, not to be run);
        ``partial``: the segment is not its unit's whole K loop, so its float32 sum goes to
        workspace ``slot``."""
        steps = self.steps
        total = self.stream_k_units * steps
        lo = jnp.minimum(worker * self.steps_per_worker, total)
        hi = jnp.minimum(lo + self.steps_per_worker, total)
        unit = lo // steps + index
        start = jnp.maximum(lo, unit * steps)
        count = jnp.maximum(jnp.minimum(hi, (unit + 1) * steps) - start, 0)
        first_step = start - unit * steps
        partial = (count > 0) & (count < steps)
        # A cut first segment starts inside its unit; a cut last one starts at its unit's start.
        slot = 2 * worker + (first_step == 0).astype(jnp.int32)
        last_unit = jnp.maximum(self.stream_k_units - 1, 0)
        unit = self.data_parallel_units + jnp.minimum(unit, last_unit)
        return unit, first_step, count, partial, slot


def stream_k_fixup(
    out: Array,
    workspace: Array,
    work: WorkList,
    *,
    workers: int,
    steps: int,
    num_n_tiles: int,
    cfg: MosaicTileConfig,
) -> Array:
    """``out`` with the units cut between two workers written: for each range boundary ``b``
    inside a unit, workspace slots ``2b - 1`` and ``2b`` (per CTA of a cluster: ``workspace[slot
    * ctas + cta]``, ``[block_m, block_n]`` float32) added and the owned rows of the unit's
    tile stored (rows ``[lo, hi)``, as the kernel stores a tile)."""
    ctas = common.MULTICAST_CLUSTER_CTAS if cfg.multicast_weights else 1
    bm, bn = cfg.block_m, cfg.block_n
    schedule = StreamK.of(num_units(work, num_n_tiles, cfg), workers, steps)
    boundary = jnp.arange(1, workers, dtype=jnp.int32)
    position = boundary * schedule.steps_per_worker
    cut = (position < schedule.stream_k_units * steps) & (position % steps != 0)
    unit = schedule.data_parallel_units + position // steps
    partials = workspace.reshape(workers, 2, ctas, bm, bn)
    # Worker b - 1's last segment (slot 2b - 1) and worker b's first (slot 2b).
    sums = partials[:-1, 1] + partials[1:, 0]  # [workers - 1, ctas, bm, bn]
    cta = jnp.arange(ctas, dtype=jnp.int32)
    _, row0, lo, hi, col0, _ = unit_tile(work, unit[:, None], cta[None, :], num_n_tiles, cfg)
    # An odd last item's partner (CTA 1 of a cluster) recomputed CTA 0's tile: written once.
    repeat = (cta[None, :] > 0) & (row0 == row0[:, :1]) & (lo == lo[:, :1])
    row = jnp.arange(bm, dtype=jnp.int32)[None, None, :]
    owned = (cut[:, None] & ~repeat)[..., None] & (row >= lo[..., None]) & (row < hi[..., None])
    # Rows not to write go past the array's end (each its own, so that the indices are unique
    # and XLA scatters in place), where the scatter drops them.
    window = jnp.arange(owned.size, dtype=jnp.int32).reshape(owned.shape)
    rows = jnp.where(owned, row0[..., None] + row, out.shape[0] + window)
    cols = jnp.broadcast_to(col0[..., None], rows.shape)
    indices = jnp.stack([rows, cols], axis=-1).reshape(-1, 2)
    updates = sums.astype(out.dtype).reshape(-1, bn)
    dimension_numbers = lax.ScatterDimensionNumbers(
        update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0, 1)
    )
    return lax.scatter(
        out,
        indices,
        updates,
        dimension_numbers,
        indices_are_sorted=False,
        unique_indices=True,
        mode=lax.GatherScatterMode.FILL_OR_DROP,
    )
