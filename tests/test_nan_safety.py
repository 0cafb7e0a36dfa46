"""NaN safety: extreme router logits keep outputs and gradients finite; bad tokens stay local."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe

SCORES = ("softmax", "sigmoid", "sqrtsoftplus")


def _route_objective(cfg):
    def objective(logits):
        routing = jaxmoe.route(logits, cfg)
        ramp_k = jnp.arange(1.0, cfg.top_k + 1.0)[None, :]
        ramp_e = jnp.arange(1.0, cfg.num_experts + 1.0)[None, :]
        return jnp.sum(routing.weights * ramp_k) + jnp.sum(routing.scores * ramp_e)

    return objective


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("logit", [-1e4, -120.0, 1e4])
def test_route_gradients_finite_when_scores_underflow_or_saturate(score, logit):
    cfg = jaxmoe.MoEConfig(4, 2, 8, 8, score=score)
    # Every score underflows to 0 (sigmoid/sqrtsoftplus at -1e4) or saturates (+1e4).
    logits = jnp.full((3, 4), logit, jnp.float32).at[0, 1].set(logit / 2)
    routing = jaxmoe.route(logits, cfg)
    grads = jax.grad(_route_objective(cfg))(logits)
    for value in (routing.weights, routing.scores, grads):
        assert bool(jnp.all(jnp.isfinite(value))), (score, logit)


@pytest.mark.parametrize("score", SCORES)
def test_layer_finite_with_huge_router_weights(score):
    cfg = jaxmoe.MoEConfig(4, 2, 8, 16, score=score, z_loss_coef=1e-3, aux_loss_coef=1e-2)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    # Router logits of order +-1e4.
    params["router"]["kernel"] = params["router"]["kernel"] * 3e3
    x = jax.random.normal(jax.random.key(1), (2, 5, 8))

    def loss(params, x):
        y, stats = jaxmoe.moe(params, x, cfg)
        return jnp.mean(y**2) + stats.aux_loss

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    assert np.isfinite(float(value))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_non_finite_token_stays_in_its_own_output_row():
    """Documented behaviour: an inf/NaN token gives a non-finite output row for that token
    only; other tokens' outputs are unchanged (the losses, which average over tokens, are not)."""
    cfg = jaxmoe.MoEConfig(4, 2, 8, 16)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (6, 8))
    clean, _ = jaxmoe.moe(params, x, cfg)
    poisoned, _ = jaxmoe.moe(params, x.at[2, 3].set(jnp.inf), cfg)
    assert not bool(jnp.all(jnp.isfinite(poisoned[2])))
    others = np.delete(np.arange(6), 2)
    np.testing.assert_array_equal(np.asarray(poisoned[others]), np.asarray(clean[others]))
