"""Permutation contract: expert-major padded layout, capacity drops, dispatch/combine and VJPs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxmoe
from jaxmoe import debug
from tests import references as ref

# dispatch is a copy: exact. combine and the transposes sum K float32 products.
COMBINE_RTOL = 1e-6
COMBINE_ATOL = 1e-6
# <dispatch(x), b> vs <x, dispatch^T(b)>: two float32 reductions in different orders.
INNER_PRODUCT_RTOL = 1e-5


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _plan(experts, num_experts, alignment, capacity):
    return jaxmoe.plan_dispatch(experts, num_experts, alignment=alignment, capacity=capacity)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _everything(experts, num_experts, alignment, capacity, x, weights, cotangents):
    """Plan, forward passes and both VJPs in one compiled call (keeps the suite fast)."""
    cot_buffer, random_buffer, cot_out = cotangents
    plan = jaxmoe.plan_dispatch(experts, num_experts, alignment=alignment, capacity=capacity)
    buffer, dispatch_vjp = jax.vjp(lambda x: jaxmoe.dispatch(x, plan), x)
    (grad_x,) = dispatch_vjp(cot_buffer[: plan.num_rows])
    combined, combine_vjp = jax.vjp(
        lambda b, w: jaxmoe.combine(b, w, plan), random_buffer[: plan.num_rows], weights
    )
    grad_buffer, grad_weights = combine_vjp(cot_out)
    return {
        "plan": plan,
        "buffer": buffer,
        "out": jaxmoe.combine(buffer, weights, plan),
        "unit": jaxmoe.combine(buffer, jnp.ones_like(weights), plan),
        "grad_x": grad_x,
        "combined": combined,
        "grad_buffer": grad_buffer,
        "grad_weights": grad_weights,
    }


def _random_experts(rng, num_tokens, num_experts, top_k):
    return np.stack([rng.permutation(num_experts)[:top_k] for _ in range(num_tokens)]).astype(
        np.int32
    )


def _check_everything(experts, num_experts, alignment, capacity, seed=0):
    """Layout, counts, forward and both VJPs against the copy-by-copy reference."""
    experts = np.asarray(experts, np.int32)
    num_tokens, top_k = experts.shape
    rng = np.random.default_rng(seed)
    hidden = 5
    x = rng.normal(size=(num_tokens, hidden)).astype(np.float32)
    weights = rng.normal(size=(num_tokens, top_k)).astype(np.float32)
    # At least R, the rows of any buffer the plan may choose.
    max_rows = num_experts * (num_tokens * top_k + (capacity or 0) + alignment) + alignment
    cot_buffer = rng.normal(size=(max_rows, hidden)).astype(np.float32)
    random_buffer = rng.normal(size=(max_rows, hidden)).astype(np.float32)
    cot_out = rng.normal(size=(num_tokens, hidden)).astype(np.float32)
    layout = ref.layout_reference(experts, num_experts, alignment, capacity)
    live = int(layout.group_sizes.sum())

    got = _everything(
        jnp.asarray(experts),
        num_experts,
        alignment,
        capacity,
        jnp.asarray(x),
        jnp.asarray(weights),
        (jnp.asarray(cot_buffer), jnp.asarray(random_buffer), jnp.asarray(cot_out)),
    )
    plan = got["plan"]
    np.testing.assert_array_equal(plan.group_sizes, layout.group_sizes)
    np.testing.assert_array_equal(plan.tokens_per_expert, layout.tokens_per_expert)
    assert int(plan.dropped) == layout.dropped
    assert plan.group_sizes.dtype == jnp.int32
    num_rows = plan.num_rows
    assert num_rows >= live  # the static buffer holds every block

    buffer = got["buffer"]
    assert buffer.shape == (num_rows, hidden)
    d_matrix = ref.dispatch_matrix(layout, num_tokens)
    np.testing.assert_array_equal(buffer[:live], d_matrix @ x)  # copies, zero padding rows
    np.testing.assert_array_equal(buffer[live:], 0.0)  # unused tail: zeros (no poison)
    m_matrix = ref.combine_matrix(layout, weights)
    np.testing.assert_allclose(
        got["out"], m_matrix @ d_matrix @ x, rtol=COMBINE_RTOL, atol=COMBINE_ATOL
    )

    # Unit weights: each token comes back once per kept copy (K times when dropless).
    kept = ref.kept_mask(experts, num_experts, capacity)
    np.testing.assert_allclose(got["unit"], kept.sum(1)[:, None] * x, rtol=COMBINE_RTOL)

    # dispatch's VJP is D^T; combine's VJPs are M^T (buffer) and the per-copy inner products.
    np.testing.assert_allclose(
        got["grad_x"], d_matrix.T @ cot_buffer[:live], rtol=COMBINE_RTOL, atol=COMBINE_ATOL
    )
    np.testing.assert_allclose(
        got["combined"], m_matrix @ random_buffer[:live], rtol=COMBINE_RTOL, atol=COMBINE_ATOL
    )
    grad_buffer = got["grad_buffer"]
    np.testing.assert_allclose(
        grad_buffer[:live], m_matrix.T @ cot_out, rtol=COMBINE_RTOL, atol=COMBINE_ATOL
    )
    np.testing.assert_array_equal(grad_buffer[live:], 0.0)
    want_grad_weights = np.zeros((num_tokens, top_k))
    for t in range(num_tokens):
        for j in range(top_k):
            if layout.row_of[t, j] >= 0:
                want_grad_weights[t, j] = cot_out[t] @ random_buffer[layout.row_of[t, j]]
    np.testing.assert_allclose(
        got["grad_weights"], want_grad_weights, rtol=COMBINE_RTOL, atol=COMBINE_ATOL
    )
    return plan, layout


# ----------------------------------------------------------------------------- hand cases


def test_layout_by_hand():
    experts = np.array([[0, 2], [2, 1], [0, 2], [1, 0]])
    x = jnp.arange(4.0)[:, None] + 1.0  # token t is the value t + 1
    plan = _plan(jnp.asarray(experts, jnp.int32), 3, 1, None)
    np.testing.assert_array_equal(plan.group_sizes, [3, 2, 3])
    np.testing.assert_array_equal(jaxmoe.dispatch(x, plan)[:, 0], [1, 3, 4, 2, 4, 1, 2, 3])
    padded = _plan(jnp.asarray(experts, jnp.int32), 3, 4, None)
    np.testing.assert_array_equal(padded.group_sizes, [4, 4, 4])
    np.testing.assert_array_equal(
        jaxmoe.dispatch(x, padded)[:12, 0], [1, 3, 4, 0, 2, 4, 0, 0, 1, 2, 3, 0]
    )
    # Capacity 2: expert 0 drops token 3's copy, expert 2 drops token 2's copy.
    capped = _plan(jnp.asarray(experts, jnp.int32), 3, 1, 2)
    np.testing.assert_array_equal(capped.group_sizes, [2, 2, 2])
    np.testing.assert_array_equal(jaxmoe.dispatch(x, capped)[:, 0], [1, 3, 2, 4, 1, 2])
    np.testing.assert_array_equal(capped.tokens_per_expert, [3, 2, 3])
    assert int(capped.dropped) == 2


@pytest.mark.parametrize("alignment, capacity", [(1, None), (3, None), (1, 2), (8, 5)])
def test_random_routing(alignment, capacity):
    experts = _random_experts(np.random.default_rng(1), 13, 6, 2)
    _check_everything(experts, 6, alignment, capacity)


@pytest.mark.parametrize("alignment", [1, 8])
@pytest.mark.parametrize("capacity", [None, 3])
def test_every_token_on_one_expert(alignment, capacity):
    # Experts 0 and 2 get everything; 1 and 3 are empty.
    experts = np.tile(np.array([[2, 0]], np.int32), (7, 1))
    plan, layout = _check_everything(experts, 4, alignment, capacity)
    assert layout.tokens_per_expert.tolist() == [7, 0, 7, 0]
    if capacity is None:
        assert plan.group_sizes.tolist() == [
            ref.round_up(7, alignment),
            0,
            ref.round_up(7, alignment),
            0,
        ]
    else:
        assert int(plan.dropped) == 2 * (7 - capacity)


@pytest.mark.parametrize("num_tokens", [1, 5, 9])  # not multiples of the alignment
def test_tokens_not_a_multiple_of_alignment(num_tokens):
    experts = _random_experts(np.random.default_rng(num_tokens), num_tokens, 5, 3)
    _check_everything(experts, 5, 8, None)


def test_single_expert_and_top_k_equal_to_experts():
    _check_everything(np.zeros((6, 1), np.int32), 1, 4, None)
    _check_everything(_random_experts(np.random.default_rng(2), 6, 3, 3), 3, 2, None)


def test_capacity_drops_are_counted_exactly():
    rng = np.random.default_rng(3)
    experts = np.concatenate([np.zeros((9, 1), np.int32), rng.integers(1, 4, (9, 1))], axis=1)
    counts = np.bincount(experts.reshape(-1), minlength=4)
    for capacity in (1, 4, 20):
        plan, _ = _check_everything(experts, 4, 2, capacity)
        assert int(plan.dropped) == int(np.sum(np.maximum(counts - capacity, 0)))
        np.testing.assert_array_equal(plan.tokens_per_expert, counts)  # counted before drops


def test_inner_product_identities_of_the_vjps():
    """<dispatch(x), b> == <x, dispatch^T(b)> and <combine(B, w), g> == <B, d_B> == <w, d_w>."""
    rng = np.random.default_rng(4)
    experts = jnp.asarray(_random_experts(rng, 11, 6, 2))
    plan = _plan(experts, 6, 8, None)
    x = jnp.asarray(rng.normal(size=(11, 7)), jnp.float32)
    b = jnp.asarray(rng.normal(size=(plan.num_rows, 7)), jnp.float32)
    buffer, dispatch_vjp = jax.vjp(lambda x: jaxmoe.dispatch(x, plan), x)
    (x_bar,) = dispatch_vjp(b)
    np.testing.assert_allclose(jnp.vdot(buffer, b), jnp.vdot(x, x_bar), rtol=INNER_PRODUCT_RTOL)
    w = jnp.asarray(rng.normal(size=(11, 2)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(11, 7)), jnp.float32)
    out, combine_vjp = jax.vjp(lambda b, w: jaxmoe.combine(b, w, plan), b, w)
    b_bar, w_bar = combine_vjp(g)
    np.testing.assert_allclose(jnp.vdot(out, g), jnp.vdot(b, b_bar), rtol=INNER_PRODUCT_RTOL)
    np.testing.assert_allclose(jnp.vdot(out, g), jnp.vdot(w, w_bar), rtol=INNER_PRODUCT_RTOL)
    # And they are each other's transposes: dispatch^T(b) = combine(b, 1) on the live rows.
    live = int(jnp.sum(plan.group_sizes))
    np.testing.assert_allclose(
        x_bar, jaxmoe.combine(b.at[live:].set(0.0), jnp.ones_like(w), plan), rtol=COMBINE_RTOL
    )
    _, unit_vjp = jax.vjp(lambda b: jaxmoe.combine(b, jnp.ones_like(w), plan), b)
    np.testing.assert_allclose(unit_vjp(g)[0][:live], jaxmoe.dispatch(g, plan)[:live])


def test_dtypes():
    experts = jnp.asarray(_random_experts(np.random.default_rng(5), 6, 4, 2))
    plan = _plan(experts, 4, 2, None)
    x = jax.random.normal(jax.random.key(0), (6, 8)).astype(jnp.bfloat16)
    buffer = jaxmoe.dispatch(x, plan)
    assert buffer.dtype == jnp.bfloat16
    out = jaxmoe.combine(buffer, jnp.ones((6, 2)), plan)
    assert out.dtype == jnp.float32  # documented: float32 accumulation and result
    np.testing.assert_array_equal(out, 2.0 * np.asarray(x, np.float32))
    for field in (
        "row_assignment",
        "assignment_row",
        "group_sizes",
        "tokens_per_expert",
        "dropped",
    ):
        assert getattr(plan, field).dtype == jnp.int32, field


def test_permutation_is_deterministic_under_jit():
    rng = np.random.default_rng(6)
    experts = jnp.asarray(_random_experts(rng, 17, 5, 2))
    x = jnp.asarray(rng.normal(size=(17, 6)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(17, 2)), jnp.float32)

    def loss(x, w):
        plan = jaxmoe.plan_dispatch(experts, 5, alignment=4)
        buffer = jaxmoe.dispatch(x, plan)
        return jnp.sum(jaxmoe.combine(jnp.sin(buffer), w, plan) ** 2)

    first = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    second = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- poison


def test_poison_marks_the_unused_tail_and_combine_never_reads_it():
    rng = np.random.default_rng(7)
    experts = jnp.asarray(_random_experts(rng, 5, 4, 2))
    x = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(5, 2)), jnp.float32)

    def run(x, w):
        plan = jaxmoe.plan_dispatch(experts, 4, alignment=8)
        buffer = jaxmoe.dispatch(x, plan)
        out, vjp = jax.vjp(lambda b, w: jaxmoe.combine(b, w, plan), buffer, w)
        return buffer, out, vjp(jnp.ones_like(out)), jnp.sum(plan.group_sizes)

    clean = jax.jit(run)(x, w)
    with debug.poison_buffers():
        # The mode is read at trace time: a fresh function, since jit caches traces per function.
        poisoned = jax.jit(lambda x, w: run(x, w))(x, w)
        poisoned_eager = run(x, w)
    live = int(clean[3])
    assert live < clean[0].shape[0], "the case must have an unused tail"
    for buffer, out, (grad_buffer, grad_w), _ in (poisoned, poisoned_eager):
        assert bool(jnp.all(jnp.isnan(buffer[live:])))
        np.testing.assert_array_equal(buffer[:live], clean[0][:live])
        # Equal up to float32 rounding (the poisoned program may fuse differently), not NaN.
        np.testing.assert_allclose(out, clean[1], rtol=COMBINE_RTOL, atol=COMBINE_ATOL)
        np.testing.assert_allclose(grad_w, clean[2][1], rtol=COMBINE_RTOL, atol=COMBINE_ATOL)
        np.testing.assert_allclose(
            grad_buffer[:live], clean[2][0][:live], rtol=COMBINE_RTOL, atol=COMBINE_ATOL
        )
    assert not debug.poison_enabled()


# ----------------------------------------------------------------------------- property


@st.composite
def routings(draw):
    num_experts = draw(st.integers(1, 6))
    top_k = draw(st.integers(1, min(num_experts, 3)))
    num_tokens = draw(st.integers(1, 10))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    if draw(st.booleans()):
        experts = _random_experts(rng, num_tokens, num_experts, top_k)
    else:  # skewed: every token picks the same experts
        experts = np.tile(_random_experts(rng, 1, num_experts, top_k), (num_tokens, 1))
    alignment = draw(st.sampled_from([1, 2, 3, 8]))
    capacity = draw(st.none() | st.integers(1, num_tokens * top_k + 1))
    return experts, num_experts, alignment, capacity, seed


@settings(max_examples=12, deadline=None, derandomize=True)
@given(routings())
def test_permutation_matches_reference_property(problem):
    _check_everything(*problem)
