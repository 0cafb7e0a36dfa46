"""Epilogue operands carried through the ring: the Mosaic ``gmm``'s ``[M, N]`` epilogue inputs
(the gated FFN's ``gate`` and ``up`` in the down projection's fused dgrad), streamed into shared
memory by the memory warpgroup as a few more ring steps after each tile's K steps.

Why through the ring: an epilogue that reads its operands from GPU memory itself waits for them
with the tensor cores idle, and the ring and the epilogue's slab fill shared memory, leaving no
room for a buffer of their own. A ring slot, once its K step has been multiplied, is free room:
the memory warpgroup loads the operands while the compute warpgroups still multiply the tile's
last K steps, as it loads the next tile's first blocks while they run the epilogue (measured:
docs/kernels.md, 'Mosaic epilogue: operands carried through the ring').

Layout of the steps (``split_rows`` tiles, the default)::

    a tile's epilogue steps   one per (column part, compute warpgroup): part ``p`` of warpgroup
                              ``w`` is step ``p * 2 + w``, so both warpgroups work at once
    one step                  ``[wg_m, part_cols]`` of each operand at the warpgroup's rows and
                              the part's columns; operand ``j`` in the slot's ``j``-th buffer (the
                              lhs block's, then the weight block's), viewed through a
                              ``plgpu.RefUnion`` as ``[wg_m, part_cols]`` blocks (the interpreter,
                              which has no aliased refs, gets separate buffers)
    consuming a part          each compute warpgroup waits for and releases the other
                              warpgroup's step (each tracks every slot's phase), waits for its
                              own, then, 64 columns at a time, reads the blocks into registers,
                              applies the epilogue to its accumulator's columns and stores them,
                              and releases its slot

Each step's copies are one per operand, so a step arrives on its slot's ``loaded`` barrier as
often as a K step does (one lhs and one weight copy): two operands.
"""

from __future__ import annotations

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.mosaic.tiles import (
    SWIZZLE_BYTES,
    MosaicTileConfig,
    warpgroup_tile,
)
from jaxmoe.ops.mosaic.warpgroups import NUM_COMPUTE_WARPGROUPS, STAGE_MAX_COLS

# The operands a step carries: one per copy of a K step (the lhs block and one weight block).
NUM_RING_OPERANDS = 2


def ring_operands_unsupported_reason(cfg: MosaicTileConfig, num_operands: int, itemsize: int):
    """Why the epilogue's operands cannot ride the ring of ``cfg``, or ``None``
    (``split_last_round`` aside: a kernel with an epilogue runs its units whole,
    :func:`.launch.launch_gmm`)."""
    reasons = []
    if not (cfg.ring and cfg.split_rows):
        reasons.append("epilogue operands ride the hand-written ring with split_rows tiles only")
    if num_operands != NUM_RING_OPERANDS:
        reasons.append(f"{num_operands} epilogue operands; the ring carries {NUM_RING_OPERANDS}")
    wg_m, _ = warpgroup_tile(cfg)
    if (cfg.epilogue_rows or cfg.block_m) < wg_m:
        reasons.append(f"epilogue_rows={cfg.epilogue_rows} below a warpgroup's {wg_m} rows")
    part_bytes = wg_m * part_columns(cfg) * itemsize
    for buffer, rows in (("lhs", cfg.block_m), ("weight", cfg.block_n)):
        slot_bytes = rows * cfg.block_k * itemsize
        if part_bytes > slot_bytes:
            reasons.append(
                f"an operand's [{wg_m}, {part_columns(cfg)}] part ({part_bytes} bytes) does not "
                f"fit the ring's {buffer} slot ({slot_bytes} bytes)"
            )
    return "; ".join(reasons) or None


def part_columns(cfg: MosaicTileConfig) -> int:
    """Columns of one step's part of a warpgroup's tile (the epilogue's slab width)."""
    return min(warpgroup_tile(cfg)[1], STAGE_MAX_COLS)


