"""Edge inputs: zero tokens, negative or traced group sizes, Python lists, a traced ``cfg`` or
``mesh``, and eager ``jax.grad`` through the sharded layer (8 simulated CPU devices)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe import losses
from jaxmoe.ops.grouped_matmul import grouped_matmul

CFG = jaxmoe.MoEConfig(
    num_experts=8,
    top_k=2,
    hidden_size=16,
    ffn_size=32,
    aux_loss_coef=1e-2,
    seq_aux_loss_coef=1e-2,
    z_loss_coef=1e-3,
)
EP_CFG = dataclasses.replace(CFG, ep_axis="ep", data_axes=("fsdp",))
RTOL = 1e-5


def _mesh():
    return jax.make_mesh((2, 4), ("fsdp", "ep"))


def _loss(params, x, cfg, mesh=None):
    y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh)
    return jnp.sum(y**2) + stats.aux_loss


def _assert_empty_result(y, stats, shape):
    assert y.shape == shape and y.dtype == jnp.float32
    for name in ("aux_loss", "load_balancing_loss", "seq_aux_loss", "z_loss"):
        assert float(getattr(stats, name)) == 0.0, name  # 0, not NaN
    assert stats.tokens_per_expert.shape == (CFG.num_experts,)
    assert not np.any(np.asarray(stats.tokens_per_expert))
    assert int(stats.dropped_tokens) == 0 and int(stats.overflow_tokens) == 0


# --- Zero tokens --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0, 16), (0, 32, 16), (4, 0, 16)])
def test_zero_tokens_one_device(shape):
    params = jaxmoe.init_params(jax.random.key(0), CFG)
    x = jnp.zeros(shape)
    _assert_empty_result(*jaxmoe.moe(params, x, CFG), shape)
    _assert_empty_result(*jax.jit(jaxmoe.moe, static_argnames="cfg")(params, x, cfg=CFG), shape)
    # The gradients jitted: the same rules as eager dispatch, one program instead of one per op.
    grads = jax.jit(jax.grad(_loss, (0, 1)), static_argnums=2)(params, x, CFG)
    assert grads[1].shape == shape
    for leaf in jax.tree.leaves(grads):
        assert np.all(np.asarray(leaf) == 0.0)  # finite and zero: nothing was computed


@pytest.mark.parametrize("shape", [(0, 16), (0, 4, 16)])
def test_zero_tokens_on_a_mesh(shape):
    params = jaxmoe.init_params(jax.random.key(0), CFG)
    x, mesh = jnp.zeros(shape), _mesh()
    _assert_empty_result(*jaxmoe.moe(params, x, EP_CFG, mesh=mesh), shape)
    grad = jax.jit(jax.grad(_loss, (0, 1)), static_argnums=(2, 3))
    for leaf in jax.tree.leaves(grad(params, x, EP_CFG, mesh)):
        assert np.all(np.asarray(leaf) == 0.0)


def test_losses_over_nothing_are_zero_not_nan():
    logits = jnp.zeros((0, 4))
    experts = jnp.zeros((0, 2), jnp.int32)
    for sequences in (0, 1, 3):
        terms = losses.loss_terms(logits, jax.nn.softmax(logits), experts, sequences)
        assert [float(v) for v in losses.finish_losses(terms, 4, 2)] == [0.0, 0.0, 0.0]


# --- Group sizes: negative, traced, lists -------------------------------------------------


def _gmm_operands():
    keys = jax.random.split(jax.random.key(0), 2)
    return jax.random.normal(keys[0], (12, 4)), jax.random.normal(keys[1], (4, 4, 3))


@pytest.mark.parametrize(
    "sizes", [jnp.array([-2, 6, 6, 6]), np.array([4, -1, 4, 4]), [4, 4, 4, -4]]
)
def test_concrete_negative_group_sizes_raise(sizes):
    lhs, rhs = _gmm_operands()
    with pytest.raises(ValueError, match=r"`group_sizes` must be >= 0.*got -\d at index"):
        grouped_matmul(lhs, rhs, sizes)


def test_traced_negative_group_sizes_count_as_zero():
    lhs, rhs = _gmm_operands()
    negative, zeroed = jnp.array([-2, 6, 6, 6]), jnp.array([0, 6, 6, 0])
    want = grouped_matmul(lhs, rhs, zeroed)  # 6 + 6 rows, then clipped at M = 12
    got = jax.jit(grouped_matmul)(lhs, rhs, negative)
    np.testing.assert_allclose(got, want, rtol=RTOL)

    def loss(lhs, rhs, sizes):
        return jnp.sum(grouped_matmul(lhs, rhs, sizes) ** 2)

    got = jax.jit(jax.grad(loss, (0, 1)))(lhs, rhs, negative)
    for a, b in zip(got, jax.grad(loss, (0, 1))(lhs, rhs, zeroed), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-6)


def test_list_arguments_are_converted():
    lhs, rhs = _gmm_operands()
    want = grouped_matmul(lhs, rhs, jnp.array([3, 3, 3, 3]))
    np.testing.assert_array_equal(grouped_matmul(lhs, rhs, [3, 3, 3, 3]), want)
    np.testing.assert_array_equal(grouped_matmul(lhs, rhs, (3, 3, 3, 3)), want)
    np.testing.assert_array_equal(grouped_matmul(np.asarray(lhs).tolist(), rhs, [3] * 4), want)

    params = jaxmoe.init_params(jax.random.key(0), CFG)
    x = jax.random.normal(jax.random.key(1), (5, 16))
    y_list, _ = jaxmoe.moe(params, np.asarray(x).tolist(), CFG)
    np.testing.assert_array_equal(y_list, jaxmoe.moe(params, x, CFG)[0])


def test_unconvertible_lists_are_refused_without_dumping_them():
    lhs, rhs = _gmm_operands()
    with pytest.raises(ValueError, match=r"`group_sizes` must be an array.*list of length 4") as e:
        grouped_matmul(lhs, rhs, [3, 3, [3], 3])
    assert "[3" not in str(e.value)
    params = jaxmoe.init_params(jax.random.key(0), CFG)
    ragged = [[0.5] * 16] * 300 + [[0.5] * 15]
    with pytest.raises(ValueError, match=r"`x` must be an array.*list of length 301") as e:
        jaxmoe.moe(params, ragged, CFG)
    assert len(str(e.value)) < 300 and "0.5" not in str(e.value)
    with pytest.raises(ValueError, match=r"`x` must be an array.*got a tuple of length 2"):
        jaxmoe.moe(params, (None, None), CFG)


# --- cfg and mesh are static --------------------------------------------------------------


def test_traced_cfg_says_to_make_it_static():
    params = jaxmoe.init_params(jax.random.key(0), CFG)
    x = jnp.ones((4, 16))
    with pytest.raises(ValueError, match=r"`cfg` was traced.*static_argnames=\"cfg\""):
        jax.jit(jaxmoe.moe)(params, x, CFG)
    with pytest.raises(ValueError, match=r"`mesh` was traced.*static_argnames=\(\"cfg\", \"mesh\""):
        jax.jit(lambda m: jaxmoe.moe(params, x, CFG, mesh=m))(jnp.ones(8))
    with pytest.raises(ValueError, match=r"`mesh` must be a jax.sharding.Mesh or None; got str"):
        jaxmoe.moe(params, x, EP_CFG, mesh="ep")
    y, _ = jax.jit(jaxmoe.moe, static_argnames="cfg")(params, x, cfg=CFG)  # the fix works
    assert y.shape == x.shape


# --- Eager grad through the sharded layer -------------------------------------------------


def test_eager_grad_on_a_mesh_matches_one_device():
    params = jaxmoe.init_params(jax.random.key(0), CFG)
    x = jax.random.normal(jax.random.key(1), (8, 4, 16))
    mesh = _mesh()
    # The one-device reference jitted (one compile, not one per op); the mesh's gradients eager.
    want = jax.jit(jax.grad(_loss, (0, 1)), static_argnums=2)(params, x, CFG)
    got = jax.grad(_loss, (0, 1))(params, x, EP_CFG, mesh)  # eager: no jit, no set_mesh
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert np.linalg.norm(a - b) <= RTOL * np.linalg.norm(b)
    # Inside a mesh context (eagerly) and from inputs laid out on the mesh as well.
    with jax.set_mesh(mesh):
        got = jax.grad(_loss, (0, 1))(params, x, EP_CFG, mesh)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert np.linalg.norm(np.asarray(a) - b) <= RTOL * np.linalg.norm(b)
    laid_out = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.P(("fsdp", "ep"))))
    loss = _loss(params, laid_out, EP_CFG, mesh)
    np.testing.assert_allclose(loss, _loss(params, x, CFG), rtol=RTOL)
