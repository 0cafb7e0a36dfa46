"""The grouped matmul and the layer under JAX transforms, each against a plain Python loop.

``vmap`` (over axis 0, over another axis through ``in_axes``/``out_axes``, nested, with shared or
batched weights and group sizes), ``jax.hessian``, ``jax.checkpoint``, ``lax.scan`` over layers
and ``nnx.vmap``. The grouped matmul batches through its own rule (``primitives.py``) on every
backend: a recording backend shows that a backend only ever sees unbatched 2-D calls.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxmoe
import jaxmoe.nn
from jaxmoe.ops.grouped_matmul import ReferenceGroupedMatmul, grouped_matmul

RTOL = 1e-5
BACKENDS = ["reference", "xla"]
BATCH, ROWS, K, N, GROUPS = 3, 10, 4, 5, 3
# Per batch: ordinary, one group holding every row, rows past the groups, an empty batch.
GROUP_SIZES = np.array([[2, 3, 4], [0, 10, 0], [1, 1, 1]], np.int32)


def _close(got, want, rtol=RTOL):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape
        assert np.linalg.norm(a - b) <= rtol * max(np.linalg.norm(b), 1e-30), (a, b)


def _operands():
    keys = jax.random.split(jax.random.key(0), 2)
    lhs = jax.random.normal(keys[0], (BATCH, ROWS, K))
    rhs = jax.random.normal(keys[1], (BATCH, GROUPS, K, N))
    return lhs, rhs, jnp.asarray(GROUP_SIZES)


@dataclasses.dataclass(frozen=True)
class RecordingBackend(ReferenceGroupedMatmul):
    """The reference backend, recording the shapes of every call it receives."""

    calls: list = dataclasses.field(default_factory=list, compare=False, hash=False)

    def gmm(self, lhs, rhs, group_sizes, **kwargs):
        self.calls.append(("gmm", lhs.shape, rhs.shape, group_sizes.shape))
        return super().gmm(lhs, rhs, group_sizes, **kwargs)

    def tgmm(self, lhs, rhs, group_sizes, **kwargs):
        self.calls.append(("tgmm", lhs.shape, rhs.shape, group_sizes.shape))
        return super().tgmm(lhs, rhs, group_sizes, **kwargs)


# in_axes for (lhs, rhs, group_sizes): everything batched, weights shared, sizes shared.
IN_AXES = {"all": (0, 0, 0), "shared-rhs": (0, None, 0), "shared-sizes": (0, 0, None)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axes", IN_AXES)
def test_grouped_matmul_vmap_matches_loop(backend, axes):
    lhs, rhs, sizes = _operands()
    in_axes = IN_AXES[axes]
    args = [a if ax == 0 else a[0] for a, ax in zip((lhs, rhs, sizes), in_axes, strict=True)]

    def gmm(lhs, rhs, sizes):
        return grouped_matmul(lhs, rhs, sizes, backend=backend)

    def pick(values, i):
        return [v[i] if ax == 0 else v for v, ax in zip(values, in_axes, strict=True)]

    got = jax.vmap(gmm, in_axes)(*args)
    want = jnp.stack([gmm(*pick(args, i)) for i in range(BATCH)])
    _close(got, want)

    def loss_vmap(lhs, rhs):
        return jnp.sum(jax.vmap(gmm, in_axes)(lhs, rhs, args[2]) ** 2)

    def loss_loop(lhs, rhs):
        return sum(jnp.sum(gmm(*pick((lhs, rhs, args[2]), i)) ** 2) for i in range(BATCH))

    _close(jax.grad(loss_vmap, (0, 1))(*args[:2]), jax.grad(loss_loop, (0, 1))(*args[:2]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_matmul_vmap_other_axis_and_nested(backend):
    lhs, rhs, sizes = _operands()

    def gmm(lhs, rhs, sizes):
        return grouped_matmul(lhs, rhs, sizes, backend=backend)

    # Batch on axis 1 of lhs, result batched on axis 1.
    got = jax.vmap(gmm, in_axes=(1, 0, 0), out_axes=1)(lhs.transpose(1, 0, 2), rhs, sizes)
    want = jnp.stack([gmm(lhs[i], rhs[i], sizes[i]) for i in range(BATCH)], axis=1)
    _close(got, want)
    # vmap over vmap: two batch dims, each folded by its own level of the rule.
    lhs2 = jnp.stack([lhs, 2 * lhs])
    got = jax.vmap(jax.vmap(gmm, (0, 0, 0)), (0, None, None))(lhs2, rhs, sizes)
    want = jnp.stack(
        [jnp.stack([gmm(lhs2[j, i], rhs[i], sizes[i]) for i in range(BATCH)]) for j in range(2)]
    )
    _close(got, want)


def test_every_backend_batches_through_the_rule():
    backend = RecordingBackend()
    lhs, rhs, sizes = _operands()

    def loss(lhs, rhs):
        out = jax.vmap(lambda a, b: grouped_matmul(a, b, sizes[0], backend=backend))(lhs, rhs)
        return jnp.sum(out**2)

    jax.grad(loss, (0, 1))(lhs, rhs)
    # Every call is unbatched (2-D lhs); the batched ones arrive folded: B*M rows, B*G groups.
    assert all(len(call[1]) == 2 for call in backend.calls), backend.calls
    folded = {call for call in backend.calls if call[1][0] == BATCH * ROWS}
    assert {call[0] for call in folded} == {"gmm", "tgmm"}, backend.calls
    for kind, _, rhs_shape, sizes_shape in folded:
        assert sizes_shape == (BATCH * GROUPS,), (kind, sizes_shape)
        if kind == "gmm":
            assert rhs_shape[0] == BATCH * GROUPS, rhs_shape


def test_grouped_matmul_hessian_matches_loop_of_jvps():
    lhs, rhs, sizes = _operands()

    def loss(rhs):
        return jnp.sum(grouped_matmul(lhs[0], rhs, sizes[0], backend="xla") ** 3)

    hessian = jax.jit(jax.hessian(loss))(rhs[0])  # jitted: op by op it costs more than a compile
    flat_rhs = rhs[0].reshape(-1)
    # H e_i = jvp of the gradient along e_i, one at a time (one compiled jvp, not a vmap).
    column = jax.jit(lambda basis: jax.jvp(jax.grad(loss), (rhs[0],), (basis,))[1])
    columns = []
    for i in range(flat_rhs.size):
        basis = jnp.zeros_like(flat_rhs).at[i].set(1.0).reshape(rhs[0].shape)
        columns.append(column(basis).reshape(-1))
    _close(hessian.reshape(flat_rhs.size, flat_rhs.size), jnp.stack(columns, axis=1))


# --- The layer ---------------------------------------------------------------------------

CFG = jaxmoe.MoEConfig(
    num_experts=4, top_k=2, hidden_size=8, ffn_size=16, aux_loss_coef=1e-2, z_loss_coef=1e-3
)


def _layer_inputs(cfg=CFG, shape=(3, 5, 8)):
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    return params, jax.random.normal(jax.random.key(1), shape)


# The layer on one backend: the op-level tests above batch every backend through the same rule.
@pytest.mark.parametrize("backend", ["reference"])
def test_layer_vmap_axis0_and_axis1_match_loop(backend):
    cfg = dataclasses.replace(CFG, grouped_matmul_backend=backend)
    params, x = _layer_inputs(cfg)

    def layer(x):
        y, stats = jaxmoe.moe(params, x, cfg)
        return y, stats.aux_loss

    layer = jax.jit(layer)  # the loop's reference: one compile for every slice
    # vmap of the jitted layer: the same batching rules, without eager op-by-op dispatch.
    got = jax.vmap(layer)(x)
    want = jax.tree.map(lambda *parts: jnp.stack(parts), *[layer(x[i]) for i in range(3)])
    _close(got, want)
    # Over axis 1 of x, results on axis 1.
    got_y, got_aux = jax.vmap(layer, in_axes=1, out_axes=(1, 0))(x)
    want = [layer(x[:, j]) for j in range(x.shape[1])]
    _close(got_y, jnp.stack([w[0] for w in want], axis=1))
    _close(got_aux, jnp.stack([w[1] for w in want]))

    def loss(params, x):
        y, aux = jax.vmap(lambda t: layer_with(params, t, cfg))(x)
        return jnp.sum(y**2) + jnp.sum(aux)

    def loss_loop(params, x):
        parts = [layer_with(params, x[i], cfg) for i in range(3)]
        return sum(jnp.sum(y**2) + aux for y, aux in parts)

    # Jitted: the batching rules are the same under jit, and eager gradients compile every op.
    grads = jax.jit(jax.grad(loss, (0, 1)))(params, x)
    _close(grads, jax.jit(jax.grad(loss_loop, (0, 1)))(params, x))


def layer_with(params, x, cfg):
    y, stats = jaxmoe.moe(params, x, cfg)
    return y, stats.aux_loss


def test_layer_hessian_matches_loop_of_jvps():
    params, x = _layer_inputs(shape=(3, 8))

    def loss(x):
        y, aux = layer_with(params, x, CFG)
        return jnp.sum(y**2) + aux

    hessian = jax.jit(jax.hessian(loss))(x).reshape(x.size, x.size)
    column = jax.jit(lambda basis: jax.jvp(jax.grad(loss), (x,), (basis,))[1])
    columns = [column(jnp.zeros(x.size).at[i].set(1.0).reshape(x.shape)) for i in range(x.size)]
    _close(hessian, jnp.stack([c.reshape(-1) for c in columns], axis=1))


def test_layer_checkpoint_matches_plain():
    params, x = _layer_inputs()

    def loss(params, x):
        y, aux = layer_with(params, x, CFG)
        return jnp.sum(y**2) + aux

    want = jax.jit(jax.grad(loss, (0, 1)))(params, x)
    _close(jax.grad(jax.checkpoint(loss), (0, 1))(params, x), want)  # eager
    _close(jax.jit(jax.grad(jax.remat(loss), (0, 1)))(params, x), want)


def test_layer_scan_over_layers_matches_loop():
    layers = 3
    keys = jax.random.split(jax.random.key(0), layers)
    stacked = jax.vmap(lambda key: jaxmoe.init_params(key, CFG))(keys)
    x = jax.random.normal(jax.random.key(1), (2, 5, 8))

    def scanned(stacked, x):
        def body(h, params):
            y, stats = jaxmoe.moe(params, h, CFG)
            return h + y, stats.aux_loss

        h, aux = jax.lax.scan(jax.checkpoint(body), x, stacked)
        return jnp.sum(h**2) + jnp.sum(aux)

    def looped(stacked, x):
        h, total = x, 0.0
        for i in range(layers):
            y, stats = jaxmoe.moe(jax.tree.map(lambda leaf, i=i: leaf[i], stacked), h, CFG)
            h, total = h + y, total + stats.aux_loss
        return jnp.sum(h**2) + total

    _close(scanned(stacked, x), jax.jit(looped)(stacked, x))
    # Jitted gradients: eager ones compile every op of the unrolled loop.
    grads = jax.jit(jax.grad(scanned, (0, 1)))(stacked, x)
    _close(grads, jax.jit(jax.grad(looped, (0, 1)))(stacked, x))


def test_nnx_vmap_matches_loop():
    layer = jaxmoe.nn.MoE(CFG, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 5, 8))

    @nnx.vmap(in_axes=(None, 0))
    def apply(layer, x):
        y, stats = layer(x)
        return y, stats.load_balancing_loss

    got = apply(layer, x)
    # The loop's reference jitted (one compile for every slice): eager calls dispatch op by op.
    call = nnx.jit(lambda layer, x: layer(x))
    want = [call(layer, x[i]) for i in range(3)]
    _close(got[0], jnp.stack([w[0] for w in want]))
    _close(got[1], jnp.stack([w[1].load_balancing_loss for w in want]))


def _tiny_layer_loss():
    cfg = jaxmoe.MoEConfig(4, 2, 4, 6)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (5, 4))
    return (lambda x: jaxmoe.moe(params, x, cfg)[0]), x, (params, cfg)


@functools.cache
def _tiny_layer_jacobian():
    """The tiny layer's jitted ``jacrev`` in ``x`` (forward mode: tests/test_forward_mode.py)."""
    layer, x, _ = _tiny_layer_loss()
    return jax.jit(jax.jacrev(layer))(x)


def test_layer_jacrev_matches_central_differences():
    layer, x, (params, cfg) = _tiny_layer_loss()

    def experts(x):
        return np.asarray(jaxmoe.route(x @ params["router"]["kernel"], cfg).experts)

    jacobian = np.asarray(_tiny_layer_jacobian(), np.float64).reshape(-1, x.size)
    step = 1e-2
    columns = []
    for i in range(x.size):
        basis = jnp.zeros(x.size).at[i].set(step).reshape(x.shape)
        # The routing is piecewise constant: both sides must choose the same experts.
        np.testing.assert_array_equal(experts(x + basis), experts(x - basis))
        plus, minus = (np.asarray(layer(x + s * basis), np.float64) for s in (1, -1))
        columns.append(((plus - minus) / (2 * step)).reshape(-1))
    np.testing.assert_allclose(jacobian, np.stack(columns, axis=1), rtol=2e-2, atol=2e-3)
