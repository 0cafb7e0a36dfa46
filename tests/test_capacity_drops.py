"""Capacity: the exact per-expert bound, the drop policies, and the drops per sequence.

The drop policies are checked against the NumPy reference (``references.kept_mask``, copy by
copy in claim order), on the permutation plan and through the layer; the expert-parallel path
against one device per data shard is in ``test_parallel.py``.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe.capacity import claim_ranks
from jaxmoe.parallel import slot_rows
from tests import references as ref

HIDDEN, FFN = 8, 16
FACTORS = ("0.3", "0.75", "1.0", "1.1", "1.15", "1.25", "1.5", "2.0")
EXPERTS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 60, 64)


# ----------------------------------------------------------------------------- exact capacity


def _exact_capacity(factor: str, num_tokens: int, top_k: int, num_experts: int) -> int:
    """``min(T, ceil(factor * T * K / E))`` with the factor's decimal value, in integers."""
    value = Fraction(factor)
    numerator = value.numerator * num_tokens * top_k
    return min(num_tokens, -(-numerator // (value.denominator * num_experts)))


def test_capacity_is_exact_over_a_grid():
    differs_from_float = 0
    for factor in FACTORS:
        for num_experts in EXPERTS:
            for top_k in range(1, min(8, num_experts) + 1):
                cfg = jaxmoe.MoEConfig(
                    num_experts, top_k, 4, 4, pre_softmax=True, capacity_factor=float(factor)
                )
                for num_tokens in range(0, 301):
                    want = _exact_capacity(factor, num_tokens, top_k, num_experts)
                    assert cfg.capacity(num_tokens) == want, (factor, num_tokens, top_k)
                    as_float = float(factor) * num_tokens * top_k / num_experts
                    differs_from_float += want != min(num_tokens, math.ceil(as_float))
    # The grid holds points where a float product rounds up past the exact value.
    assert differs_from_float > 0


def test_capacity_of_the_megatron_case_is_165():
    cfg = jaxmoe.MoEConfig(8, 6, 4, 4, capacity_factor=1.1)
    assert cfg.capacity(200) == 165  # 1.1 * 200 * 6 / 8 = 165 exactly (float64: 165.00000000000003)


def test_receive_bound_is_exact():
    # 0.55 * 50 * 2 is 55.00000000000001 in float64; the bound is 55 rows.
    assert slot_rows(50, 2, 1, 8, receive_factor=0.55) == 55
    assert slot_rows(50, 2, 2, 8, receive_factor=0.55) == 28  # ceil(55 / 2)


# ----------------------------------------------------------------------------- drop policies


def _random_routing(seed, num_tokens, num_experts, top_k):
    rng = np.random.default_rng(seed)
    experts = np.stack([rng.permutation(num_experts)[:top_k] for _ in range(num_tokens)])
    weights = rng.uniform(0.05, 1.0, (num_tokens, top_k))  # distinct: no ties
    return experts.astype(np.int32), weights.astype(np.float32)


# Jitted: one program per call, not op-by-op dispatch (most of these tests' time).
_plan_dispatch = jax.jit(
    jaxmoe.plan_dispatch,
    static_argnums=1,
    static_argnames=("capacity", "drop_policy", "sequence_length"),
)
_moe = jax.jit(jaxmoe.moe, static_argnames="cfg")


def _plan(experts, num_experts, capacity, policy, sequence_length, weights):
    return _plan_dispatch(
        jnp.asarray(experts),
        num_experts,
        capacity=capacity,
        drop_policy=policy,
        sequence_length=sequence_length,
        weights=jnp.asarray(weights),
    )


@pytest.mark.parametrize("policy", ["position", "probs"])
@pytest.mark.parametrize("sequences, length", [(4, 8), (1, 32), (8, 1)])
def test_plan_keeps_what_the_reference_keeps(policy, sequences, length):
    num_experts, top_k, capacity = 4, 2, 5
    experts, weights = _random_routing(0, sequences * length, num_experts, top_k)
    plan = _plan(experts, num_experts, capacity, policy, length, weights)
    want = ref.kept_mask(experts, num_experts, capacity, policy, length, weights)
    kept = np.asarray(plan.assignment_row) < plan.num_rows
    np.testing.assert_array_equal(kept, want)
    # Every kept copy has its own row of its expert's block.
    rows = np.asarray(plan.assignment_row)[kept]
    assert len(set(rows.tolist())) == rows.size
    np.testing.assert_array_equal(rows // capacity, experts[kept])
    per_token = np.asarray(plan.dropped_per_token)
    np.testing.assert_array_equal(per_token, (~want).sum(axis=1))
    assert per_token.sum() == int(plan.dropped) > 0


def test_position_drops_the_latest_positions_of_every_sequence_evenly():
    # Every token on expert 0 (K=1); C = 8 of 4 sequences of 6: positions 0-1 of each are kept.
    sequences, length = 4, 6
    experts = np.zeros((sequences * length, 1), np.int32)
    plan = _plan(experts, 2, 8, "position", length, np.ones((sequences * length, 1)))
    dropped = np.asarray(plan.dropped_per_token).reshape(sequences, length)
    np.testing.assert_array_equal(dropped, np.tile([0, 0, 1, 1, 1, 1], (sequences, 1)))
    # One sequence (the default): token order, the last tokens drop.
    one = _plan_dispatch(jnp.asarray(experts), 2, capacity=8)
    np.testing.assert_array_equal(np.asarray(one.dropped_per_token), [0] * 8 + [1] * 16)


def test_probs_drops_the_lowest_weights_and_breaks_ties_by_position():
    experts = np.zeros((6, 1), np.int32)
    weights = np.array([[0.1], [0.9], [0.5], [0.5], [0.7], [0.2]], np.float32)
    plan = _plan(experts, 1, 3, "probs", 3, weights)  # 2 sequences of 3
    # 0.9, 0.7 and one 0.5 kept: of the tied 0.5s, position 0 of sequence 1 (token 3) claims
    # before position 2 of sequence 0 (token 2).
    np.testing.assert_array_equal(np.asarray(plan.dropped_per_token), [1, 0, 1, 0, 0, 1])


def test_claim_ranks_rank_each_experts_copies_once():
    experts, weights = _random_routing(3, 24, 6, 3)
    for policy in ("position", "probs"):
        ranks = np.asarray(
            jax.jit(
                claim_ranks, static_argnums=1, static_argnames=("drop_policy", "sequence_length")
            )(
                jnp.asarray(experts),
                6,
                drop_policy=policy,
                sequence_length=6,
                weights=jnp.asarray(weights),
            )
        )
        for e in range(6):
            got = np.sort(ranks[experts == e])
            np.testing.assert_array_equal(got, np.arange(got.size))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"drop_policy": "last"},
            r"`drop_policy` must be one of \('position', 'probs'\); got 'last'",
        ),
        ({"drop_policy": "probs"}, "drop_policy='probs' ranks copies by their routing weights"),
        ({"sequence_length": 5}, r"`sequence_length` \(5\) must divide the tokens \(12\)"),
    ],
)
def test_claim_ranks_refuse_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        claim_ranks(jnp.zeros((12, 1), jnp.int32), 2, **kwargs)


