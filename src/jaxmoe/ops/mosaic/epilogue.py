"""The Mosaic GPU ``gmm``'s epilogue (:mod:`.gmm_kernel`): how a compute warpgroup's results
are staged in shared memory and stored by TMA.

Each result of a tile is cast and written a slab (``epilogue_rows`` rows of the warpgroup's
columns) at a time; the stores are not waited for (a buffer is rewritten only once its previous
store has read it), so the next tile's main loop overlaps them. Two ways to stage a slab::

    unswizzled   one ``[epilogue_rows, slab_cols]`` slab per compute warpgroup (a wider result
                 is staged a part at a time), so that a store may start at any row: a slab
                 cut by a group boundary stores its rows ``[lo, hi)`` as power-of-two runs,
                 because a TMA box has a static shape (``hi - lo = 0b1011`` is stored as runs
                 of 8, 2 and 1 rows). A whole slab is one store per part.
    swizzled     with ``swizzled_epilogue``, a whole slab is instead written in 64-column
                 chunks (one 128-byte row) to a 128-byte-swizzled buffer, which the ``wgmma``
                 registers write without shared-memory bank conflicts: two slots per
                 warpgroup, alternating, so one store stays in flight while the next chunk is
                 written. Cut slabs still take the unswizzled slab and its runs.

On the GPU the two buffers share one region of shared memory (``plgpu.RefUnion``: the ring
leaves no room for both), so a warpgroup switching between them first waits until its stores
have read the region; :func:`.tiles.epilogue_layout` pads the slab so that each
warpgroup's covers exactly its own slots. The interpreter has no aliased refs: two buffers there.
With ``split_last_round`` a third buffer in the same region stages the float32 partial sums of
the parts of cut units (:meth:`EpilogueStores.store_partial`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, epilogue_layout, swizzle_transforms
from jaxmoe.ops.mosaic.warpgroups import NUM_COMPUTE_WARPGROUPS


def epilogue_allocation(cfg: MosaicTileConfig, out_dtype, interpreted: bool, slab_cols=None):
    """The epilogue's shared-memory buffers, for ``pl.run_scoped``: the unswizzled slab, with
    ``swizzled_epilogue`` the swizzled slots, with ``split_last_round`` a float32 stage for partial
    sums (aliased on the GPU, separate buffers in the interpreter); :class:`EpilogueStores`
    takes what the scope gives."""
    # Unswizzled so that a run may start at any row (group boundaries are arbitrary); each
    # warpgroup's slab is its first stage_rows rows of slab_rows (see epilogue_layout).
    layout = epilogue_layout(cfg, jnp.dtype(out_dtype).itemsize, slab_cols)
    runs_alloc = plgpu.SMEM(
        (NUM_COMPUTE_WARPGROUPS, layout["slab_rows"], layout["slab_cols"]), out_dtype
    )
    buffers = [runs_alloc]
    if cfg.swizzled_epilogue:
        buffers.append(_swizzled_allocation(layout, out_dtype))
    if cfg.split_last_round:
        buffers.append(
            plgpu.SMEM(
                (NUM_COMPUTE_WARPGROUPS, layout["rows"], layout["partial_cols"]),
                jnp.float32,
            )
        )
    if len(buffers) == 1:
        return runs_alloc
    # On the GPU the buffers share one region (shared memory is full); a warpgroup switching
    # between them first waits until its stores have read it. The interpreter has no aliased
    # refs (and no shared-memory limit): separate buffers there.
    return tuple(buffers) if interpreted else plgpu.RefUnion(*buffers)


def _swizzled_allocation(layout, out_dtype):
    # Whole slabs: [stage_rows, chunk_cols] chunks, 128-byte swizzled (conflict-free writes of
    # the wgmma registers), two slots per warpgroup so that one store stays in flight.
    chunk_cols = layout["chunk_cols"]
    itemsize = jnp.dtype(out_dtype).itemsize
    return plgpu.SMEM(
        (NUM_COMPUTE_WARPGROUPS, layout["slots"], layout["rows"], chunk_cols),
        out_dtype,
        transforms=swizzle_transforms(chunk_cols * itemsize, itemsize),
    )


class EpilogueStores:
    """One compute warpgroup's stores of its tiles' results, through the buffers of
    :func:`epilogue_allocation` (``out_smem``, as the scope gives them) into ``out_gmems`` (one
    ``[M, N]`` ref per output). ``wg`` is the warpgroup's index, ``wg_row`` and ``wg_col`` its
    first row and column in a tile; ``slab_cols``: :func:`.tiles.epilogue_layout`'s
    (``epilogue_allocation`` must be given the same)."""

    def __init__(
        self, cfg: MosaicTileConfig, out_smem, out_gmems, *, wg, wg_row, wg_col, slab_cols=None
    ):
        self.cfg = cfg
        self.out_gmems = out_gmems
        self.out_dtype = out_gmems[0].dtype
        self.layout = epilogue_layout(cfg, jnp.dtype(self.out_dtype).itemsize, slab_cols)
        self.stage_rows = self.layout["rows"]
        self.wg_n = self.layout["wg_n"]
        self.wg = wg
        self.wg_row = wg_row
        self.wg_col = wg_col
        several = cfg.swizzled_epilogue or cfg.split_last_round  # see epilogue_allocation
        buffers = list(out_smem) if several else [out_smem]
        self.runs_smem = buffers.pop(0)
        self.swizzled_smem = buffers.pop(0) if cfg.swizzled_epilogue else None
        self.partial_smem = buffers.pop(0) if cfg.split_last_round else None

    def slabs_of(self, results):
        """``slab_results`` for :meth:`store`: the slabs of whole-tile ``results``."""
        rows = self.stage_rows
        return lambda first_row: tuple(r[first_row : first_row + rows] for r in results)

    def epilogue_slabs(self, epilogue, epilogue_gmem, acc, group, row0, col0):
        """``slab_results`` for :meth:`store`: ``epilogue`` (see :mod:`.gmm_kernel`;
        ``None`` for none) applied to one slab of ``acc`` at a time (its rows from ``row0 +
        wg_row + first_row``); it returns one value or a tuple of outputs."""
        if epilogue is None:
            return self.slabs_of((acc,))

        def slab(first_row):
            value = epilogue(
                acc[first_row : first_row + self.stage_rows],
                *epilogue_gmem,
                group=group,
                row0=row0 + self.wg_row + first_row,
                col0=col0 + self.wg_col,
            )
            return value if isinstance(value, tuple) else (value,)

        return slab

    def store_runs(self, stage, dst, part_lo, part_hi):
        """Slab rows ``[part_lo, part_hi)``, staged in the unswizzled ``stage``, as power-of-two
        runs (a TMA box has a static shape: ``0b1011`` rows are runs of 8, 2 and 1)."""
        size = part_hi - part_lo
        first = part_lo
        run = self.stage_rows
        while run >= 1:
            this_run = run

            @pl.when((size & this_run) != 0)
            def _store_run(first=first, this_run=this_run):
                plgpu.copy_smem_to_gmem(
                    stage.at[pl.ds(first, this_run)], dst.at[pl.ds(first, this_run)]
                )

            first = first + (size & this_run)
            run //= 2

    def store_swizzled(self, values, dst, first_store):
        """A whole slab through the swizzled slots: ``chunk_cols`` columns per TMA store; the
        slot alternates over a tile's stores (``first_store``: how many came before)."""
        chunk_cols, num_slots = self.layout["chunk_cols"], self.layout["slots"]
        for chunk in range(values.shape[1] // chunk_cols):
            slot = (first_store + chunk) % num_slots
            # At most one store in flight: the one from the other slot.
            plgpu.wait_smem_to_gmem(num_slots - 1, wait_read_only=True)
            cols = slice(chunk * chunk_cols, (chunk + 1) * chunk_cols)
            self.swizzled_smem[self.wg, slot] = values[:, cols]
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(
                self.swizzled_smem.at[self.wg, slot],
                dst.at[:, pl.ds(chunk * chunk_cols, chunk_cols)],
            )

    def stage_unswizzled(self, value):
        """``value`` written to this warpgroup's unswizzled slab, once the previous stores from
        it have read it; returns the slab."""
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        stage = self.runs_smem.at[self.wg, pl.ds(0, self.stage_rows)]
        stage[...] = value
        plgpu.commit_smem()
        return stage

    def staged_parts(self, value, dst):
        """``(stage, destination)`` for each ``slab_cols`` part of a slab ``value`` bound for
        ``dst``, staged in the unswizzled slab as it is asked for (each once the previous
        part's stores have read the slab)."""
        cols = self.layout["slab_cols"]
        for first_col in range(0, value.shape[1], cols):
            stage = self.stage_unswizzled(value[:, first_col : first_col + cols])
            yield stage, dst.at[:, pl.ds(first_col, cols)]

    def store_part(self, value, out_gmem, row0, col0, first_row, lo, hi, first_store, first_col):
        """Slab ``first_row // stage_rows`` of a compute warpgroup's result (``value``:
        ``[stage_rows, columns]`` from the warpgroup's column ``first_col``; ``first_row``
        counted from the warpgroup's first row), its rows in ``[lo, hi)`` of the tile only;
        ``first_store`` counts this warpgroup's swizzled stores of the tile so far (the slots
        alternate)."""
        rows, cols = self.stage_rows, value.shape[1]
        first_row = self.wg_row + first_row  # the slab's first row in the tile
        part_lo = jnp.clip(lo - first_row, 0, rows)
        part_hi = jnp.clip(hi - first_row, 0, rows)
        dst = out_gmem.at[
            pl.ds(row0 + first_row, rows), pl.ds(col0 + self.wg_col + first_col, cols)
        ]
        whole = (part_lo == 0) & (part_hi == rows)
        if not self.cfg.swizzled_epilogue:
            for stage, part_dst in self.staged_parts(value, dst):

                @pl.when(whole)
                def _store_whole(stage=stage, part_dst=part_dst):
                    plgpu.copy_smem_to_gmem(stage, part_dst)

                @pl.when(jnp.logical_not(whole))
                def _store_part(stage=stage, part_dst=part_dst):
                    self.store_runs(stage, part_dst, part_lo, part_hi)

            return

        @pl.when(whole)
        def _store_whole_swizzled():
            self.store_swizzled(value, dst, first_store)

        @pl.when(jnp.logical_not(whole))
        def _store_part_unswizzled():
            # The unswizzled slab aliases both swizzled slots: every store of this warpgroup
            # must have read it before it is written, and the runs must have been read before
            # the slots are written again.
            for stage, part_dst in self.staged_parts(value, dst):
                self.store_runs(stage, part_dst, part_lo, part_hi)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    def store(self, slab_results, row0, col0, lo, hi, *, first_col=0, first_store=0):
        """A compute warpgroup's results of one tile, rows ``[lo, hi)`` only, slab by slab:
        ``slab_results(first_row)`` gives the slab's ``[stage_rows, columns]`` value of each
        output (computing an epilogue a slab at a time keeps fewer values in registers): all
        the warpgroup's columns, or a part of them from its column ``first_col``, after
        ``first_store`` swizzled stores of the tile's earlier parts."""
        if self.cfg.swizzled_epilogue and self.layout["slots"] == 1:
            # One slot: the previous result's store must have been read.
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        stores = first_store
        for first_row in range(0, self.layout["wg_m"], self.stage_rows):
            values = slab_results(first_row)
            for value, out in zip(values, self.out_gmems, strict=True):
                value = value.astype(self.out_dtype)
                self.store_part(value, out, row0, col0, first_row, lo, hi, stores, first_col)
                stores += value.shape[1] // self.layout["chunk_cols"]

    def store_partial(self, acc, workspace_tile):
        """This warpgroup's share of a float32 accumulator ``acc`` (``[wg_m, wg_n]``) into its
        place in ``workspace_tile`` (``[block_m, block_n]`` float32): the partial sum of one
        part of a cut unit, staged ``[rows, partial_cols]`` at a time. Ends once the stores have
        read the stage, which aliases the other buffers."""
        rows, cols = self.stage_rows, self.layout["partial_cols"]
        stage = self.partial_smem.at[self.wg]
        for first_row in range(0, self.layout["wg_m"], rows):
            for first_col in range(0, self.wg_n, cols):
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                stage[...] = acc[first_row : first_row + rows, first_col : first_col + cols]
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(
                    stage,
                    workspace_tile.at[
                        pl.ds(self.wg_row + first_row, rows),
                        pl.ds(self.wg_col + first_col, cols),
                    ],
                )
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
