"""Bad arguments to ``plan_dispatch``, ``dispatch`` and ``combine``: a ValueError (TypeError for a
wrong type) naming the argument, raised in Python before anything is traced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe

EXPERTS = jnp.array([[0, 3], [1, 2], [3, 0]], jnp.int32)  # T=3, K=2, E=4


@pytest.mark.parametrize(
    ("experts", "num_experts", "match"),
    [
        ([[0, 9], [1, 2]], 8, r"ids in \[0, num_experts=8\); got 9 at \[0, 1\]"),
        ([[0, -1], [1, 2]], 8, r"got -1 at \[0, 1\].*Negative ids do not count from the end"),
        ([[0.0, 1.0], [1.0, 2.0]], 8, "`experts` must be a 2-D integer array.*float32"),
        ([[True, False]], 8, "`experts` must be a 2-D integer array.*bool"),
        ([0, 1, 2], 8, r"`experts` must be a 2-D integer array.*shape \(3,\)"),
        ([[0, 2], [1, 1]], 8, r"distinct within each token; token 1 picks \[1, 1\]"),
        ([[0, 1, 2]], 2, "K=3 choices per token but there are only num_experts=2"),
        ([[0, 1]], 0, "`num_experts` must be an int >= 1; got 0"),
        ([[0, 1], [2, 3]], -3, "`num_experts` must be an int >= 1; got -3"),
        ([[0, [1]]], 4, "`experts` must be an array"),
    ],
)
def test_plan_dispatch_refuses_bad_experts(experts, num_experts, match):
    with pytest.raises(ValueError, match=match):
        jaxmoe.plan_dispatch(experts, num_experts)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_experts": 4.0}, TypeError, "`num_experts` must be an int; got a float"),
        ({"num_experts": True}, TypeError, "`num_experts` must be an int; got a bool"),
        ({"num_experts": 4, "alignment": 0}, ValueError, "`alignment` must be an int >= 1"),
        ({"num_experts": 4, "capacity": -1}, ValueError, "`capacity` must be an int >= 0"),
        ({"num_experts": 4, "capacity": 2.5}, TypeError, "`capacity` must be an int"),
    ],
)
def test_plan_dispatch_refuses_bad_counts(kwargs, error, match):
    with pytest.raises(error, match=match):
        jaxmoe.plan_dispatch(EXPERTS, **kwargs)


def test_checks_run_before_tracing():
    """The static checks fire under ``jit`` too (they read shapes); a traced id's value cannot
    be checked, so a valid routing plans as before."""
    with pytest.raises(ValueError, match="`num_experts` must be an int >= 1"):
        jax.jit(lambda e: jaxmoe.plan_dispatch(e, 0))(EXPERTS)
    with pytest.raises(ValueError, match="`experts` must be a 2-D integer array"):
        jax.jit(lambda e: jaxmoe.plan_dispatch(e, 4))(EXPERTS.astype(jnp.float32))
    traced = jax.jit(lambda e: jaxmoe.plan_dispatch(e, 4))(EXPERTS)
    eager = jaxmoe.plan_dispatch(EXPERTS, 4)
    for got, want in zip(traced, eager, strict=True):
        np.testing.assert_array_equal(got, want)


def test_valid_plans_are_unchanged():
    plan = jaxmoe.plan_dispatch(np.array(EXPERTS), np.int64(4), capacity=np.int32(1))
    np.testing.assert_array_equal(plan.tokens_per_expert, [2, 1, 1, 2])
    assert int(plan.dropped) == 2
    empty = jaxmoe.plan_dispatch(jnp.zeros((0, 2), jnp.int32), 4)  # no tokens: nothing to check
    assert empty.num_rows == 0


def test_dispatch_refuses_x_of_another_token_count():
    plan = jaxmoe.plan_dispatch(EXPERTS, 4)
    with pytest.raises(ValueError, match=r"dispatch: `x` must be 2-D with 3 rows.*shape \(5, 8\)"):
        jaxmoe.dispatch(jnp.ones((5, 8)), plan)
    with pytest.raises(ValueError, match=r"dispatch: `x` must be 2-D with 3 rows.*shape \(3,\)"):
        jaxmoe.dispatch(jnp.ones((3,)), plan)
    with pytest.raises(TypeError, match="dispatch: `plan` must be a DispatchPlan.*tuple"):
        jaxmoe.dispatch(jnp.ones((3, 8)), tuple(plan))
    assert jaxmoe.dispatch(jnp.ones((3, 8)), plan).shape == (plan.num_rows, 8)


def test_combine_refuses_mismatched_buffer_and_weights():
    plan = jaxmoe.plan_dispatch(EXPERTS, 4)
    buffer = jnp.ones((plan.num_rows, 8))
    weights = jnp.full((3, 2), 0.5)
    with pytest.raises(ValueError, match=r"combine: `buffer` must be 2-D with 6 rows"):
        jaxmoe.combine(buffer[:4], weights, plan)
    with pytest.raises(ValueError, match=r"combine: `weights` must be a float array \[T, K\]"):
        jaxmoe.combine(buffer, jnp.full((4, 2), 0.5), plan)
    with pytest.raises(ValueError, match=r"combine: `weights` must be a float.*int32"):
        jaxmoe.combine(buffer, jnp.ones((3, 2), jnp.int32), plan)
    with pytest.raises(TypeError, match="combine: `plan` must be a DispatchPlan"):
        jaxmoe.combine(buffer, weights, None)
    np.testing.assert_allclose(jaxmoe.combine(buffer, weights, plan), np.ones((3, 8)))