def test_config_refuses_an_unknown_drop_policy():
    with pytest.raises(
        ValueError,
        match=r"^MoEConfig\.capacity_drop_policy: must be one of \('position', 'probs'\); "
        r"got 'random'\. Use 'position'",
    ):
        jaxmoe.MoEConfig(8, 2, 16, 32, capacity_factor=1.0, capacity_drop_policy="random")


# ----------------------------------------------------------------------------- the layer


def _layer_case(policy, shape=(4, 6, HIDDEN), capacity_factor=0.5, **kwargs):
    cfg = jaxmoe.MoEConfig(
        4,
        2,
        HIDDEN,
        FFN,
        score="sigmoid",
        capacity_factor=capacity_factor,
        capacity_drop_policy=policy,
        **kwargs,
    )
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), shape, jnp.float32)
    return cfg, params, x


def _reference_kept(cfg, params, x):
    tokens = np.asarray(x, np.float64).reshape(-1, cfg.hidden_size)
    logits = tokens @ np.asarray(params["router"]["kernel"], np.float64)
    spec = ref.RoutingSpec.of(cfg)
    experts, margin = ref.select_experts(logits, spec)
    assert margin > 1e-4, "test data too close to a routing tie"
    weights = ref.routing_weights(np, logits, experts, spec)
    length = x.shape[-2] if x.ndim >= 3 else None
    cap = cfg.capacity(tokens.shape[0])
    return (
        tokens,
        experts,
        ref.kept_mask(experts, cfg.num_experts, cap, cfg.capacity_drop_policy, length, weights),
    )


