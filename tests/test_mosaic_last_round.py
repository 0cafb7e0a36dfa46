"""The Mosaic ``gmm``'s last round cut into pieces of its K loop (``split_last_round``,
:mod:`jaxmoe.ops.mosaic.schedule`): the schedule's arithmetic against a
plain count and a brute-force choice of pieces, then the kernel with it, in Mosaic GPU's
interpreter, against the NumPy reference (the pieces' float32 partial sums and the fix-up that
adds them): as a pair in thirds (two parts on a CTA, a piece across the pair's products),
and plain in halves in clusters of two CTAs multicasting the weights (pairs sharing a group and
not), where a cut unit is an odd last item that both CTAs compute. On an H100
(docs/kernels.md, 'Mosaic gmm: last-round pieces, not stream-K') the results were checked
against the uncut kernel's from a NaN-poisoned buffer (the kernel alone leaves NaN where the
fix-up writes)."""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grouped_matmul import np_gmm, random_inputs

from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as fused_mosaic
from jaxmoe.ops.mosaic import launch as pallas_mosaic
from jaxmoe.ops.mosaic import persistent_loop as pallas_mosaic_common
from jaxmoe.ops.mosaic import schedule as pallas_mosaic_schedule
from jaxmoe.ops.mosaic import tiles as pallas_mosaic_tiles
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, default_mosaic_gmm_tiles

SIZES = [70, 0, 3, 100, 40]  # an empty group, groups cutting tiles, 43 tail rows (M = 256)


