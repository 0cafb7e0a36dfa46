"""moe() against a dense float64 reference: every expert on every token, masked by the routing.

Forward output, the stats and the gradients with respect to ``x`` and every parameter, for every
activation and score mode, shared experts, capacity drops, each grouped-matmul backend,
alignments 1 and 8, under ``jit`` and eagerly; runs are bitwise deterministic, and the
NaN-poison debug mode changes nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe import debug
from jaxmoe.bench.harness import relative_error
from tests import references as ref

# Normwise relative error ||got - want|| / ||want|| against the float64 reference, per output,
# per parameter leaf and per expert slice of the expert weights.
FP32_RTOL = 1e-5
# bfloat16 compute (8-bit mantissa, eps 2^-8 ~ 3.9e-3): a handful of roundings per path.
BF16_RTOL = 3e-2
# An expert slice whose reference gradient is exactly zero (no token routed) must be ~zero.
ZERO_ATOL = 1e-12
# Reference routings closer than this to a tie could flip in float32: the data must avoid them.
NEAR_TIE = 1e-4
LOSS_COEFS = {"aux_loss_coef": 0.01, "seq_aux_loss_coef": 0.02, "z_loss_coef": 1e-3}

BATCH, SEQ, HIDDEN, FFN, EXPERTS = 2, 6, 16, 24, 8


def _config(**kwargs):
    fields = {"num_experts": EXPERTS, "top_k": 2, "hidden_size": HIDDEN, "ffn_size": FFN}
    return jaxmoe.MoEConfig(**{**fields, **LOSS_COEFS, **kwargs})


CASES = {
    "softmax-swiglu": {},
    "softmax-k1": {"top_k": 1},
    "pre-softmax-normalized-geglu-reference-backend": {
        "pre_softmax": True,
        "normalize_weights": True,
        "activation": "geglu",
        "grouped_matmul_backend": "reference",
        "alignment": 1,
    },
    "gelu-xla-backend": {
        "activation": "gelu",
        "top_k": 3,
        "grouped_matmul_backend": "xla",
        "alignment": 1,
    },
    # Alignment 8 with the reference and xla backends: see the poison tests.
    "relu-auto-backend-align8": {"activation": "relu", "alignment": 8},
    "sigmoid-bias-groups-scaled-shared": {
        "score": "sigmoid",
        "use_expert_bias": True,
        "top_k": 4,
        "num_groups": 4,
        "group_top_k": 2,
        "routed_scaling": 2.5,
        "num_shared_experts": 1,
    },
    "sqrtsoftplus-unnormalized-shared-geglu": {
        "score": "sqrtsoftplus",
        "normalize_weights": False,
        "activation": "geglu",
        "num_shared_experts": 2,
        "shared_ffn_size": 20,
    },
    "capacity-align1": {"capacity_factor": 0.75, "alignment": 1},
    "capacity-align8-sigmoid": {"capacity_factor": 0.75, "alignment": 8, "score": "sigmoid"},
}


def _inputs(cfg, seed=0, shape=(BATCH, SEQ, HIDDEN), dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 4)
    params = jaxmoe.init_params(keys[0], cfg)
    if cfg.use_expert_bias:
        params["expert_bias"] = (0.1 * jax.random.normal(keys[1], (cfg.num_experts,))).astype(
            cfg.param_dtype
        )
    x = jax.random.normal(keys[2], shape).astype(dtype)
    cotangent = jax.random.normal(keys[3], shape, jnp.float32)
    return params, x, cotangent


class Reference:
    """The float64 dense layer, its stats and the gradients of sum(y * cot) + aux_loss."""

    def __init__(self, params, x, cfg, cotangent):
        tokens = np.asarray(x, np.float64).reshape(-1, cfg.hidden_size)
        num_tokens = tokens.shape[0]
        params64 = ref.to_f64(params)
        spec = ref.RoutingSpec.of(cfg)
        logits = tokens @ params64["router"]["kernel"]
        self.experts, margin = ref.select_experts(logits, spec, params64.get("expert_bias"))
        assert margin > NEAR_TIE, "test data too close to a routing tie; pick another seed"
        cap = ref.capacity(cfg.capacity_factor, num_tokens, cfg.top_k, cfg.num_experts)
        sequence_length = x.shape[-2] if x.ndim >= 3 else None
        weights = ref.routing_weights(np, logits, self.experts, spec)
        kept = ref.kept_mask(
            self.experts, cfg.num_experts, cap, cfg.capacity_drop_policy, sequence_length, weights
        )
        self.layout = ref.layout_reference(self.experts, cfg.num_experts, 1, cap)
        sequences = int(np.prod(x.shape[:-2])) if x.ndim >= 3 else 1
        self.losses = ref.losses_reference(logits, self.experts, spec, sequences)
        loss_weights = (cfg.aux_loss_coef, cfg.seq_aux_loss_coef, cfg.z_loss_coef, sequences)
        cot = np.asarray(cotangent, np.float64).reshape(num_tokens, -1)
        with jax.enable_x64(True):

            def objective(params, tokens):
                y, aux = ref.dense_moe(
                    jnp, params, tokens, cfg, self.experts, kept.astype(np.float64), loss_weights
                )
                return jnp.sum(y * cot) + aux, (y, aux)

            grads, (y, aux) = jax.jit(jax.grad(objective, argnums=(0, 1), has_aux=True))(
                params64, tokens
            )
            self.y = np.asarray(y).reshape(x.shape)
            self.aux = float(aux)
            self.grad_params = ref.to_f64(grads[0])
            self.grad_x = np.asarray(grads[1]).reshape(x.shape)


def _layer_objective(cfg, cotangent):
    def objective(params, x):
        y, stats = jaxmoe.moe(params, x, cfg)
        return jnp.sum(y.astype(jnp.float32) * cotangent) + stats.aux_loss, (y, stats)

    return jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)


def _assert_close(got, want, rtol, what):
    assert np.all(np.isfinite(np.asarray(got, np.float64))), f"{what}: not finite"
    # ||got - want|| <= rtol * ||want|| + ZERO_ATOL, as a relative error.
    scale = max(float(np.linalg.norm(np.asarray(want, np.float64))), 1e-30)
    error = relative_error(got, want)
    assert error <= rtol + ZERO_ATOL / scale, f"{what}: relative error {error:.3g}"


def _assert_grads_close(got, want, rtol):
    got_flat = dict(
        (jax.tree_util.keystr(p), v) for p, v in jax.tree_util.tree_flatten_with_path(got)[0]
    )
    want_flat = dict(
        (jax.tree_util.keystr(p), v) for p, v in jax.tree_util.tree_flatten_with_path(want)[0]
    )
    assert sorted(got_flat) == sorted(want_flat)
    for name, value in got_flat.items():
        if "expert_bias" in name:
            np.testing.assert_array_equal(value, 0.0)  # selection only: no gradient
        elif "'experts'" in name:
            for e in range(value.shape[0]):  # an empty expert must get exactly ~0
                _assert_close(value[e], want_flat[name][e], rtol, f"grad {name}[{e}]")
        else:
            _assert_close(value, want_flat[name], rtol, f"grad {name}")


def _check_against_reference(result, expected: Reference, cfg, rtol):
    (_, (y, stats)), (grad_params, grad_x) = result
    _assert_close(y, expected.y, rtol, "y")
    _assert_grads_close(grad_params, expected.grad_params, rtol)
    _assert_close(grad_x, expected.grad_x, rtol, "grad x")
    load_balancing, seq_aux, z_loss = expected.losses
    np.testing.assert_allclose(stats.load_balancing_loss, load_balancing, rtol=1e-5)
    np.testing.assert_allclose(stats.seq_aux_loss, seq_aux, rtol=1e-5)
    np.testing.assert_allclose(stats.z_loss, z_loss, rtol=1e-5)
    np.testing.assert_allclose(stats.aux_loss, expected.aux, rtol=1e-5)
    np.testing.assert_array_equal(stats.tokens_per_expert, expected.layout.tokens_per_expert)
    assert int(stats.dropped_tokens) == expected.layout.dropped


@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_gradients_match_dense_reference(name):
    cfg = _config(**CASES[name])
    params, x, cotangent = _inputs(cfg)
    expected = Reference(params, x, cfg, cotangent)
    if cfg.capacity_factor is not None:
        assert expected.layout.dropped > 0, "the capacity case must drop something"
    result = jax.jit(_layer_objective(cfg, cotangent))(params, x)
    assert result[0][1][0].shape == x.shape and result[0][1][0].dtype == x.dtype
    _check_against_reference(result, expected, cfg, FP32_RTOL)


@pytest.mark.parametrize("shape", [(12, HIDDEN), (3, 4, HIDDEN)])
def test_input_shapes_and_sequences(shape):
    """2-D x is one sequence (seq_aux == load balancing); [B, S, H] averages over B."""
    cfg = _config(score="sigmoid")
    params, x, cotangent = _inputs(cfg, seed=1, shape=shape)
    expected = Reference(params, x, cfg, cotangent)
    result = jax.jit(_layer_objective(cfg, cotangent))(params, x)
    _check_against_reference(result, expected, cfg, FP32_RTOL)
    stats = result[0][1][1]
    if len(shape) == 2:
        np.testing.assert_allclose(stats.seq_aux_loss, stats.load_balancing_loss, rtol=1e-6)


def test_eager_equals_jit():
    cfg = _config(alignment=8, num_shared_experts=1)
    params, x, _ = _inputs(cfg, seed=2)
    eager, eager_stats = jaxmoe.moe(params, x, cfg)
    jitted, jitted_stats = jax.jit(jaxmoe.moe, static_argnames="cfg")(params, x, cfg=cfg)
    np.testing.assert_allclose(eager, jitted, rtol=FP32_RTOL, atol=1e-6)
    for a, b in zip(jax.tree.leaves(eager_stats), jax.tree.leaves(jitted_stats), strict=True):
        np.testing.assert_allclose(a, b, rtol=FP32_RTOL)


@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16])
def test_bfloat16_compute(param_dtype):
    cfg = _config(dtype=jnp.bfloat16, param_dtype=param_dtype, num_shared_experts=1, alignment=8)
    params, x, cotangent = _inputs(cfg, seed=3, dtype=jnp.bfloat16)
    expected = Reference(params, x, cfg, cotangent)
    result = jax.jit(_layer_objective(cfg, cotangent))(params, x)
    (_, (y, stats)), (grad_params, grad_x) = result
    assert y.dtype == jnp.bfloat16 and grad_x.dtype == jnp.bfloat16
    assert all(g.dtype == param_dtype for g in jax.tree.leaves(grad_params))
    # The router is float32 whatever the compute dtype: same experts, losses at fp32 accuracy.
    np.testing.assert_array_equal(stats.tokens_per_expert, expected.layout.tokens_per_expert)
    np.testing.assert_allclose(stats.load_balancing_loss, expected.losses[0], rtol=1e-5)
    _assert_close(y, expected.y, BF16_RTOL, "y")
    _assert_close(grad_x, expected.grad_x, BF16_RTOL, "grad x")
    _assert_grads_close(grad_params, expected.grad_params, BF16_RTOL)


def _skewed_params(cfg, params):
    """A router that sends every token to experts 0 (and 5 when K = 2): the rest stay empty."""
    kernel = params["router"]["kernel"]
    kernel = kernel.at[:, 0].add(50.0).at[:, 5].add(30.0)
    return {**params, "router": {"kernel": kernel}}


@pytest.mark.parametrize("backend", ["reference", "xla"])  # None is "xla" on CPU
def test_runs_are_bitwise_deterministic(backend):
    cfg = _config(alignment=8, grouped_matmul_backend=backend, num_shared_experts=1)
    params, x, cotangent = _inputs(cfg, seed=5)
    compiled = jax.jit(_layer_objective(cfg, cotangent))
    first, second = compiled(params, x), compiled(params, x)
    recompiled = jax.jit(_layer_objective(cfg, cotangent))(params, x)
    for a, b, c in zip(*(jax.tree.leaves(r) for r in (first, second, recompiled)), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


# (The unskewed reference and xla cases: their -skewed cases, the same programs (same config,
# alignment 8, shared expert) on data whose padded blocks and poisoned tail hold empty experts too.)
POISON_CASES = {
    "reference-skewed": {"grouped_matmul_backend": "reference", "skewed": True},
    "xla-skewed": {"grouped_matmul_backend": "xla", "skewed": True},
    "capacity": {"capacity_factor": 0.75},
}


@pytest.mark.parametrize("name", list(POISON_CASES))
def test_poisoned_buffers_change_nothing(name):
    kwargs = dict(POISON_CASES[name])
    skewed = kwargs.pop("skewed", False)
    cfg = _config(alignment=8, num_shared_experts=1, **kwargs)
    params, x, cotangent = _inputs(cfg, seed=6)
    if skewed:
        params, x = _skewed_params(cfg, params), jnp.abs(x)
    expected = Reference(params, x, cfg, cotangent)
    if skewed:  # every token on experts 0 and 5; six experts empty
        assert expected.layout.tokens_per_expert.tolist() == [12, 0, 0, 0, 0, 12, 0, 0]
    plan = jaxmoe.plan_dispatch(
        jnp.asarray(expected.experts, jnp.int32),
        cfg.num_experts,
        alignment=8,
        capacity=ref.capacity(cfg.capacity_factor, BATCH * SEQ, cfg.top_k, cfg.num_experts),
    )
    has_tail = int(jnp.sum(plan.group_sizes)) < plan.num_rows
    assert has_tail or cfg.capacity_factor is not None, "dropless case must have a poisoned tail"
    with debug.poison_buffers():
        # A new function object: poison is read at trace time and jit caches per function.
        result = jax.jit(lambda p, x: _layer_objective(cfg, cotangent)(p, x))(params, x)
    _check_against_reference(result, expected, cfg, FP32_RTOL)
