"""The model behind ``ep_dispatch="auto"``: bytes on the wire of each exchange, checked against
the compiled HLO on 8 CPU devices, plus the token dispatch's local work, calibrated on the
2-GPU measurements (docs/expert-parallelism.md, "How "auto" chooses")."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from test_parallel import MESHES

import jaxmoe
from jaxmoe.bench.wire_bytes import wire_bytes
from jaxmoe.parallel import layout

TOKENS, HIDDEN = 64, 64  # per rank; float32, so the CPU compiler keeps the program's dtype
UNIT = TOKENS * HIDDEN * 4  # one "token x H" of float32: the unit


def _compiled_forward(cfg, mesh):
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jnp.ones((mesh.size * TOKENS, HIDDEN), jnp.float32)
    return jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg, mesh=mesh)[0]).lower(params, x).compile()


def assert_exchange_bytes(hlo, dispatch, top_k, num_experts, ep):
    """The formula against a compiled forward's collectives (``TOKENS`` float32 rows of
    ``HIDDEN`` per rank): the dispatch's and combine's exchanges exactly; with everything else
    (the [ep, E] counts, the stats' sums) within 2%. Returns the exchanges in units of
    tokens x H."""
    predicted = layout.exchange_bytes(
        dispatch, TOKENS, top_k, num_experts, ep, row_bytes=HIDDEN * 4
    )
    exchanges = wire_bytes(hlo, "ep_dispatch") + wire_bytes(hlo, "ep_combine")
    assert exchanges == predicted, (dispatch, exchanges, predicted)
    assert abs(wire_bytes(hlo) - predicted) <= 0.02 * predicted, (dispatch, wire_bytes(hlo))
    return exchanges / UNIT


@pytest.mark.parametrize(
    "top_k,num_experts,ep",
    # Each EP size and each (K, E) once, and each branch of the formula: the pairs capped at T
    # (K_l = 6 at EP=2: a token reaches the other rank with probability 0.99), the pairs below
    # T (K_l = 2 at EP=4), a pair that is one copy (K_l = 1 at EP=8: the copies path alone),
    # and the copies' fast slots at every EP size. (Each case compiles two forwards: the other
    # five points of the 3 x 3 grid ran these same branches.) The example, K=8 of E=32 at
    # EP=8 (K_l = 4, pairs below T), reads the forwards that
    # tests/test_memory.py::test_dropless_ep_memory_near_fast_slots_and_tokens_near_copies
    # compiles at the same T and H, through assert_exchange_bytes.
    [(6, 64, 2), (2, 8, 4), (2, 8, 8)],
)
def test_exchange_bytes_is_what_the_compiled_hlo_sends(top_k, num_experts, ep):
    """The formula against the compiled forward's collectives (assert_exchange_bytes)."""
    mesh, _ = MESHES[f"ep{ep}"]
    cfg = jaxmoe.MoEConfig(num_experts, top_k, HIDDEN, 32, ep_axis="ep", alignment=1)
    for dispatch in ("copies", "tokens"):
        if dispatch == "tokens" and min(top_k, num_experts // ep) == 1:
            continue  # a pair is one copy: "tokens" runs the copies path (tested elsewhere)
        hlo = _compiled_forward(dataclasses.replace(cfg, ep_dispatch=dispatch), mesh).as_text()
        assert_exchange_bytes(hlo, dispatch, top_k, num_experts, ep)


# The two 2-GPU measurements (docs/expert-parallelism.md; 4096 tokens per GPU, bf16, fwd+bwd
# ms at EP=2).
MEASURED = {  # name: (K, E, H, copies ms, tokens ms)
    "dsv3": (8, 32, 7168, 22.30, 19.94),
    "mixtral": (2, 8, 4096, 18.50, 19.19),
}


def test_calibration_reproduces_the_2_gpu_measurements():
    """The constant is the fit of ``time = (wire bytes + c * T * H * b) / bandwidth`` through
    both runs (two equations, two unknowns), and "auto" picks each run's faster dispatch."""
    deltas = []
    for top_k, num_experts, hidden, copies_ms, tokens_ms in MEASURED.values():
        wire = {
            d: layout.exchange_bytes(d, 4096, top_k, num_experts, 2, row_bytes=hidden * 2)
            for d in ("copies", "tokens")
        }
        deltas.append((wire["tokens"] - wire["copies"], 4096 * hidden * 2, tokens_ms - copies_ms))
        faster = "tokens" if tokens_ms < copies_ms else "copies"
        assert (
            layout.auto_dispatch(
                top_k, num_experts, 2, True, num_tokens=4096, hidden_size=hidden, itemsize=2
            )
            == faster
        )
    (d1, u1, t1), (d2, u2, t2) = deltas
    fitted = (d2 * t1 - d1 * t2) / (u1 * t2 - u2 * t1)
    assert fitted == pytest.approx(layout.TOKEN_DISPATCH_LOCAL_ROWS, rel=0.01)
    bandwidth = (d1 + fitted * u1) / (t1 * 1e-3)  # forward bytes per second of fwd+bwd
    assert 1e11 < bandwidth < 1e12  # a few hundred GB/s: the wire's own order


def test_where_the_model_picks_differently_from_the_old_threshold():
    """The old rule took "tokens" at >= 1.5 copies per pair. The model keeps the copies path at
    K=4 of E=32 on EP=2 (2.1 copies per pair: 4.0 + 5.4 against 9.0 units) and takes the pairs
    at K=8 of E=64 on EP=8 (1.47: 12.3 + 5.4 against 18.0); K=8 of E=32 on EP=8 stays copies
    (12.7 + 5.4 against 18.0)."""
    assert layout.copies_per_pair(4, 32, 2) > 1.5 and layout.auto_dispatch(4, 32, 2, True) == (
        "copies"
    )
    assert layout.copies_per_pair(8, 64, 8) < 1.5 and layout.auto_dispatch(8, 64, 8, True) == (
        "tokens"
    )
    assert layout.auto_dispatch(8, 32, 8, True) == "copies"
    # FP8 rows shrink the dispatch, not the local work: the pairs lose their edge sooner.
    assert layout.auto_dispatch(8, 64, 8, True, row_bytes=4096 + 4) == "copies"
