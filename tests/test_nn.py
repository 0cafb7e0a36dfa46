"""The Flax shells (NNX and Linen) equal the functional layer, under jit and grad."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxmoe
import jaxmoe.nn

FP32_RTOL = 1e-5

CONFIGS = {
    "softmax-swiglu": jaxmoe.MoEConfig(8, 2, 16, 24, aux_loss_coef=0.01, z_loss_coef=1e-3),
    "sigmoid-bias-shared": jaxmoe.MoEConfig(
        8,
        2,
        16,
        24,
        score="sigmoid",
        use_expert_bias=True,
        num_shared_experts=1,
        activation="geglu",
        seq_aux_loss_coef=0.1,
    ),
    "relu-capacity": jaxmoe.MoEConfig(
        8, 1, 16, 24, activation="relu", pre_softmax=True, capacity_factor=1.0
    ),
}


def _x(seed=1, shape=(2, 6, 16)):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _assert_close(a, b, rtol=FP32_RTOL):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_nnx_matches_functional_forward_and_grad(name):
    cfg = CONFIGS[name]
    layer = jaxmoe.nn.MoE(cfg, rngs=nnx.Rngs(0))
    params = layer.params_tree()
    x = _x()

    def functional_loss(params, x):
        y, stats = jaxmoe.moe(params, x, cfg)
        return jnp.mean(jnp.sin(y)) + stats.aux_loss

    @nnx.jit
    def module_loss_and_grad(layer, x):
        def loss(layer):
            y, stats = layer(x)
            return jnp.mean(jnp.sin(y)) + stats.aux_loss

        return nnx.value_and_grad(loss)(layer)

    value, grads = module_loss_and_grad(layer, x)
    ref_value, ref_grads = jax.jit(jax.value_and_grad(functional_loss))(params, x)
    _assert_close(value, ref_value)
    grad_state = nnx.state(grads, nnx.Param)
    for group in ("router", "experts") + (("shared",) if cfg.num_shared_experts else ()):
        for leaf, ref in ref_grads[group].items():
            _assert_close(grad_state[group][leaf][...], ref)
    # The selection bias is state, not a parameter: no gradient is produced for it.
    assert "expert_bias" not in grad_state


def test_nnx_parameters_carry_logical_axes():
    cfg = CONFIGS["sigmoid-bias-shared"]
    layer = jaxmoe.nn.MoE(cfg, rngs=nnx.Rngs(0))
    specs = nnx.get_partition_spec(nnx.state(layer, nnx.Param))
    assert tuple(specs["experts"]["w_up"].get_value()) == ("expert", "embed", "mlp")
    assert tuple(specs["experts"]["w_down"].get_value()) == ("expert", "mlp", "embed")
    assert tuple(specs["router"]["kernel"].get_value()) == ("embed", "router")
    assert tuple(specs["shared"]["w_gate"].get_value()) == ("embed", "mlp")


def test_nnx_expert_bias_update_changes_selection_state():
    cfg = CONFIGS["sigmoid-bias-shared"]
    layer = jaxmoe.nn.MoE(cfg, rngs=nnx.Rngs(0))
    counts = jnp.array([10, 0, 0, 0, 0, 0, 0, 6], jnp.int32)
    layer.update_expert_bias(counts, rate=0.5)
    expected = 0.5 * np.sign(np.mean(counts) - np.asarray(counts))
    _assert_close(layer.expert_bias[...], expected)
    with pytest.raises(ValueError, match="use_expert_bias"):
        jaxmoe.nn.MoE(CONFIGS["softmax-swiglu"], rngs=nnx.Rngs(0)).update_expert_bias(counts, 0.1)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_linen_matches_functional(name):
    import flax.linen as nn

    cfg = CONFIGS[name]
    layer = jaxmoe.nn.MoELinen(cfg)
    x = _x(2)
    variables = layer.init(jax.random.key(0), x)
    params = nn.unbox(variables["params"])
    tree = dict(params)
    if cfg.use_expert_bias:
        tree["expert_bias"] = variables["moe_state"]["expert_bias"]
    y, stats = jax.jit(layer.apply)(variables, x)
    # The references jitted: eager op-by-op dispatch is most of this test's time on CPU.
    ref_y, ref_stats = jax.jit(jaxmoe.moe, static_argnames="cfg")(tree, x, cfg=cfg)
    _assert_close(y, ref_y)
    _assert_close(stats.aux_loss, ref_stats.aux_loss)

    def loss(params):
        y, stats = layer.apply({**variables, "params": params}, x)
        return jnp.mean(jnp.sin(y)) + stats.aux_loss

    def ref_loss(params):
        y, stats = jaxmoe.moe({**tree, **params}, x, cfg)
        return jnp.mean(jnp.sin(y)) + stats.aux_loss

    grads = nn.unbox(jax.jit(jax.grad(loss))(variables["params"]))
    ref_grads = jax.jit(jax.grad(ref_loss))(params)
    jax.tree.map(_assert_close, grads, ref_grads)
    names = nn.get_partition_spec(variables["params"])
    assert tuple(names["experts"]["w_up"]) == ("expert", "embed", "mlp")
