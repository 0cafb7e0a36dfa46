"""The expert bias and its update: argument checks before tracing, and no silent collapse.

Rule: a concrete NaN/inf (eager, or a constant under ``jit``) raises ValueError; a traced one
counts as 0 in routing and in the update, whose result is always finite.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jaxmoe

NUM_EXPERTS = 8
CFG = jaxmoe.MoEConfig(NUM_EXPERTS, 2, 8, 16, score="sigmoid", use_expert_bias=True)
LOGITS = jax.random.normal(jax.random.key(0), (64, NUM_EXPERTS))
NON_FINITE = st.sampled_from([np.nan, np.inf, -np.inf])
PROPERTY = settings(max_examples=25, deadline=None)


@st.composite
def biases_with_non_finite_entries(draw):
    bias = draw(hnp.arrays(np.float32, (NUM_EXPERTS,), elements=st.floats(-1, 1, width=32)))
    where = draw(st.lists(st.integers(0, NUM_EXPERTS - 1), min_size=1, unique=True))
    bias[where] = [draw(NON_FINITE) for _ in where]
    return bias


def _zeroed(bias):
    return np.where(np.isfinite(bias), bias, 0).astype(np.float32)


# ----------------------------------------------------------------------------- route


@PROPERTY
@given(bias=biases_with_non_finite_entries())
def test_concrete_non_finite_bias_is_refused(bias):
    with pytest.raises(ValueError, match=r"route: `expert_bias`: every entry must be finite"):
        jaxmoe.route(LOGITS, CFG, jnp.asarray(bias))
    closed_over = jnp.asarray(bias)
    for constant in (bias, closed_over):  # constants under jit are concrete: checked too
        with pytest.raises(ValueError, match=r"`expert_bias`"):
            jax.jit(lambda logits, b=constant: jaxmoe.route(logits, CFG, b))(LOGITS)


@PROPERTY
@given(bias=biases_with_non_finite_entries())
def test_traced_non_finite_bias_counts_as_zero(bias):
    route = jax.jit(lambda b: jaxmoe.route(LOGITS, CFG, b))
    traced, want = route(jnp.asarray(bias)), route(jnp.asarray(_zeroed(bias)))
    np.testing.assert_array_equal(traced.experts, want.experts)
    np.testing.assert_array_equal(traced.weights, want.weights)


def test_traced_nan_bias_does_not_collapse_routing():
    """The issue-18 case: a NaN bias sent every token to the same two experts."""
    bias = jnp.full((NUM_EXPERTS,), jnp.nan)
    experts = jax.jit(lambda b: jaxmoe.route(LOGITS, CFG, b).experts)(bias)
    assert len(np.unique(np.asarray(experts))) == NUM_EXPERTS


def test_moe_refuses_non_finite_bias_in_params():
    params = jaxmoe.init_params(jax.random.key(0), CFG)
    params["expert_bias"] = params["expert_bias"].at[3].set(jnp.inf)
    with pytest.raises(
        ValueError, match=r"params\['expert_bias'\].*finite.*\[inf\] at indices \[3\]"
    ):
        jaxmoe.moe(params, jnp.ones((4, 8)), CFG)


def test_bias_as_a_list_is_accepted():
    bias = [0.0] * (NUM_EXPERTS - 1) + [10.0]
    routing = jaxmoe.route(LOGITS, CFG, bias)
    np.testing.assert_array_equal(
        routing.experts, jaxmoe.route(LOGITS, CFG, jnp.array(bias)).experts
    )
    assert (np.asarray(routing.experts) == NUM_EXPERTS - 1).any(axis=1).all()


BAD_BIASES = [
    ("wrong length", jnp.zeros(NUM_EXPERTS - 1)),
    ("2-D", jnp.zeros((1, NUM_EXPERTS))),
    ("scalar", 0.0),
    ("bool", jnp.zeros(NUM_EXPERTS, bool)),
    ("strings", ["a"] * NUM_EXPERTS),
    ("ragged", [[0.0]] * 3 + [[0.0, 1.0]]),
    ("long list", list(range(1000))),
]


@pytest.mark.parametrize("case, bias", BAD_BIASES, ids=[c for c, _ in BAD_BIASES])
def test_bias_shape_and_dtype_are_checked_without_dumping_the_value(case, bias):
    with pytest.raises(ValueError, match=rf"route: `expert_bias`: must be a \[{NUM_EXPERTS}\]"):
        jaxmoe.route(LOGITS, CFG, bias)
    with pytest.raises(ValueError) as error:  # also a traced value of the wrong shape
        if hasattr(bias, "dtype"):
            jax.jit(lambda b: jaxmoe.route(LOGITS, CFG, b))(bias)
        else:
            jaxmoe.route(LOGITS, CFG, bias)
    assert len(str(error.value)) < 300


# ----------------------------------------------------------------------------- update


COUNTS = jnp.array([10, 0, 3, 3, 3, 3, 1, 9], jnp.int32)


@pytest.mark.parametrize("rate", [np.nan, np.inf, -np.inf, -0.5, True, "0.1", None, [0.1]])
def test_update_refuses_a_bad_rate(rate):
    with pytest.raises(ValueError, match=r"update_expert_bias: `rate` must be a finite number"):
        jaxmoe.update_expert_bias(jnp.zeros(NUM_EXPERTS), COUNTS, rate)


@pytest.mark.parametrize(
    "counts",
    [
        COUNTS[:-1],
        jnp.zeros(NUM_EXPERTS, bool),
        COUNTS.at[2].set(-1),
        COUNTS.astype(jnp.float32).at[0].set(jnp.nan),
        ["3"] * NUM_EXPERTS,
    ],
    ids=["length", "bool", "negative", "nan", "strings"],
)
def test_update_checks_the_counts(counts):
    with pytest.raises(ValueError, match=r"update_expert_bias: `tokens_per_expert`"):
        jaxmoe.update_expert_bias(jnp.zeros(NUM_EXPERTS), counts, 0.1)


@pytest.mark.parametrize(
    "bias",
    [
        jnp.zeros(NUM_EXPERTS, jnp.int32),
        jnp.zeros((2, 4)),
        jnp.zeros(NUM_EXPERTS).at[1].set(jnp.nan),
    ],
    ids=["integer", "2-D", "nan"],
)
def test_update_checks_the_bias(bias):
    with pytest.raises(ValueError, match=r"update_expert_bias: `bias`"):
        jaxmoe.update_expert_bias(bias, COUNTS, 0.1)


def test_update_takes_lists_and_numpy_scalars():
    new = jaxmoe.update_expert_bias([0.0] * NUM_EXPERTS, COUNTS.tolist(), np.float32(0.5))
    want = 0.5 * np.sign(np.mean(np.asarray(COUNTS)) - np.asarray(COUNTS))
    np.testing.assert_array_equal(new, want.astype(np.float32))


@PROPERTY
@given(
    bias=biases_with_non_finite_entries(),
    rate=st.one_of(NON_FINITE, st.floats(0, 10, width=32)),
    counts=hnp.arrays(
        np.float32, (NUM_EXPERTS,), elements=st.floats(0, 100, width=32) | NON_FINITE
    ),
)
def test_traced_update_is_always_finite(bias, rate, counts):
    update = jax.jit(jaxmoe.update_expert_bias)
    new = np.asarray(update(jnp.asarray(bias), jnp.asarray(counts), jnp.float32(rate)))
    assert np.isfinite(new).all()
    if np.isfinite(rate) and np.isfinite(counts).all():
        # The finite entries move by the usual step; the non-finite ones restart from 0.
        step = rate * np.sign(np.mean(counts) - counts)
        np.testing.assert_allclose(new, _zeroed(bias) + step, rtol=1e-6, atol=1e-6)
    elif not np.isfinite(rate):
        # No usable step: skipped. Under jit XLA flushes subnormal entries to 0 (hence atol).
        tiny = np.finfo(np.float32).tiny
        np.testing.assert_allclose(new, _zeroed(bias), rtol=0, atol=tiny)


def test_equal_counts_move_no_bias():
    # A float32 mean of equal non-integer counts can round off them (8 x 1.7411067 did, under
    # jit): balanced experts must still get a step of exactly 0.
    counts = jnp.full((NUM_EXPERTS,), 1.7411067, jnp.float32)
    bias = jnp.linspace(-1, 1, NUM_EXPERTS)
    for update in (jaxmoe.update_expert_bias, jax.jit(jaxmoe.update_expert_bias)):
        np.testing.assert_array_equal(update(bias, counts, 1.0), bias)


def test_traced_nan_rate_leaves_the_bias_unchanged():
    bias = jnp.linspace(-1, 1, NUM_EXPERTS)
    new = jax.jit(jaxmoe.update_expert_bias)(bias, COUNTS, jnp.float32(jnp.nan))
    np.testing.assert_array_equal(new, bias)


def test_update_keeps_float16_finite():
    bias = jnp.full((NUM_EXPERTS,), 65504.0, jnp.float16)  # float16's largest value
    new = jax.jit(jaxmoe.update_expert_bias)(bias, COUNTS, jnp.float32(1e4))
    assert new.dtype == jnp.float16 and np.isfinite(np.asarray(new, np.float32)).all()


def test_traced_negative_rate_counts_as_zero():
    bias = jnp.linspace(-1, 1, NUM_EXPERTS)
    new = jax.jit(jaxmoe.update_expert_bias)(bias, COUNTS, jnp.float32(-0.5))
    np.testing.assert_array_equal(new, bias)
