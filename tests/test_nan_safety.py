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


# --- A non-finite weight of one expert stays with that expert's rows --------------------------

# Groups of 12 rows: [3, 0, 6] (an empty group, 3 rows past the groups); group 2 is poisoned.
CONFINED_SIZES = jnp.array([3, 0, 6], jnp.int32)
GROUP_ROWS = np.arange(12)[(np.arange(12) >= 3) & (np.arange(12) < 9)]
OTHER_ROWS = np.setdiff1d(np.arange(12), GROUP_ROWS)


def _weights(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape) / np.sqrt(shape[1])


def _confined_grads(op, weights, poisoned_index, value):
    """``op(x, *weights)``'s output and gradients, clean and with ``weights[0]`` poisoned at
    ``poisoned_index`` (in group 2): the other rows, the input gradient of the other rows and
    the other groups' weight gradients are the clean ones bit for bit."""
    x = jax.random.normal(jax.random.key(9), (12, weights[0].shape[1]))
    cotangent = jax.random.normal(jax.random.key(8), (12, weights[0].shape[2]))

    @jax.jit
    def run(x, weights):
        out, vjp = jax.vjp(op, x, *weights)
        return out, vjp(cotangent)

    clean_out, clean_grads = run(x, weights)
    bad = (weights[0].at[poisoned_index].set(value), *weights[1:])
    out, grads = run(x, bad)
    assert not np.all(np.isfinite(np.asarray(out[GROUP_ROWS]))), "the poison vanished"
    np.testing.assert_array_equal(np.asarray(out[OTHER_ROWS]), np.asarray(clean_out[OTHER_ROWS]))
    np.testing.assert_array_equal(
        np.asarray(grads[0][OTHER_ROWS]), np.asarray(clean_grads[0][OTHER_ROWS])
    )
    for got, want in zip(grads[1:], clean_grads[1:], strict=True):
        np.testing.assert_array_equal(np.asarray(got[:2]), np.asarray(want[:2]))


def _gated_backends():
    from jaxmoe.ops.gated_grouped_matmul.reference import ReferenceGatedGroupedMatmul
    from jaxmoe.ops.grouped_matmul import ReferenceGroupedMatmul, XlaGroupedMatmul

    return {
        "xla": "xla",
        "reference": "reference",
        "fused_reference_on_xla": ReferenceGatedGroupedMatmul(grouped=XlaGroupedMatmul()),
        "fused_reference": ReferenceGatedGroupedMatmul(grouped=ReferenceGroupedMatmul()),
    }


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("backend", list(_gated_backends()))
def test_gated_grouped_matmul_keeps_a_non_finite_weight_in_its_group(backend, value):
    from jaxmoe.ops.gated_grouped_matmul import gated_grouped_matmul

    impl = _gated_backends()[backend]

    def op(x, w_up, w_gate):
        return gated_grouped_matmul(
            x, w_gate, w_up, CONFINED_SIZES, activation="swiglu", backend=impl
        )

    weights = (_weights(1, (3, 5, 4)), _weights(2, (3, 5, 4)))
    _confined_grads(op, weights, (2, 1, 3), value)


@pytest.mark.parametrize("backend", ["reference", "xla"])
@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_fp8_grouped_matmul_keeps_a_non_finite_weight_in_its_group(backend, recipe):
    from jaxmoe.ops.fp8 import fp8_grouped_matmul

    def op(x, w):
        return fp8_grouped_matmul(x, w, CONFINED_SIZES, recipe=recipe, backend=backend)

    _confined_grads(op, (_weights(3, (3, 40, 24)),), (2, 7, 5), np.nan)


@pytest.mark.parametrize("backend", ["xla", "reference"])
def test_a_nan_in_one_experts_weights_reaches_only_its_tokens(backend):
    """A NaN in expert 3's ``w_up``: the tokens routed to expert 3 are non-finite, every other
    token's output and input gradient are the clean run's, bit for bit."""
    cfg = jaxmoe.MoEConfig(8, 2, 8, 16, grouped_matmul_backend=backend)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (16, 8))
    routing = jaxmoe.route(x @ params["router"]["kernel"], cfg)
    to_expert = np.any(np.asarray(routing.experts) == 3, axis=1)
    assert 0 < to_expert.sum() < 16

    @jax.jit
    def run(params, x):
        (y, _), vjp = jax.vjp(lambda x: jaxmoe.moe(params, x, cfg), x)
        (grad_x,) = vjp((jnp.ones_like(y), jax.tree.map(jnp.zeros_like, _)))
        return y, grad_x

    bad = jax.tree.map(lambda a: a, params)
    bad["experts"]["w_up"] = bad["experts"]["w_up"].at[3, 2, 5].set(jnp.nan)
    clean_y, clean_grad = run(params, x)
    y, grad_x = run(bad, x)
    assert not np.any(np.all(np.isfinite(np.asarray(y[to_expert])), axis=1))
    others = ~to_expert
    np.testing.assert_array_equal(np.asarray(y[others]), np.asarray(clean_y[others]))
    np.testing.assert_array_equal(np.asarray(grad_x[others]), np.asarray(clean_grad[others]))
