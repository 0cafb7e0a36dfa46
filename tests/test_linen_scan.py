"""``nn.scan`` over ``jaxmoe.nn.MoELinen`` layers: the ``metadata_params`` its logically
partitioned parameters need, and the scanned stack against a loop over the same layers."""

from __future__ import annotations

import flax.errors
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
import jaxmoe.nn

CFG = jaxmoe.MoEConfig(num_experts=4, top_k=2, hidden_size=8, ffn_size=16, aux_loss_coef=1e-2)
LAYERS = 3


class Block(nn.Module):
    """One residual MoE block, in the ``(carry, x) -> (carry, y)`` form ``nn.scan`` wants."""

    cfg: jaxmoe.MoEConfig

    @nn.compact
    def __call__(self, h, _):
        y, stats = jaxmoe.nn.MoELinen(self.cfg)(h)
        return h + y, stats.aux_loss


def _stack(metadata_params):
    return nn.scan(
        Block,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        length=LAYERS,
        metadata_params=metadata_params,
    )(CFG)


def test_scanned_params_carry_the_layer_axis_and_match_a_loop():
    stack = _stack({nn.PARTITION_NAME: "layers"})
    x = jax.random.normal(jax.random.key(1), (2, 5, 8))
    variables = stack.init(jax.random.key(0), x, None)
    specs = nn.get_partition_spec(variables)["params"]["MoELinen_0"]
    assert specs["experts"]["w_up"] == jax.P(
        "layers", *jaxmoe.param_logical_axes(CFG)["experts"]["w_up"]
    )
    w_up = nn.unbox(variables)["params"]["MoELinen_0"]["experts"]["w_up"]
    assert w_up.shape == (LAYERS, CFG.num_experts, CFG.hidden_size, CFG.ffn_size)

    h, aux = stack.apply(variables, x, None)
    want_h, want_aux = x, []
    layer = jax.jit(Block(CFG).apply)  # one program for the loop's layers, not op by op
    for i in range(LAYERS):
        params_i = jax.tree.map(lambda leaf, i=i: leaf[i], nn.unbox(variables)["params"])
        want_h, aux_i = layer({"params": params_i}, want_h, None)
        want_aux.append(aux_i)
    np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(aux, jnp.stack(want_aux), rtol=1e-5)


def test_scan_without_the_partition_name_fails():
    stack = _stack({})
    with pytest.raises(flax.errors.PartitioningUnspecifiedError):
        stack.init(jax.random.key(0), jnp.ones((2, 5, 8)), None)
