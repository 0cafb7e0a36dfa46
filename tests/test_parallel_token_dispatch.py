"""Deduplicated expert-parallel dispatch (``ep_dispatch="tokens"``) on 8 simulated CPU devices.

The sharded layer equals the one-device layer (forward, every gradient, the stats) over meshes
ep=2/4/8 and (data=2, ep=4), with random, skewed and empty-rank routings, the overflow
windows forced on (small ``ep_fast_slot_factor``) and off; runs are bitwise repeatable. (The
forward's all-to-all carrying ``P_pairs``-row slots, not the copies path's ``P``, and its
temporaries within a stated factor of the copies path's: tests/test_memory.py.)
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_parallel import MESHES, assert_same_layer, value_and_grads
from test_parallel import make_case as base_case

import jaxmoe
from jaxmoe import debug
from jaxmoe.parallel import layout


def make_case(num_experts=8, top_k=2, routing="uniform", ep=4, batch=8, seq=4, **cfg_kwargs):
    """``test_parallel.make_case`` with any E and K, and routings that need the rank count."""
    cfg, params, x, cotangent = base_case(
        batch=batch, seq=seq, num_experts=num_experts, top_k=top_k, **cfg_kwargs
    )
    # Selection bias (sigmoid scores lie in (0, 1), so +10 decides the choice).
    bias = np.zeros(num_experts, np.float32)
    if routing == "skewed":
        bias = np.linspace(0.6, 0.0, num_experts).astype(np.float32)
    elif routing == "one_expert":
        bias[3] = 10.0  # every token's first choice is expert 3
    elif routing == "empty_ranks":
        bias[: max(top_k, num_experts // ep)] = 10.0  # only rank 0's experts: others get nothing
    return cfg, {**params, "expert_bias": jnp.asarray(bias)}, x, cotangent


def run_both(mesh_name, **case):
    """(sharded with ep_dispatch='tokens', one device) results of one case."""
    mesh, data_axes = MESHES[mesh_name]
    factor = case.pop("factor", 1.125)
    exchange = case.pop("exchange", None)
    chunks = case.pop("chunks", 1)
    cfg, params, x, cotangent = make_case(ep=mesh.shape["ep"], **case)
    sharded = dataclasses.replace(
        cfg,
        ep_axis="ep",
        data_axes=data_axes,
        ep_dispatch="tokens",
        ep_fast_slot_factor=factor,
        ep_exchange=exchange,
        ep_chunks=chunks,
    )
    return value_and_grads(sharded, params, x, cotangent, mesh), value_and_grads(
        cfg, params, x, cotangent
    )


LAYER_CASES = [
    # (mesh, experts E, top_k K, routing, fast slot factor, overflow expected, exchange, chunks)
    # (ep2/8/2/uniform: ep2 below, uniform at ep4, K=2 of E=8 on data2_ep4.)
    # The other exchanges ride on overflowing cases (the exchange and ep_chunks are
    # independent of the routing and of each other; one compile for all three):
    # all_to_all_chunked on data2_ep4 here; all_gather in 2 chunks on ep4 in
    # test_parallel.py::test_chunks_needing_different_windows_match_single_device[tokens].
    ("data2_ep4", 8, 2, "empty_ranks", 1.125, True, "all_to_all_chunked", 1),
    ("ep2", 16, 8, "skewed", 1.125, None, None, 1),  # K_l = 8: ~every token reaches both ranks
    ("ep4", 32, 8, "uniform", 1.125, None, None, 1),  # the DeepSeek-like ratio, K=8 of E=32
    # Overflow windows forced on: slots of the balanced share (f=1), skewed routings.
    # (Merged away: ep4/E=16/K=4/one_expert/all_gather/2 chunks, a compile as costly as three
    # others: its exchange and chunks in the chunk-windows test named above, on a routing as
    # skewed (every copy of one chunk to rank 0), K_l = 4 ids per pair in ep8/E=32/K=8 below,
    # overflowing and run twice bitwise.)
    ("ep8", 32, 8, "empty_ranks", 1.0, True, None, 1),  # K_l = 4 ids per pair
    # Forced off: worst-case slots (P_pairs = T, Q = T*K_l): one window, no loop.
    # (Every mesh, routing, K_l, factor and exchange above appears at least once, overflowing
    # on each kind of mesh, the default exchange (None: all_to_all) on each mesh; each case
    # compiles a sharded program, and the suite's time is shared.)
    ("data2_ep4", 32, 8, "empty_ranks", None, False, None, 1),
]


@pytest.mark.parametrize(
    "mesh_name,num_experts,top_k,routing,factor,overflows,exchange,chunks", LAYER_CASES
)
def test_tokens_layer_matches_single_device(
    mesh_name, num_experts, top_k, routing, factor, overflows, exchange, chunks
):
    """And runs are bitwise repeatable (the overflow loop and its VJP where they run; the
    former test_tokens_is_bitwise_deterministic's data2_ep4 overflow and K_l = 4: the first and
    fourth cases)."""
    case = dict(
        num_experts=num_experts,
        top_k=top_k,
        routing=routing,
        factor=factor,
        exchange=exchange,
        chunks=chunks,
    )
    result, reference = run_both(mesh_name, **case)
    assert_same_layer(result, reference)
    stats = result[1][1]
    assert int(stats.dropped_tokens) == 0
    if overflows is not None:
        assert (int(stats.overflow_tokens) > 0) == overflows, int(stats.overflow_tokens)
    again, _ = run_both(mesh_name, **case)  # the same programs, run again
    for a, b in zip(jax.tree.leaves(result), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_poison_mode_reads_no_unwritten_row():
    mesh, _ = MESHES["ep4"]
    cfg, params, x, cotangent = make_case(16, 4, "skewed", alignment=4)
    sharded = dataclasses.replace(cfg, ep_axis="ep", ep_dispatch="tokens", ep_fast_slot_factor=1.0)
    # Against the one-device layer (which the sharded one equals unpoisoned: the tests above):
    # a cheaper compile than the unpoisoned sharded layer. Unaligned (the alignment only pads
    # the groups: the same result).
    reference = value_and_grads(dataclasses.replace(cfg, alignment=None), params, x, cotangent)
    with debug.poison_buffers():
        poisoned = value_and_grads(sharded, params, x, cotangent, mesh)
    for leaf in jax.tree.leaves(poisoned):
        assert np.all(np.isfinite(np.asarray(leaf, np.float64)))
    assert_same_layer(poisoned, reference)


# ---------------------------------------------------------------------------------------------
# Sizes, bytes and memory.


def test_slot_sizes():
    # K=8 of E=32 at ep=4: a token reaches a given rank with probability 1 - C(24,8)/C(32,8).
    assert layout.expected_pair_fraction(8, 32, 8) == pytest.approx(0.93008, abs=1e-5)
    # f * 0.930 T > T: capped at T (a rank gets at most every token once).
    assert layout.pair_slot_rows(4096, 8, 32, 4, 1.125) == 4096
    assert layout.pair_slot_rows(4096, 8, 32, 8, 1.125) == math.ceil(
        1.125 * 4096 * (1 - 3108105 / 10518300)
    )
    assert layout.pair_copy_rows(4096, 8, 32, 4, 1.125) == 9216  # the copies path's P, 2.25 T
    assert layout.slot_rows(4096, 8, 4, 8, receive_factor=1.125) == 9216
    # Mixtral-like K=2 of E=8 at ep=4: 0.464 T pairs vs 0.5 T copies per rank.
    assert layout.pair_slot_rows(4096, 2, 8, 4, 1.0) == math.ceil(4096 * (1 - 15 / 28))
    # Worst case and caps: T pairs, T*K_l copies; Q >= K_l so every window makes progress.
    assert layout.pair_slot_rows(64, 8, 32, 4, None) == 64
    assert layout.pair_copy_rows(64, 8, 32, 4, None) == 64 * 8
    assert layout.pair_slot_rows(8, 8, 16, 2, 8.0) == 8
    assert layout.pair_copy_rows(1, 8, 64, 8, 1.0) == 1 * 8


def _lowered_forward(cfg, mesh, tokens_per_rank, params):
    x = jnp.ones((mesh.size * tokens_per_rank, cfg.hidden_size), jnp.float32)
    return jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg, mesh=mesh)).lower(params, x).as_text()


def test_a_pair_that_can_only_be_one_copy_takes_the_copies_path():
    """E=8 over 8 ranks: one local expert per rank, so a pair holds one copy (K_l = 1) and
    "tokens" runs the copies path: the same program, text for text (so the same exchanges, no
    ids and weights beside them; lowered, not compiled: the same program compiles alike)."""
    mesh, _ = MESHES["ep8"]
    cfg = jaxmoe.MoEConfig(8, 2, 32, 16, ep_axis="ep", alignment=1)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    programs = {
        dispatch: _lowered_forward(dataclasses.replace(cfg, ep_dispatch=dispatch), mesh, 64, params)
        for dispatch in ("tokens", "copies")
    }
    assert programs["tokens"] == programs["copies"]
    wider = dataclasses.replace(cfg, num_experts=16)  # K_l = 2: the pair path, with metadata
    wider_params = jaxmoe.init_params(jax.random.key(0), wider)
    tokens = _lowered_forward(
        dataclasses.replace(wider, ep_dispatch="tokens"), mesh, 64, wider_params
    )
    copies = _lowered_forward(
        dataclasses.replace(wider, ep_dispatch="copies"), mesh, 64, wider_params
    )
    assert tokens != copies


def test_auto_dispatch_rule():
    """Copies per pair under uniform routing, and what "auto" picks from them."""
    cases = {  # (K, E, ep): (copies per pair, auto's choice)
        (8, 32, 2): (4.0, "tokens"),
        (8, 32, 4): (2.15, "tokens"),
        (8, 32, 8): (1.42, "copies"),
        (2, 8, 2): (1.27, "copies"),
        (8, 256, 8): (1.51, "tokens"),
        (8, 8, 8): (1.0, "copies"),  # one local expert: a pair is one copy
    }
    for (top_k, num_experts, ep), (copies, choice) in cases.items():
        assert layout.copies_per_pair(top_k, num_experts, ep) == pytest.approx(copies, abs=5e-3)
        assert layout.auto_dispatch(top_k, num_experts, ep, dropless=True) == choice
        assert layout.auto_dispatch(top_k, num_experts, ep, dropless=False) == "copies"


def test_auto_is_the_default_and_compiles_to_the_chosen_path():
    """The default config at K=8 of E=32 on EP=4 sends pairs (the "tokens" path), at K=2 of E=8
    copies; with a capacity it sends copies. "auto" lowers to the chosen path's program, text
    for text, and not to the other's (lowered, not compiled: the same program compiles alike)."""
    mesh, _ = MESHES["ep4"]

    def lowered(cfg, params):
        x = jnp.ones((mesh.size * 64, cfg.hidden_size), jnp.float32)
        return jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg, mesh=mesh)).lower(params, x).as_text()

    for top_k, num_experts, choice in ((8, 32, "tokens"), (2, 8, "copies")):
        cfg = jaxmoe.MoEConfig(num_experts, top_k, 32, 16, ep_axis="ep", alignment=1)
        assert cfg.ep_dispatch == "auto"
        params = jaxmoe.init_params(jax.random.key(0), cfg)
        auto = lowered(cfg, params)
        other = {"tokens": "copies", "copies": "tokens"}[choice]
        assert auto == lowered(dataclasses.replace(cfg, ep_dispatch=choice), params), choice
        assert auto != lowered(dataclasses.replace(cfg, ep_dispatch=other), params), other
    capped = jaxmoe.MoEConfig(32, 8, 32, 16, ep_axis="ep", alignment=1, capacity_factor=2.0)
    params = jaxmoe.init_params(jax.random.key(0), capped)
    copies = lowered(dataclasses.replace(capped, ep_dispatch="copies"), params)
    assert lowered(capped, params) == copies


# The temporaries within a stated factor of the copies path's, and the compiled forwards'
# pair-sized exchanges (``P_pairs``-row slots, the pairs' ids and weights beside them):
# tests/test_memory.py::test_dropless_ep_memory_near_fast_slots_and_tokens_near_copies,
# which compiles the same EP=8 programs for its copies-path bounds.


# ---------------------------------------------------------------------------------------------
# Errors.


def test_tokens_refuses_bounded_paths():
    base = dict(num_experts=8, top_k=2, hidden_size=8, ffn_size=16, ep_dispatch="tokens")
    with pytest.raises(ValueError, match=r"^MoEConfig\.ep_dispatch: .*dropless"):
        jaxmoe.MoEConfig(**base, capacity_factor=1.25)
    with pytest.raises(ValueError, match=r"^MoEConfig\.ep_dispatch: .*dropless"):
        jaxmoe.MoEConfig(**base, ep_receive_factor=1.5)
    with pytest.raises(ValueError, match="ep_dispatch"):
        jaxmoe.MoEConfig(**{**base, "ep_dispatch": "pairs"})
