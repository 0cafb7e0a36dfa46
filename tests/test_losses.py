"""Router losses (MoEStats): load balancing, per-sequence balancing, z-loss, aux_loss, gradients."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe import losses
from tests import references as ref

# float32 losses vs float64 references.
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-5
GRAD_ATOL = 1e-7
NEAR_TIE = 1e-4

HIDDEN, FFN = 8, 8


def _config(num_experts=4, top_k=2, **kwargs):
    return jaxmoe.MoEConfig(num_experts, top_k, HIDDEN, FFN, **kwargs)


def _stats(params, x, cfg):
    return jax.jit(jaxmoe.moe, static_argnames="cfg")(params, x, cfg=cfg)[1]


def _random(cfg, shape, seed=0):
    params = jaxmoe.init_params(jax.random.key(seed), cfg)
    if cfg.use_expert_bias:
        params["expert_bias"] = 0.1 * jax.random.normal(
            jax.random.key(seed + 1), (cfg.num_experts,)
        )
    x = jax.random.normal(jax.random.key(seed + 2), shape)
    return params, x


def _reference(params, x, cfg):
    tokens = np.asarray(x, np.float64).reshape(-1, cfg.hidden_size)
    logits = tokens @ np.asarray(params["router"]["kernel"], np.float64)
    spec = ref.RoutingSpec.of(cfg)
    bias = params.get("expert_bias")
    experts, margin = ref.select_experts(logits, spec, None if bias is None else np.asarray(bias))
    assert margin > NEAR_TIE
    sequences = math.prod(x.shape[:-2]) if x.ndim >= 3 else 1
    return experts, ref.losses_reference(logits, experts, spec, sequences)


def test_perfect_balance_gives_one_and_z_loss_by_hand():
    # Two experts, K=1: tokens +e0 go to expert 0, tokens -e0 to expert 1, half each.
    cfg = _config(num_experts=2, top_k=1, pre_softmax=True)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    kernel = jnp.zeros((HIDDEN, 2)).at[0, 0].set(1.0).at[0, 1].set(-1.0)
    params["router"]["kernel"] = kernel
    x = jnp.zeros((6, HIDDEN)).at[:3, 0].set(0.7).at[3:, 0].set(-0.7)
    stats = _stats(params, x, cfg)
    np.testing.assert_array_equal(stats.tokens_per_expert, [3, 3])
    # E / (K T) * sum_i c_i P_i = 2 / 6 * 3 * (P_0 + P_1) = 1 whatever the scores.
    np.testing.assert_allclose(stats.load_balancing_loss, 1.0, rtol=LOSS_RTOL)
    lse = math.log(math.exp(0.7) + math.exp(-0.7))
    np.testing.assert_allclose(stats.z_loss, lse**2, rtol=LOSS_RTOL)
    # Zero logits: logsumexp = log E.
    params["router"]["kernel"] = jnp.zeros((HIDDEN, 2))
    np.testing.assert_allclose(_stats(params, x, cfg).z_loss, math.log(2) ** 2, rtol=LOSS_RTOL)


def test_collapsed_routing_and_per_sequence_balance_by_hand():
    # K=1, E=2; sequence 0 all on expert 0, sequence 1 all on expert 1, each with p = 0.9.
    cfg = _config(num_experts=2, top_k=1, pre_softmax=True)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    logit = math.log(0.9 / 0.1) / 2  # softmax([a, -a]) = [0.9, 0.1]
    params["router"]["kernel"] = jnp.zeros((HIDDEN, 2)).at[0, 0].set(logit).at[0, 1].set(-logit)
    x = jnp.zeros((2, 4, HIDDEN)).at[0, :, 0].set(1.0).at[1, :, 0].set(-1.0)
    stats = _stats(params, x, cfg)
    # Whole batch: c = [4, 4], P = [0.5, 0.5]: balanced. Per sequence: 2 * 0.9 = 1.8 each.
    np.testing.assert_allclose(stats.load_balancing_loss, 1.0, rtol=LOSS_RTOL)
    np.testing.assert_allclose(stats.seq_aux_loss, 1.8, rtol=LOSS_RTOL)
    # The same tokens as one 2-D sequence: seq_aux is the load balancing loss.
    flat = _stats(params, x.reshape(8, HIDDEN), cfg)
    np.testing.assert_allclose(flat.seq_aux_loss, 1.0, rtol=LOSS_RTOL)


CASES = {
    "softmax": {},
    "softmax-pre-k1": {"pre_softmax": True, "top_k": 1},
    "sigmoid-bias": {"score": "sigmoid", "use_expert_bias": True, "num_experts": 6, "top_k": 3},
    "sqrtsoftplus-groups": {
        "score": "sqrtsoftplus",
        "num_experts": 8,
        "top_k": 2,
        "num_groups": 4,
        "group_top_k": 2,
    },
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("shape", [(10, HIDDEN), (3, 5, HIDDEN)])
def test_losses_match_reference(name, shape):
    coefs = {"aux_loss_coef": 0.3, "seq_aux_loss_coef": 0.05, "z_loss_coef": 0.002}
    cfg = _config(**{**CASES[name], **coefs})
    params, x = _random(cfg, shape)
    experts, (load_balancing, seq_aux, z_loss) = _reference(params, x, cfg)
    stats = _stats(params, x, cfg)
    np.testing.assert_allclose(stats.load_balancing_loss, load_balancing, rtol=LOSS_RTOL)
    np.testing.assert_allclose(stats.seq_aux_loss, seq_aux, rtol=LOSS_RTOL)
    np.testing.assert_allclose(stats.z_loss, z_loss, rtol=LOSS_RTOL)
    np.testing.assert_allclose(
        stats.aux_loss, 0.3 * load_balancing + 0.05 * seq_aux + 0.002 * z_loss, rtol=LOSS_RTOL
    )
    np.testing.assert_array_equal(
        stats.tokens_per_expert, np.bincount(experts.reshape(-1), minlength=cfg.num_experts)
    )
    for field in ("aux_loss", "load_balancing_loss", "seq_aux_loss", "z_loss"):
        assert getattr(stats, field).dtype == jnp.float32 and getattr(stats, field).shape == ()
    assert stats.tokens_per_expert.dtype == jnp.int32
    if len(shape) == 2:
        np.testing.assert_allclose(stats.seq_aux_loss, stats.load_balancing_loss, rtol=1e-6)


def test_aux_loss_is_zero_without_coefficients():
    cfg = _config()
    params, x = _random(cfg, (2, 3, HIDDEN))
    stats = _stats(params, x, cfg)
    assert float(stats.aux_loss) == 0.0
    assert float(stats.load_balancing_loss) > 0.0 and float(stats.z_loss) > 0.0


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("loss", ["load_balancing_loss", "seq_aux_loss", "z_loss"])
def test_loss_gradients_flow_through_the_scores_only(score, loss):
    """d loss / d (router kernel, x), with the counts c_i held constant, as in the contract."""
    cfg = _config(score=score, top_k=2)
    params, x = _random(cfg, (2, 5, HIDDEN), seed=3)
    experts, _ = _reference(params, x, cfg)
    kernel = params["router"]["kernel"]

    def objective(kernel, x):
        stats = jaxmoe.moe({**params, "router": {"kernel": kernel}}, x, cfg)[1]
        return getattr(stats, loss)

    grads = jax.jit(jax.grad(objective, argnums=(0, 1)))(kernel, x)
    spec = ref.RoutingSpec.of(cfg)
    counts = (experts[:, :, None] == np.arange(cfg.num_experts)).sum(1).astype(np.float64)

    def ref_objective(kernel, x):
        logits = x.reshape(-1, HIDDEN) @ kernel
        if loss == "z_loss":
            top = jnp.max(logits, axis=-1, keepdims=True)
            lse = jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1)) + top[:, 0]
            return jnp.mean(lse**2)
        scores = ref.loss_scores(jnp, logits, spec)
        rows = (
            [np.arange(10)] if loss == "load_balancing_loss" else [np.arange(5), np.arange(5, 10)]
        )
        per_seq = [
            cfg.num_experts / (cfg.top_k * len(r)) * jnp.sum(counts[r].sum(0) * scores[r].mean(0))
            for r in rows
        ]
        return sum(per_seq) / len(per_seq)

    with jax.enable_x64(True):
        want = jax.grad(ref_objective, argnums=(0, 1))(
            np.asarray(kernel, np.float64), np.asarray(x, np.float64)
        )
        want = [np.asarray(w) for w in want]
    for got, expected in zip(grads, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_partial_sums_add_up_over_shards():
    """LossTerms of two halves (whole sequences each), summed, finish to the whole-batch losses."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(12, 4)), jnp.float32)
    cfg = _config(score="sigmoid")
    routing = jaxmoe.route(logits, cfg)
    whole = losses.loss_terms(logits, routing.scores, routing.experts, 4)
    halves = [
        losses.loss_terms(logits[s], routing.scores[s], routing.experts[s], 2)
        for s in (slice(0, 6), slice(6, 12))
    ]
    summed = jax.tree.map(lambda a, b: a + b, *halves)
    for a, b in zip(
        losses.finish_losses(whole, 4, 2), losses.finish_losses(summed, 4, 2), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    spec = ref.RoutingSpec.of(cfg)
    want = ref.losses_reference(np.asarray(logits), np.asarray(routing.experts), spec, 4)
    np.testing.assert_allclose(losses.finish_losses(whole, 4, 2), want, rtol=LOSS_RTOL)
