"""Derivatives of every order through the grouped matmul, on every backend, against a dense
``jnp`` product: ``grad`` of ``grad`` (reverse over reverse, which needs each product's
transpose to be a grouped matmul again), a third-order reverse derivative, forward over forward
(``jacfwd`` of ``jacfwd``) and ``grad`` of ``grad`` under ``vmap``; and a gradient penalty
through the whole layer."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe.ops.grouped_matmul import grouped_matmul
from jaxmoe.ops.grouped_matmul.pallas_triton import PallasTritonGroupedMatmul, TileConfig

RTOL = 1e-5
ROWS, K, N = 12, 5, 4
GROUP_SIZES = jnp.array([3, 0, 6], jnp.int32)  # an empty group; 3 rows past the groups
SMALL_TILES = TileConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)
BACKENDS = {
    "reference": "reference",
    "xla": "xla",
    "pallas_triton": PallasTritonGroupedMatmul(gmm_tiles=SMALL_TILES, tgmm_tiles=SMALL_TILES),
}


def _dense(lhs, rhs, group_sizes):
    """The grouped matmul as one dense product: each row times its group's matrix, 0 past."""
    ids = jnp.repeat(jnp.arange(rhs.shape[0]), group_sizes, total_repeat_length=lhs.shape[0])
    inside = jnp.arange(lhs.shape[0]) < jnp.sum(group_sizes)
    out = jnp.einsum("mk,mkn->mn", lhs, rhs[ids], precision="highest")
    return jnp.where(inside[:, None], out, 0.0)


def _operands():
    keys = jax.random.split(jax.random.key(0), 2)
    return jax.random.normal(keys[0], (ROWS, K)), jax.random.normal(keys[1], (3, K, N))


def _close(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) <= RTOL * np.linalg.norm(want)


def _losses(backend):
    def ours(lhs, rhs):
        return jnp.sum(jnp.sin(grouped_matmul(lhs, rhs, GROUP_SIZES, backend=backend)))

    def dense(lhs, rhs):
        return jnp.sum(jnp.sin(_dense(lhs, rhs, GROUP_SIZES)))

    return ours, dense


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_grad_of_grad_matches_dense(backend):
    lhs, rhs = _operands()
    ours, dense = _losses(BACKENDS[backend])

    def penalty(loss):
        # d/d lhs of |d loss / d rhs|^2: reverse mode through the weight gradient's transpose.
        return jax.grad(lambda x: jnp.sum(jax.grad(loss, 1)(x, rhs) ** 2))(lhs)

    _close(jax.jit(lambda: penalty(ours))(), jax.jit(lambda: penalty(dense))())


@pytest.mark.parametrize("backend", ["reference", "xla"])
def test_third_order_reverse_and_forward_over_forward_match_dense(backend):
    lhs, rhs = _operands()
    ours, dense = _losses(backend)

    def third(loss):
        inner = lambda r: jnp.sum(jax.grad(loss, 0)(lhs, r) ** 2)  # noqa: E731
        return jax.grad(lambda r: jnp.sum(jax.grad(inner)(r) ** 2))(rhs)

    # Jitted: the derivative rules are the same under jit, and eager ones dispatch op by op.
    _close(jax.jit(third, static_argnums=0)(ours), jax.jit(third, static_argnums=0)(dense))
    hessian = lambda loss: jax.jit(jax.jacfwd(jax.jacfwd(loss, 1), 1))(lhs, rhs)  # noqa: E731
    _close(hessian(ours), hessian(dense))


def test_vmap_of_grad_of_grad_matches_dense():
    lhs, rhs = _operands()
    batch = jnp.stack([lhs, 2 * lhs, -lhs])
    ours, dense = _losses("reference")

    def penalty(loss):
        return lambda x: jax.grad(lambda x: jnp.sum(jax.grad(loss, 1)(x, rhs) ** 2))(x)

    _close(jax.jit(jax.vmap(penalty(ours)))(batch), jax.jit(jax.vmap(penalty(dense)))(batch))


def test_gradient_penalty_through_the_layer_matches_the_xla_backend_and_is_finite():
    # A WGAN-GP-style penalty |d y / d x|^2 differentiated in the parameters: the layer's whole
    # backward pass is differentiated again. The reference and xla backends must agree.
    cfg = jaxmoe.MoEConfig(8, 2, 16, 32, aux_loss_coef=1e-2)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (2, 8, 16))

    def penalty(params, backend):
        cfg_b = dataclasses.replace(cfg, grouped_matmul_backend=backend)
        y_sum = lambda x: jnp.sum(jaxmoe.moe(params, x, cfg_b)[0] ** 2)  # noqa: E731
        return jnp.sum(jax.grad(y_sum)(x) ** 2)

    got = jax.jit(jax.grad(penalty), static_argnums=1)(params, "reference")
    want = jax.jit(jax.grad(penalty), static_argnums=1)(params, "xla")
    leaves = jax.tree.leaves(got)
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in leaves)
    assert any(float(jnp.abs(leaf).max()) > 0 for leaf in jax.tree.leaves(got["experts"]))
    for a, b in zip(leaves, jax.tree.leaves(want), strict=True):
        _close(a, b)