@pytest.mark.parametrize("policy", ["position", "probs"])
@pytest.mark.parametrize("shape", [(4, 6, HIDDEN), (24, HIDDEN), (2, 2, 6, HIDDEN)])
def test_layer_output_gradients_and_drops_per_sequence(policy, shape):
    cfg, params, x = _layer_case(policy, shape)
    cotangent = jax.random.normal(jax.random.key(2), shape, jnp.float32)

    def loss(params, x):
        y, stats = jaxmoe.moe(params, x, cfg)
        return jnp.sum(y * cotangent), (y, stats)

    (grads, (y, stats)) = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)
    tokens, experts, kept = _reference_kept(cfg, params, x)
    sequences = math.prod(shape[:-2]) if len(shape) >= 3 else 1
    want = (~kept).sum(axis=1).reshape(sequences, -1).sum(axis=1)
    per_sequence = np.asarray(stats.dropped_tokens_per_sequence)
    assert per_sequence.shape == (sequences,) and per_sequence.dtype == np.int32
    np.testing.assert_array_equal(per_sequence, want)
    assert per_sequence.sum() == int(stats.dropped_tokens) > 0

    with jax.enable_x64(True):
        params64 = ref.to_f64(params)
        cot = np.asarray(cotangent, np.float64).reshape(tokens.shape)

        def dense(params, tokens):
            out, _ = ref.dense_moe(jnp, params, tokens, cfg, experts, kept.astype(np.float64))
            return jnp.sum(out * cot), out

        ref_grads, ref_y = jax.jit(jax.grad(dense, argnums=(0, 1), has_aux=True))(params64, tokens)
    np.testing.assert_allclose(np.asarray(y).reshape(tokens.shape), ref_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(grads[1]).reshape(tokens.shape), ref_grads[1], rtol=1e-4, atol=1e-5
    )
    for got, want_grad in zip(
        jax.tree.leaves(grads[0]), jax.tree.leaves(ref_grads[0]), strict=True
    ):
        np.testing.assert_allclose(got, want_grad, rtol=1e-4, atol=1e-5)


def test_position_spreads_the_drops_where_token_order_put_them_on_the_last_sequences():
    # Every token on expert 0 (a selection bias of +10); C = 6 of 3 sequences of 8.
    cfg = jaxmoe.MoEConfig(
        2, 1, HIDDEN, FFN, score="sigmoid", use_expert_bias=True, capacity_factor=0.5
    )
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    params["expert_bias"] = jnp.array([10.0, 0.0])
    x = jax.random.normal(jax.random.key(1), (3, 8, HIDDEN))
    _, stats = _moe(params, x, cfg=cfg)
    np.testing.assert_array_equal(stats.dropped_tokens_per_sequence, [6, 6, 6])
    # The same tokens as one sequence: token order, the first 6 tokens kept.
    _, flat = _moe(params, x.reshape(24, HIDDEN), cfg=cfg)
    np.testing.assert_array_equal(flat.dropped_tokens_per_sequence, [18])


@pytest.mark.parametrize("shape", [(0, 6, HIDDEN), (3, 0, HIDDEN), (0, HIDDEN)])
def test_zero_tokens_drop_nothing_per_sequence(shape):
    cfg, params, x = _layer_case("probs", shape)
    _, stats = _moe(params, x, cfg=cfg)
    sequences = math.prod(shape[:-2]) if len(shape) >= 3 else 1
    np.testing.assert_array_equal(stats.dropped_tokens_per_sequence, np.zeros(sequences))


def test_dropless_reports_zero_drops_per_sequence():
    cfg, params, x = _layer_case("position", capacity_factor=None)
    _, stats = _moe(params, x, cfg=cfg)
    np.testing.assert_array_equal(stats.dropped_tokens_per_sequence, np.zeros(4))


def test_policies_agree_where_nothing_drops():
    cfg, params, x = _layer_case("position", capacity_factor=4.0)
    y_position, _ = _moe(params, x, cfg=cfg)
    y_probs, _ = _moe(params, x, cfg=dataclasses.replace(cfg, capacity_drop_policy="probs"))
    np.testing.assert_array_equal(y_position, y_probs)
