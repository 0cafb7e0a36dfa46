"""The EP benchmark's forced-balanced routing goes through the real router and is exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe.bench.layer_scaling import TINY_LAYER_CASES, balanced_inputs


@pytest.mark.parametrize("name", ["megatron-mixtral", "megatron-dsv3"])
def test_balanced_inputs_give_exactly_balanced_routing(name):
    case = TINY_LAYER_CASES[name]
    cfg = case.config(ep=1)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (4, 64, cfg.hidden_size), jnp.bfloat16)
    x, params["router"]["kernel"] = balanced_inputs(
        x, params["router"]["kernel"], cfg.num_experts, cfg.top_k
    )
    _, stats = jaxmoe.moe(params, x.astype(jnp.float32), cfg)
    counts = np.asarray(stats.tokens_per_expert)
    assert counts.sum() == 4 * 64 * cfg.top_k
    np.testing.assert_array_equal(counts, np.full_like(counts, counts.sum() // cfg.num_experts))