def apply_columns(cfg: MosaicTileConfig, itemsize: int) -> int:
    """Columns the epilogue applies at a time: one 128-byte row, the swizzle's width, and the
    swizzled epilogue's store (``epilogue_layout``'s ``chunk_cols``, which
    :meth:`RingOperands.store_columns` counts its stores by)."""
    return min(part_columns(cfg), SWIZZLE_BYTES // itemsize)


def scopes_per_tile(cfg: MosaicTileConfig, itemsize: int) -> int:
    """The profiler ranges :meth:`RingOperands.epilogue` records per tile and compute warpgroup
    (when compiled with a ``profile_space``): per part one ``operand_wait``, per applied column
    run an ``operand_read``, an ``epilogue_math`` and an ``epilogue_store``."""
    part_cols = part_columns(cfg)
    parts = warpgroup_tile(cfg)[1] // part_cols
    return parts * (1 + 3 * (part_cols // apply_columns(cfg, itemsize)))


class RingOperands:
    """The epilogue operands ``operands_gmem`` (``[M, N]`` refs) on the ring of ``cfg``."""

    def __init__(self, cfg: MosaicTileConfig, operands_gmem, transforms):
        assert (
            ring_operands_unsupported_reason(
                cfg, len(operands_gmem), operands_gmem[0].dtype.itemsize
            )
            is None
        )
        self.cfg = cfg
        self.operands_gmem = operands_gmem
        self.transforms = transforms
        self.wg_m, wg_n = warpgroup_tile(cfg)
        self.part_cols = part_columns(cfg)
        self.parts = wg_n // self.part_cols
        self.steps = NUM_COMPUTE_WARPGROUPS * self.parts
        self.apply_cols = apply_columns(cfg, operands_gmem[0].dtype.itemsize)

    def _view(self, slot_elements: int, dtype):
        # [stages, parts per slot, wg_m, part_cols]: slot s of the view lies in slot s of the
        # ring buffer (equal strides), its first part used.
        per_slot = slot_elements // (self.wg_m * self.part_cols)
        return plgpu.SMEM(
            (self.cfg.stages, per_slot, self.wg_m, self.part_cols),
            dtype,
            transforms=self.transforms,
        )

    def allocations(self, lhs_alloc, rhs_alloc, *, interpreted: bool):
        """The ring's lhs and weight buffers, each with the view of one operand's blocks."""
        cfg = self.cfg
        lhs_elements = cfg.block_m * cfg.block_k
        rhs_elements = cfg.block_n * cfg.block_k
        views = [
            self._view(lhs_elements, self.operands_gmem[0].dtype),
            self._view(rhs_elements, self.operands_gmem[1].dtype),
        ]
        pairs = [(lhs_alloc, views[0]), (rhs_alloc, views[1])]
        if interpreted:  # no aliased refs there: separate buffers
            return tuple(pairs)
        return tuple(plgpu.RefUnion(*pair) for pair in pairs)

    @staticmethod
    def split_ring(ring):
        """``(ring, views)``: the kernel's ring (``"lhs"``, ``"rhs"``: one weight buffer) as the
        scope gives it with :meth:`allocations`, split into the plain buffers and the operands'
        views."""
        (lhs_ring, lhs_view), (rhs_ring, rhs_view) = ring["lhs"], ring["rhs"][0]
        return {**ring, "lhs": lhs_ring, "rhs": [rhs_ring]}, (lhs_view, rhs_view)

    def load(self, views, row0, col0, step, slot, barrier):
        """The memory warpgroup's copies of the tile's epilogue step ``step`` (dynamic, from 0)
        into ring slot ``slot``."""
        warpgroup = lax.rem(step, NUM_COMPUTE_WARPGROUPS)
        part = lax.div(step, NUM_COMPUTE_WARPGROUPS)
        rows = pl.ds(row0 + warpgroup * self.wg_m, self.wg_m)
        cols = pl.ds(col0 + part * self.part_cols, self.part_cols)
        for operand, view in zip(self.operands_gmem, views, strict=True):
            plgpu.copy_gmem_to_smem(operand.at[rows, cols], view.at[slot, 0], barrier)

    @staticmethod
    def store_columns(stores, epilogue, group, row0, lo, hi, col0):
        """:meth:`epilogue`'s ``apply`` for a tile (``group``, its first row and column, its rows
        ``[lo, hi)``): ``epilogue(acc_columns, *operand_blocks, group=, row0=, col0=)`` (the
        columns' first row and column in the result), its results stored through ``stores``
        (an :class:`.epilogue.EpilogueStores`)."""

        def apply(first_col, acc_columns, *operand_blocks):
            # Scopes name the epilogue's pieces in Mosaic GPU's on-device profiler; without a
            # profile_space they cost nothing.
            with jax.named_scope("epilogue_math"):
                results = epilogue(
                    acc_columns,
                    *operand_blocks,
                    group=group,
                    row0=row0 + stores.wg_row,
                    col0=col0 + stores.wg_col + first_col,
                )
                results = results if isinstance(results, tuple) else (results,)
            chunks_before = first_col // stores.layout["chunk_cols"]
            with jax.named_scope("epilogue_store"):
                stores.store(
                    lambda first_row: results,
                    row0,
                    col0,
                    lo,
                    hi,
                    first_col=first_col,
                    first_store=chunks_before * len(results),
                )

        return apply

    def epilogue(self, acc, *, views, first_step, wg, loaded, released, apply, interpreted):
        """A compute warpgroup's side of the tile's epilogue steps, from global ring step
        ``first_step``: ``apply(first_col, acc_columns, *operand_blocks)`` maps the
        accumulator's columns from ``first_col`` and the operands' blocks there (in registers)
        to the results and stores them, ``apply_cols`` columns at a time.

        No branch on the warpgroup: each computes its own step's slot (a branch would carry the
        whole accumulator through a conditional). A part is applied ``apply_cols`` columns at a
        time, so that few operand registers are live beside the accumulator (ptxas spilled
        with whole parts). Measured: docs/kernels.md, 'Mosaic epilogue: operands carried
        through the ring'."""
        num_wgs = NUM_COMPUTE_WARPGROUPS
        for part in range(self.parts):
            part_step = first_step + part * num_wgs
            mine = lax.rem(part_step + wg, self.cfg.stages)
            # The other warpgroups' steps of this part: observed (each warpgroup tracks every
            # slot's phase) and released.
            with jax.named_scope("operand_wait"):
                for other in range(1, num_wgs):
                    theirs = lax.rem(part_step + lax.rem(wg + other, num_wgs), self.cfg.stages)
                    plgpu.barrier_wait(loaded.at[theirs])
                    plgpu.barrier_arrive(released.at[theirs])
                plgpu.barrier_wait(loaded.at[mine])
            for first in range(0, self.part_cols, self.apply_cols):
                cols = pl.ds(first, self.apply_cols)
                with jax.named_scope("operand_read"):
                    blocks = [self._read(view.at[mine, 0, :, cols], interpreted) for view in views]
                first_col = part * self.part_cols + first
                apply(first_col, acc[:, first_col : first_col + self.apply_cols], *blocks)
            plgpu.barrier_arrive(released.at[mine])

    @staticmethod
    def _read(block, interpreted: bool):
        if interpreted:  # the interpreter knows plain reads only, and no layouts
            return block[...]
        return plgpu.load(block, (), layout=plgpu.Layout.WGMMA)
