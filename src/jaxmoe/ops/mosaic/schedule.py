r"""Which units of work each CTA of the Mosaic ``gmm`` runs, and the split of the last round
along K (``MosaicTileConfig.split_last_round``).

A *unit* is one (work item, N tile) pair (:mod:`.work_list`), or with ``multicast_weights`` one
(pair of neighbouring work items, N tile) that a cluster of two CTAs runs, each CTA its item
(:func:`unit_tile`). Every unit is a whole ``block_m x block_n`` tile multiplied over the same
``steps`` K steps, so units cost the same, and ``P`` persistent workers (CTAs, or clusters)
taking them round-robin run ``ceil(U / P)`` rounds where ``U / P`` would do: the last round
leaves ``P - U % P`` workers idle (the Mixtral layer's down projection: 560 units on 66
clusters, 8.48 rounds' work in 9).

:class:`LastRound` cuts the last round's ``r = U % P`` units each into ``s`` pieces of its K
loop (``s`` of 2 to :data:`MAX_PIECES`, the one that makes the round shortest): the ``s r``
parts run round-robin on the workers, so the round takes ``ceil(s r / P) / s`` of a unit's time
(the Mixtral layer's down projection, 32 left on 66 clusters: halves, 1/2; the gemm bench's
balanced one, 1024 units, leaves 34: thirds, 2/3; with ``r <= P / 4``: quarters, 1/4).
Each part stores its float32 partial sum in workspace slot ``part``, and
:func:`last_round_fixup` adds unit ``t``'s slots ``t``, ``t + r``, ... and writes the owned
rows of its tile (one XLA scatter, after the kernel).

Why pieces of the last round only, not stream-K (every worker's share of the last two rounds
a contiguous range of K steps): CTAs that multiply tiles of one group and N column share its
weight blocks in L2 only while they walk K together, as whole units and these pieces do (each
piece starts at one of ``s`` K offsets). Stream-K's ranges start at ``P`` different offsets, so
each CTA streams its weights from HBM (measured: docs/kernels.md, 'Mosaic gmm: last-round pieces,
not stream-K').

Everything here is plain integer arithmetic on scalars, so the kernel (on values it reads from
GPU memory) and the fix-up (on arrays) share it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from jaxmoe.ops import work_list
from jaxmoe.ops.mosaic.persistent_loop import round_robin_count, round_robin_index
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, tile_align
from jaxmoe.ops.mosaic.warpgroups import MULTICAST_CLUSTER_CTAS
from jaxmoe.ops.pallas_common import swizzle

Array = jax.Array


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

    @classmethod
    def of(cls, group_sizes: Array, num_rows: int, cfg: MosaicTileConfig) -> WorkList:
        """The work list of ``group_sizes`` over ``num_rows`` rows in ``cfg``'s tiles (arrays)."""
        num_groups = group_sizes.shape[0]
        group, first_row, offsets = work_list.work_items(
            group_sizes, num_rows, cfg.block_m, tile_align=tile_align(cfg)
        )
        num_work = jnp.sum(group < num_groups).astype(jnp.int32)
        return cls(group, first_row, offsets, num_work, num_groups, num_rows)


def num_units(work: WorkList, num_n_tiles: int, cfg: MosaicTileConfig):
    """How many units there are: (item, N tile) pairs, or (pair of items, N tile) with
    ``multicast_weights``."""
    items = (work.num_work + 1) // 2 if cfg.multicast_weights else work.num_work
    return items * num_n_tiles


def unit_steps(k: int, cfg: MosaicTileConfig, paired: bool) -> int:
    """K steps of one unit: ``k / block_k``, twice for ``gmm_pair`` (its second product's steps
    run on after the first's, in one accumulator)."""
    return k // cfg.block_k * (2 if paired else 1)