def best_pieces(rest, workers, steps):
    """Brute force: the pieces (1 = no cut) that make a last round of ``rest`` units on
    ``workers`` shortest, ``ceil(s * rest / workers) / s`` of a unit; the fewest on a tie."""
    if rest == 0:
        return 1
    candidates = range(1, min(pallas_mosaic_schedule.MAX_PIECES, steps) + 1)
    return min(candidates, key=lambda s: (Fraction(-(-s * rest // workers), s), s))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    units=st.integers(0, 600),
    workers=st.integers(1, 132),
    steps=st.integers(1, 40),
)
def test_every_unit_runs_whole_once_or_in_pieces(units, workers, steps):
    split = pallas_mosaic_schedule.LastRound.of(jnp.int32(units), workers, steps)
    rest = units % workers
    pieces = best_pieces(rest, workers, steps)
    want_cut = rest if pieces > 1 else 0
    assert int(split.cut_units) == want_cut
    assert int(split.whole_units) == units - want_cut
    if want_cut:
        assert int(split.pieces) == pieces
    # Whole units round-robin, then each worker's parts.
    ranges = {unit: [] for unit in range(units)}
    busy = np.zeros(workers, np.int64)
    for unit in range(int(split.whole_units)):
        ranges[unit].append((0, steps))
        busy[unit % workers] += steps
    slots = []
    for worker in range(workers):
        for index in range(int(split.parts_of(worker))):
            unit, first_step, count, slot = (int(v) for v in split.part(worker, index))
            assert count > 0
            ranges[unit].append((first_step, first_step + count))
            busy[worker] += count
            slots.append(slot)
    # Each part has its own workspace slot, within the workspace.
    assert sorted(slots) == list(range(pieces * want_cut))
    assert len(slots) <= pallas_mosaic_schedule.workspace_slots(workers)
    for unit_ranges in ranges.values():  # the K ranges of each unit partition [0, steps)
        unit_ranges.sort()
        assert unit_ranges[0][0] == 0 and unit_ranges[-1][1] == steps
        assert all(a[1] == b[0] for a, b in zip(unit_ranges, unit_ranges[1:], strict=False))
    # The last round takes ceil(pieces * rest / workers) pieces' K loops, not a whole unit's.
    rounds = -(-units // workers)
    last = -(-pieces * want_cut // workers) * -(-steps // pieces) if want_cut else steps
    assert busy.max(initial=0) <= (rounds - 1) * steps + last


def last_round(sizes, m, n, cfg, workers, steps):
    """The units and the last round for these groups (the kernel's own arithmetic)."""
    work = pallas_mosaic_schedule.WorkList.of(jnp.asarray(sizes, jnp.int32), m, cfg)
    units = pallas_mosaic_schedule.num_units(work, n // cfg.block_n, cfg)
    return int(units), pallas_mosaic_schedule.LastRound.of(units, workers, steps)


RING = MosaicTileConfig(64, 128, 64, stages=2, group_swizzle=2, ring=True, split_last_round=True)


# One kernel call for the cuts of several pieces: the pair in thirds, two parts on each CTA, a
# piece across the pair's two products. The plain product's cut (in halves): the clustered test
# below. Removed: "gmm-thirds" (the plain product in thirds, two parts on each CTA: the same
# parts here, and the plain product's cut in test_halves_in_clusters_of_two_ctas) and
# "pair-quarters" (four pieces: the arithmetic in test_every_unit_runs_whole_once_or_in_pieces,
# the kernel's parts and fix-up take any count of pieces alike, three here).
def test_pieces_of_the_last_round_add_up(monkeypatch):
    # 7 items x 2 N tiles of 6 K steps (3 per product): 14 units on 3 CTAs, the last 2 in
    # thirds of 2 K steps, [0, 2), [2, 4) (the first product's last step, the second's first)
    # and [4, 6); 6 parts, two on each CTA.
    ctas = 3
    monkeypatch.setattr(pallas_mosaic_common, "num_sms", lambda interpret: ctas)
    m, k, n = 256, 192, 256
    steps = pallas_mosaic_schedule.unit_steps(k, RING, paired=True)
    units, split = last_round(SIZES, m, n, RING, workers=ctas, steps=steps)
    assert (units, int(split.cut_units), int(split.pieces)) == (14, 2, 3)
    assert [int(split.parts_of(cta)) for cta in range(ctas)] == [2, 2, 2]
    lhs, rhs, _ = random_inputs(m, k, n, len(SIZES), "bfloat16", 3)
    lhs2, rhs2, _ = random_inputs(m, k, n, len(SIZES), "bfloat16", 4)
    sizes = jnp.asarray(SIZES, jnp.int32)
    got = pallas_mosaic.gmm_pair(lhs, rhs, lhs2, rhs2, sizes, tiles=RING)
    want = np_gmm(lhs, rhs, SIZES) + np_gmm(lhs2, rhs2, SIZES)
    got = np.asarray(got.astype(jnp.float32), np.float64)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= 1.6e-2
    assert np.all(got[sum(SIZES) :] == 0)


# Also the weight multicast's pairs at block_n 128 (m64n128 products, two 64-column chunks per
# slab: tried for the down projection's wave tail, not adopted), which had their own test in
# test_grouped_matmul_mosaic.py on 2 CTAs: the same pairs, sharing a group or not, and the odd
# last item, here with that item cut.
def test_halves_in_clusters_of_two_ctas(monkeypatch):
    # The default's layout at block_n 128 with the weight multicast on 4 CTAs (2 clusters taking
    # work items (2p, 2p + 1)): groups 0 and 1 have one item each (a pair of two groups: each
    # CTA loads its own weights), group 2's two items are one pair (the weights multicast),
    # group 3's one item is the odd last one (its partner recomputes it), then 68 tail rows
    # (zeros, each CTA its own tail tiles). One N tile, so 3 units on 2 clusters and the last
    # one cut in halves; the fix-up writes item 4's tile once.
    monkeypatch.setattr(pallas_mosaic_common, "num_sms", lambda interpret: 4)
    sizes = [100, 28, 256, 60]
    m, k, n = 512, 128, 128
    cfg = dataclasses.replace(
        default_mosaic_gmm_tiles(m, k, n),
        block_n=128,
        stages=3,
        group_swizzle=2,
        multicast_weights=True,
        split_last_round=True,
    )
    units, split = last_round(sizes, m, n, cfg, workers=2, steps=k // cfg.block_k)
    assert (units, int(split.cut_units), int(split.pieces)) == (3, 1, 2)
    lhs, rhs, _ = random_inputs(m, k, n, len(sizes), "bfloat16", 5)
    got = pallas_mosaic.gmm(lhs, rhs, jnp.asarray(sizes, jnp.int32), tiles=cfg)
    got = np.asarray(got.astype(jnp.float32), np.float64)
    want = np_gmm(lhs, rhs, sizes)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= 1.6e-2
    assert np.all(got[sum(sizes) :] == 0)


def test_only_plain_products_and_pairs_are_cut():
    # The fix-up adds the accumulator's partial sums, so a kernel with an epilogue (the fused
    # gated kernels, FP8) runs every unit whole on the same tiles: lowered for CUDA, the plain
    # product has the fix-up's scatter after its kernel, the fused down dgrad none.
    m, f, h = 256, 8192, 512
    tiles = dataclasses.replace(default_mosaic_gmm_tiles(m, f, h), split_last_round=True)
    assert tiles == default_mosaic_gmm_tiles(m, f, h)  # the default from K = 8192 up
    bf16 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((4,), jnp.int32)
    plain = jax.jit(functools.partial(pallas_mosaic.gmm, tiles=tiles, interpret=False))
    text = plain.trace(bf16((m, f)), bf16((4, f, h)), sizes).lower(lowering_platforms=("cuda",))
    assert "stablehlo.scatter" in text.as_text()
    fused = jax.jit(
        functools.partial(
            fused_mosaic.fused_down_dgrad, activation="swiglu", tiles=tiles, interpret=False
        )
    )
    lowered = fused.trace(bf16((m, f)), bf16((m, h)), bf16((m, h)), bf16((4, h, f)), sizes).lower(
        lowering_platforms=("cuda",)
    )
    assert "mosaic_gpu" in lowered.as_text() and "stablehlo.scatter" not in lowered.as_text()


def test_split_needs_the_ring():
    pallas_mosaic_tiles.check_tiles(RING)
    with pytest.raises(ValueError, match="split_last_round=True needs ring=True"):
        pallas_mosaic_tiles.check_tiles(dataclasses.replace(RING, ring=False))
