"""Forward-mode autodiff through the layer: ``jax.jvp``, ``jax.jacfwd`` and ``jax.jacrev`` of
``moe`` (one device, every routing option, with capacity drops, on an expert-parallel mesh)
agree with each other and with central differences, eagerly and under ``jit``; the permutation's
ops against their plain ``jnp`` definition; the FP8 path refuses forward mode with its reason."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import jaxmoe
from jaxmoe import permutation

HIDDEN, EXPERTS, TOP_K, FFN, TOKENS = 8, 4, 2, 6, 6
ROUTINGS = {
    "softmax": {},
    "pre_softmax": {"pre_softmax": True},
    "sigmoid_bias": {"score": "sigmoid", "use_expert_bias": True},
    "sqrtsoftplus": {"score": "sqrtsoftplus"},
    "groups": {"num_groups": 2, "group_top_k": 1},
    "shared_expert": {"num_shared_experts": 1, "shared_ffn_size": 4, "shared_expert_gate": True},
    "capacity_drops": {"capacity_factor": 0.5},
    "capacity_probs": {"capacity_factor": 0.5, "capacity_drop_policy": "probs"},
}


def _case(seed=0, num_experts=EXPERTS, tokens=TOKENS, **options):
    cfg = jaxmoe.MoEConfig(num_experts, TOP_K, HIDDEN, FFN, **options)
    params = jaxmoe.init_params(jax.random.key(seed), cfg)
    x = jax.random.normal(jax.random.key(seed + 1), (tokens, HIDDEN))
    return cfg, params, x


def _flat(tree):
    return np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in jax.tree.leaves(tree)])


def _close(got, want, rtol, atol=0.0):
    np.testing.assert_allclose(_flat(got), _flat(want), rtol=rtol, atol=atol)


def _central_difference(f, x, direction, step):
    plus, minus = f(x + step * direction), f(x - step * direction)
    return (np.asarray(plus, np.float64) - np.asarray(minus, np.float64)) / (2 * step)


@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_jvp_jacfwd_and_jacrev_in_x_agree_with_central_differences(routing):
    cfg, params, x = _case(**ROUTINGS[routing])
    # The routing's stats, jitted once (op by op the layer costs more than its compile).
    stats = jax.jit(lambda x: jaxmoe.moe(params, x, cfg)[1])
    if cfg.capacity_factor is not None:
        assert int(stats(x).dropped_tokens) > 0  # drops are exercised

    def layer(x):
        return jaxmoe.moe(params, x, cfg)[0]

    direction = jax.random.normal(jax.random.key(7), x.shape)
    _, tangent = jax.jit(lambda x, t: jax.jvp(layer, (x,), (t,)))(x, direction)
    _, tangent_of_jit = jax.jvp(jax.jit(layer), (x,), (direction,))
    reverse = jax.jit(jax.jacrev(layer))(x)
    _close(jax.jit(jax.jacfwd(layer))(x), reverse, 1e-5, 1e-6)
    want = jnp.einsum("thsi,si->th", reverse, direction)
    tangents = [tangent, tangent_of_jit]
    if routing == "softmax":  # eagerly too (op by op: the same rules, so one routing suffices;
        # jacfwd is jvp under vmap: test_forward_mode_under_vmap_of_the_layer)
        tangents.append(jax.jvp(layer, (x,), (direction,))[1])
    for got in tangents:
        _close(got, want, 1e-5, 1e-6)
    step = 1e-3
    # The routing is piecewise constant: both sides of the difference must route alike.
    for s in (step, -step):
        moved = stats(x + s * direction).tokens_per_expert
        np.testing.assert_array_equal(moved, stats(x).tokens_per_expert)
    _close(tangent, _central_difference(jax.jit(layer), x, direction, step), 2e-2, 2e-3)


@pytest.mark.parametrize("routing", ["softmax", "sigmoid_bias", "capacity_drops"])
def test_jvp_in_the_parameters_agrees_with_jacrev_and_central_differences(routing):
    cfg, params, x = _case(**ROUTINGS[routing])

    def layer(params):
        return jaxmoe.moe(params, x, cfg)[0]

    keys = iter(jax.random.split(jax.random.key(3), 32))
    direction = jax.tree.map(lambda p: jax.random.normal(next(keys), p.shape, p.dtype), params)
    if "expert_bias" in params:  # selection only: no gradient to compare
        direction = {**direction, "expert_bias": jnp.zeros_like(params["expert_bias"])}
    _, tangent = jax.jit(lambda p, t: jax.jvp(layer, (p,), (t,)))(params, direction)
    jacobian = jax.jit(jax.jacrev(layer))(params)
    want = sum(
        jnp.tensordot(j, d, axes=d.ndim)
        for j, d in zip(jax.tree.leaves(jacobian), jax.tree.leaves(direction), strict=True)
    )
    _close(tangent, want, 1e-5, 1e-6)
    forward = jax.jit(jax.jacfwd(layer))(params)
    _close(forward, jacobian, 1e-5, 1e-6)
    step = 1e-3

    def shifted(s):
        return jax.tree.map(lambda p, d: p + s * d, params, direction)

    plus, minus = (jax.jit(layer)(shifted(s)) for s in (step, -step))
    difference = (np.asarray(plus, np.float64) - np.asarray(minus, np.float64)) / (2 * step)
    _close(tangent, difference, 2e-2, 2e-3)


def test_bfloat16_layer_jvp_matches_jacrev():
    cfg, params, x = _case()
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    x = x.astype(jnp.bfloat16)

    def layer(x):
        return jaxmoe.moe(params, x, cfg)[0].astype(jnp.float32)

    direction = jax.random.normal(jax.random.key(7), x.shape, jnp.bfloat16)
    _, tangent = jax.jit(lambda x, t: jax.jvp(layer, (x,), (t,)))(x, direction)
    assert tangent.dtype == jnp.float32
    reverse = jax.jit(jax.jacrev(layer))(x).astype(jnp.float32)
    want = jnp.einsum("thsi,si->th", reverse, direction.astype(jnp.float32))
    _close(tangent, want, 2e-2, 2e-2)


def test_forward_mode_under_vmap_of_the_layer():
    cfg, params, x = _case(tokens=4)
    xs = jnp.stack([x, 2 * x, -x])

    def layer(x):
        return jaxmoe.moe(params, x, cfg)[0]

    directions = jax.random.normal(jax.random.key(5), xs.shape)
    batched = jax.jit(jax.vmap(lambda x, t: jax.jvp(layer, (x,), (t,))[1]))(xs, directions)
    for i in range(3):
        _close(batched[i], jax.jvp(layer, (xs[i],), (directions[i],))[1], 1e-5, 1e-6)


def test_second_order_forward_over_forward():
    cfg, params, x = _case(tokens=3)

    def energy(x):
        return jnp.sum(jaxmoe.moe(params, x, cfg)[0] ** 2)

    _close(jax.jit(jax.jacfwd(jax.jacfwd(energy)))(x), jax.jit(jax.hessian(energy))(x), 1e-4, 1e-5)


# --- the permutation's ops against their definition ------------------------------------------


def _plan(capacity=None, alignment=1):
    experts = jnp.array([[0, 2], [1, 2], [2, 0], [2, 3], [0, 1]], jnp.int32)
    return permutation.plan_dispatch(experts, 4, alignment=alignment, capacity=capacity)


@pytest.mark.parametrize("capacity", [None, 1])
def test_dispatch_and_combine_tangents_are_their_definitions(capacity):
    plan = _plan(capacity=capacity, alignment=2)
    keys = jax.random.split(jax.random.key(0), 6)
    x, dx = (jax.random.normal(k, (5, 3)) for k in keys[:2])
    buffer, db = (jax.random.normal(k, (plan.num_rows, 3)) for k in keys[2:4])
    weights, dw = (jax.random.uniform(k, (5, 2)) for k in keys[4:])
    row = np.asarray(plan.assignment_row)

    def dispatch_definition(x):
        token = np.asarray(plan.row_assignment) // 2
        return jnp.where((token < 5)[:, None], x[np.minimum(token, 4)], 0.0)

    def combine_definition(buffer, weights):
        rows = jnp.where(
            (row < plan.num_rows)[..., None], buffer[np.minimum(row, plan.num_rows - 1)], 0
        )
        return jnp.einsum("tk,tkh->th", weights, rows)

    got = jax.jvp(lambda x: permutation.dispatch(x, plan), (x,), (dx,))
    want = jax.jvp(dispatch_definition, (x,), (dx,))
    _close(got, want, 1e-6)
    combine = jax.jit(lambda b, w: permutation.combine(b, w, plan))
    got = jax.jvp(combine, (buffer, weights), (db, dw))
    want = jax.jvp(combine_definition, (buffer, weights), (db, dw))
    _close(got, want, 1e-6, 1e-6)
    index = jnp.array([2, 0, 4], jnp.int32)
    inverse = jnp.array([1, 3, 0, 3, 2], jnp.int32)  # 3: out of range, no row maps there
    got = jax.jvp(lambda v: permutation.permute_rows(v, index, inverse), (x,), (dx,))
    _close(got, (x[index], dx[index]), 0)


# --- expert parallel ---------------------------------------------------------------------------

# Each dispatch with its overflow windows, and a capacity. Merged away: "copies" and "tokens"
# under this case's random routing, which overflowed the fast slots too (1 and 2 copies): the
# same code as the *_overflow cases (fast window, then the overflow loop), whose routing of
# every token to expert 3 runs more windows.
EP_CASES = {
    "capacity": {"ep_dispatch": "copies", "capacity_factor": 1.0},
    "copies_overflow": {"ep_dispatch": "copies", "overflow": True},
    "tokens_overflow": {"ep_dispatch": "tokens", "overflow": True},
}


@pytest.mark.parametrize("case", list(EP_CASES))
def test_forward_mode_on_an_expert_parallel_mesh_matches_one_device(case):
    options = dict(EP_CASES[case])
    overflow = options.pop("overflow", False)
    mesh = Mesh(np.array(jax.devices()[:4]), ("ep",))
    cfg, params, x = _case(
        num_experts=8, tokens=8, score="sigmoid", use_expert_bias=True, ep_axis="ep", **options
    )
    if overflow:  # every token's first choice is expert 3: its slot overflows
        params = {**params, "expert_bias": jnp.zeros(8).at[3].set(10.0)}
        stats = jax.jit(lambda x: jaxmoe.moe(params, x, cfg, mesh=mesh)[1])(x)
        assert int(stats.overflow_tokens) > 0

    def layer(x, mesh):
        return jaxmoe.moe(
            params, x, cfg if mesh else dataclasses.replace(cfg, ep_axis=None), mesh=mesh
        )[0]

    direction = jax.random.normal(jax.random.key(7), x.shape)
    _, tangent = jax.jit(lambda x, t: jax.jvp(lambda x: layer(x, mesh), (x,), (t,)))(x, direction)
    forward = jax.jit(jax.jacfwd(lambda x: layer(x, mesh)))(x)
    reverse = jax.jit(jax.jacrev(lambda x: layer(x, mesh)))(x)
    _close(forward, reverse, 1e-5, 1e-6)
    want = jnp.einsum("thsi,si->th", reverse, direction)
    _close(tangent, want, 1e-5, 1e-6)
    if case == "capacity":  # eagerly too, once (op by op on the mesh: the same rules)
        _close(jax.jvp(lambda x: layer(x, mesh), (x,), (direction,))[1], want, 1e-5, 1e-6)
    if cfg.capacity_factor is None:  # a capacity is per shard: one device drops differently
        one_device = jax.jit(lambda x, t: jax.jvp(lambda x: layer(x, None), (x,), (t,))[1])
        _close(tangent, one_device(x, direction), 1e-5, 1e-6)


# --- FP8: refused with the reason ----------------------------------------------------------------


@pytest.mark.parametrize("where", ["one_device", "ep_fp8_dispatch"])
@pytest.mark.parametrize("transform", ["jvp", "jvp_of_jit", "jit_of_jvp", "jacfwd"])
def test_fp8_forward_mode_is_refused_with_the_reason(where, transform):
    hidden = 32
    options = {"fp8_recipe": "rowwise"}
    mesh = None
    if where == "ep_fp8_dispatch":
        options.update(ep_axis="ep", ep_dispatch="copies", ep_fp8_dispatch=True)
        mesh = Mesh(np.array(jax.devices()[:4]), ("ep",))
    cfg = jaxmoe.MoEConfig(8, TOP_K, hidden, 32, **options)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (8, hidden))

    def layer(x):
        return jaxmoe.moe(params, x, cfg, mesh=mesh)[0]

    t = jnp.ones_like(x)
    run = {
        "jvp": lambda: jax.jvp(layer, (x,), (t,)),
        "jvp_of_jit": lambda: jax.jvp(jax.jit(layer), (x,), (t,)),
        "jit_of_jvp": lambda: jax.jit(lambda x, t: jax.jvp(layer, (x,), (t,)))(x, t),
        "jacfwd": lambda: jax.jacfwd(layer)(x),
    }[transform]
    with pytest.raises(TypeError, match=r"jaxmoe: forward-mode autodiff .* FP8 path") as info:
        run()
    assert "jax.jacrev" in str(info.value) and "without fp8_recipe" in str(info.value)
    if transform == "jvp":  # reverse mode is untouched (once per layer)
        assert jnp.all(jnp.isfinite(jax.jit(jax.grad(lambda x: jnp.sum(layer(x))))(x)))