def unit_tile(work: WorkList, unit, cta, num_n_tiles: int, cfg: MosaicTileConfig):
    """``(group, row0, lo, hi, col0, shared)`` of CTA ``cta``'s tile of ``unit``: its group, the
    tile's first row and column, the rows ``[lo, hi)`` of the tile it owns, and (with
    ``multicast_weights``) whether the unit's two items share a group, so their weight block is
    multicast. Units walk ``group_swizzle`` neighbouring items along N (neighbours share their
    operands in L2); with ``multicast_weights`` the cluster's unit is items ``2p`` (CTA 0) and
    ``2p + 1`` (CTA 1), an odd last item's partner recomputing it."""
    if cfg.multicast_weights:
        pair, n_tile = swizzle(unit, (work.num_work + 1) // 2, num_n_tiles, cfg.group_swizzle)
        first = 2 * pair
        second = jnp.minimum(first + 1, work.num_work - 1)
        item = jnp.where(cta == 0, first, second)
        shared = work.group[first] == work.group[second]
    else:
        item, n_tile = swizzle(unit, work.num_work, num_n_tiles, cfg.group_swizzle)
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


# The most pieces a cut unit's K loop is split into. Each piece is one more K offset that a set
# of CTAs walks (stream-K's ``P`` offsets cost L2 sharing) and one more float32 partial sum for
# the fix-up to read; four take the last round to at most 3/4 of a unit's time when it holds up
# to 3/4 of the workers' units.
MAX_PIECES = 4


@dataclasses.dataclass(frozen=True)
class LastRound:
    """The units of ``steps`` K steps each on ``workers`` workers: the first ``whole_units``
    round-robin, whole; then the last round's ``cut_units`` units, each cut into ``pieces``
    pieces of its K loop (``cut_units`` is 0 where no cut shortens the round).

    With ``r`` units left for a last round on ``P`` workers, cutting each into ``s`` pieces
    makes ``s r`` parts, round-robin on the workers: that round then takes
    ``ceil(s r / P) / s`` of a unit's time, and ``s`` is the one of ``2 .. MAX_PIECES`` (at
    most ``steps``) that makes it shortest, the fewest pieces on a tie; no cut where none is
    under a whole unit. E.g. ``r / P`` of 0.48: two halves (0.5); of 0.52: three thirds (2/3)."""

    whole_units: Array
    cut_units: Array
    pieces: Array
    workers: int
    steps: int

    @classmethod
    def of(cls, units, workers: int, steps: int) -> LastRound:
        rest = units % workers
        # The best last round so far, ``rounds / pieces`` of a unit's time: whole (1 / 1).
        rounds, pieces = jnp.int32(1), jnp.int32(1)
        for candidate in range(2, min(MAX_PIECES, steps) + 1):
            need = (candidate * rest + workers - 1) // workers
            shorter = (rest > 0) & (need * pieces < rounds * candidate)
            rounds = jnp.where(shorter, need, rounds)
            pieces = jnp.where(shorter, candidate, pieces)
        cut_units = jnp.where(pieces > 1, rest, 0)
        return cls(units - cut_units, cut_units, pieces, workers, steps)

    def parts_of(self, worker):
        """How many parts worker ``worker`` runs: parts ``worker``, ``worker + workers``, ...
        of the ``pieces * cut_units``."""
        return round_robin_count(self.pieces * self.cut_units, worker, self.workers)

    def part(self, worker, index):
        """``worker``'s ``index``-th part (``index < parts_of(worker)``): ``(unit, first_step,
        count, slot)``, K steps ``[first_step, first_step + count)`` of ``unit``, its float32
        partial sum to workspace slot ``slot`` (the part's number: piece ``slot // cut_units``
        of cut unit ``slot % cut_units``)."""
        slot = round_robin_index(index, worker, self.workers)
        cut = jnp.maximum(self.cut_units, 1)
        piece = slot // cut
        first_step = piece * self.steps // self.pieces
        count = (piece + 1) * self.steps // self.pieces - first_step
        return self.whole_units + slot % cut, first_step, count, slot


def workspace_slots(workers: int) -> int:
    """Workspace slots the parts may fill: ``pieces * cut_units <= (pieces - 1) * workers``
    (a cut round is shorter than a unit: ``ceil(pieces * cut_units / workers) < pieces``)."""
    return (MAX_PIECES - 1) * workers


def last_round_fixup(
    out: Array,
    workspace: Array,
    work: WorkList,
    *,
    workers: int,
    steps: int,
    num_n_tiles: int,
    cfg: MosaicTileConfig,
) -> Array:
    """``out`` with the cut units written: for each cut unit ``t``, the float32 partial sums of
    its pieces, workspace slots ``t``, ``t + r``, ... (per CTA of a cluster: ``workspace[slot *
    ctas + cta]``, ``[block_m, block_n]``) added and the owned rows of its tile stored (rows
    ``[lo, hi)``, as the kernel stores a tile)."""
    ctas = MULTICAST_CLUSTER_CTAS if cfg.multicast_weights else 1
    bm, bn = cfg.block_m, cfg.block_n
    split = LastRound.of(num_units(work, num_n_tiles, cfg), workers, steps)
    most = max((MAX_PIECES - 1) * workers // MAX_PIECES, 1)  # the most units cut
    unit_index = jnp.arange(most, dtype=jnp.int32)
    cut = unit_index < split.cut_units
    piece = jnp.arange(MAX_PIECES, dtype=jnp.int32)
    written = cut[:, None] & (piece[None, :] < split.pieces)  # [most, MAX_PIECES]
    # Slots not written point at slot 0, so that their (discarded) reads hit one cached tile.
    slot = jnp.where(written, piece[None, :] * split.cut_units + unit_index[:, None], 0)
    partials = workspace.reshape(workspace_slots(workers), ctas, bm, bn)
    sums = jnp.sum(jnp.where(written[..., None, None, None], partials[slot], 0.0), axis=1)
    unit = split.whole_units + jnp.where(cut, unit_index, 0)
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
