"""The activation-memory formulas of docs/memory.md against XLA's memory analysis."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
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


def test_dropless_ep_memory_is_close_to_fast_slots_alone():
    """At EP=8 (K=8 of E=32), dropless EP (fast slots + the overflow loop) keeps temporaries
    close to the fast slots alone (a bounded path that would drop the overflow) and far below
    worst-case slots (``ep * T*K`` rows per rank), forward and training."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("ep",))
    tokens_per_rank, hidden, ffn, num_experts, top_k = 64, 64, 64, 32, 8
    # The copies dispatch throughout (without a fast path "auto" takes the token dispatch, whose
    # worst case is smaller: docs/expert-parallelism.md, 'How "auto" chooses').
    cfg = jaxmoe.MoEConfig(
        num_experts, top_k, hidden, ffn, ep_axis="ep", alignment=1, ep_dispatch="copies"
    )
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jnp.ones((mesh.size * tokens_per_rank, hidden), jnp.float32)

    def temporaries(cfg, training):
        f = lambda p, x: jnp.sum(jaxmoe.moe(p, x, cfg, mesh=mesh)[0])
        f = jax.grad(f, argnums=(0, 1)) if training else f
        analysis = jit_xla_defaults(f).lower(params, x).compile().memory_analysis()
        if analysis is None:
            pytest.skip("this jaxlib gives no memory analysis")
        return analysis.temp_size_in_bytes

    fast_alone = dataclasses.replace(cfg, ep_receive_factor=cfg.ep_fast_slot_factor)
    worst_case = dataclasses.replace(cfg, ep_fast_slot_factor=None)
    for training, bound in ((False, 1.4), (True, 1.3)):
        dropless = temporaries(cfg, training)
        assert dropless <= bound * temporaries(fast_alone, training), training
        assert 4 * dropless <= temporaries(worst_case, training), training
