"""The activation-memory formulas of docs/memory.md against XLA's memory analysis."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_ep_dispatch_model import assert_exchange_bytes
from test_parallel_exchange import collectives

import jaxmoe
from jaxmoe.parallel import layout
from tests.xla_cpu import jit_xla_defaults

# (T, H, F, E, K, capacity_factor); capacity mode makes R exact: R = E * ceil(c*T*K/E).
CASES = [
    (1024, 64, 128, 8, 2, 1.0),
    (2048, 256, 64, 32, 8, 1.0),
    (1024, 128, 512, 16, 4, 2.0),
]
FORWARD_BAND = (0.9, 1.25)
TRAINING_BAND = (1.0, 2.0)


def _rows(num_tokens, num_experts, top_k, capacity_factor):
    return num_experts * math.ceil(capacity_factor * num_tokens * top_k / num_experts)


@pytest.mark.parametrize("case", CASES)
def test_forward_and_training_peak_match_formula(case):
    num_tokens, hidden, ffn, num_experts, top_k, factor = case
    cfg = jaxmoe.MoEConfig(num_experts, top_k, hidden, ffn, capacity_factor=factor, alignment=1)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jnp.ones((num_tokens, hidden), jnp.float32)
    rows, itemsize = _rows(num_tokens, num_experts, top_k, factor), 4

    forward = jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg)[0]).lower(params, x).compile()
    analysis = forward.memory_analysis()
    if analysis is None:
        pytest.skip("this jaxlib gives no memory analysis")
    forward_formula = rows * (hidden + 2 * ffn) * itemsize + 8 * num_tokens * num_experts
    ratio = analysis.temp_size_in_bytes / forward_formula
    assert FORWARD_BAND[0] <= ratio <= FORWARD_BAND[1], (case, ratio)

    loss = lambda p, x: jnp.sum(jaxmoe.moe(p, x, cfg)[0])
    training = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    saved = rows * (2 * hidden + 3 * ffn) * itemsize
    ratio = training.memory_analysis().temp_size_in_bytes / saved
    assert TRAINING_BAND[0] <= ratio <= TRAINING_BAND[1], (case, ratio)


# The token dispatch holds pair-level buffers ([ep, P_pairs, H] each way, the pair sums in
# float32) beside the same ep*Q-copy expert buffer as the copies path; its receive slots are
# smaller (P_pairs <= P). Measured on CPU at this size (EP=8, T=64, H=64, K=8 of E=32): forward
# 1.04x, training 1.03x the copies path's temporaries (EP=4: 1.03x, 1.01x).
TOKENS_MEMORY_BOUND = 1.1


def test_dropless_ep_memory_near_fast_slots_and_tokens_near_copies():
    """At EP=8 (K=8 of E=32), dropless EP (fast slots + the overflow loop) keeps temporaries
    close to the fast slots alone (a bounded path that would drop the overflow) and far below
    worst-case slots (``ep * T*K`` rows per rank), forward and training; the token dispatch's
    temporaries within ``TOKENS_MEMORY_BOUND`` of the copies path's. The same compiles give the
    forwards' exchanges: the token dispatch's largest all-to-all piece (CPU splits it per peer)
    is one ``[P_pairs, H]`` slot (``P_pairs = 51``: 0.80 T), against the copies path's
    ``[P, H]`` (``P = 72``: 1.125 T), the pairs' ids and weights (2*K_l per row) its only other
    exchange; and both dispatches' exchange bytes are ``layout.exchange_bytes``'s (the (8, 32, 8)
    point of tests/test_ep_dispatch_model.py: the exchanges are the same program's at XLA's
    defaults or the suite's flags). One set of compiles for all three checks."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("ep",))
    tokens_per_rank, hidden, ffn, num_experts, top_k = 64, 64, 64, 32, 8
    # The copies dispatch for the fast-slot bounds (without a fast path "auto" takes the token
    # dispatch, whose worst case is smaller: docs/expert-parallelism.md, 'How "auto" chooses').
    cfg = jaxmoe.MoEConfig(
        num_experts, top_k, hidden, ffn, ep_axis="ep", alignment=1, ep_dispatch="copies"
    )
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jnp.ones((mesh.size * tokens_per_rank, hidden), jnp.float32)
    pair_rows = layout.pair_slot_rows(tokens_per_rank, top_k, num_experts, 8, 1.125)
    copy_rows = layout.slot_rows(tokens_per_rank, top_k, 8, num_experts // 8, receive_factor=1.125)
    assert (pair_rows, copy_rows) == (51, 72)
    local_slots = min(top_k, num_experts // 8)  # K_l = 4

    def compiled(cfg, training):
        f = lambda p, x: jnp.sum(jaxmoe.moe(p, x, cfg, mesh=mesh)[0])
        f = jax.grad(f, argnums=(0, 1)) if training else f
        return jit_xla_defaults(f).lower(params, x).compile()

    def temporaries(program):
        analysis = program.memory_analysis()
        if analysis is None:
            pytest.skip("this jaxlib gives no memory analysis")
        return analysis.temp_size_in_bytes

    tokens = dataclasses.replace(cfg, ep_dispatch="tokens")
    fast_alone = dataclasses.replace(cfg, ep_receive_factor=cfg.ep_fast_slot_factor)
    worst_case = dataclasses.replace(cfg, ep_fast_slot_factor=None)
    for training, bound in ((False, 1.4), (True, 1.3)):
        programs = {"copies": compiled(cfg, training), "tokens": compiled(tokens, training)}
        dropless = temporaries(programs["copies"])
        assert dropless <= bound * temporaries(compiled(fast_alone, training)), training
        assert 4 * dropless <= temporaries(compiled(worst_case, training)), training
        ratio = temporaries(programs["tokens"]) / dropless
        assert ratio <= TOKENS_MEMORY_BOUND, (training, ratio)
        if training:
            continue
        hlo = {dispatch: program.as_text() for dispatch, program in programs.items()}
        for dispatch, rows in (("tokens", pair_rows), ("copies", copy_rows)):
            sizes = [n for op, _, n in collectives(hlo[dispatch]) if op == "all-to-all"]
            assert max(sizes) == rows * hidden, (dispatch, sorted(set(sizes)))
            assert " conditional(" not in hlo[dispatch]
        sizes = {n for op, _, n in collectives(hlo["tokens"]) if op == "all-to-all"}
        assert sizes == {pair_rows * hidden, pair_rows * 2 * local_slots}, sizes
        units = {
            dispatch: assert_exchange_bytes(text, dispatch, top_k, num_experts, 8)
            for dispatch, text in hlo.items()
        }
        assert units["copies"] == 18.0  # the example: 18 vs 13.5 units of tokens x H
        assert units["tokens"] == pytest.approx(13.5, abs=0.1)
