"""The gated grouped matmul op: its reference against NumPy, and its primitive (the derivative
rule the fused kernel runs behind) against the unfused composition, in float32, to every order
and under jit, vmap and shard_map. The primitive runs the reference implementation here (float32;
the Mosaic kernel, bf16 only, has its own file); the layer gives the same result either way."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_test_base import Backend, OpTestBase, Tol, as64
from test_grouped_matmul import np_gmm, np_grads

import jaxmoe
from jaxmoe.ops.gated_grouped_matmul import (
    ReferenceGatedGroupedMatmul,
    api,
    gated_grouped_matmul,
    primitives,
)
from jaxmoe.ops.gated_grouped_matmul.pallas_mosaic import PallasMosaicGatedGroupedMatmul
from jaxmoe.ops.grouped_matmul import ReferenceGroupedMatmul

ROWS, K, F = 12, 5, 4
GROUP_SIZES = jnp.array([3, 0, 6], jnp.int32)  # an empty group; 3 rows past the groups
ACTIVATIONS = ["swiglu", "geglu"]
FUSED_REFERENCE = ReferenceGatedGroupedMatmul(grouped=ReferenceGroupedMatmul())


def _operands(dtype=jnp.float32, rows=ROWS, k=K, f=F, groups=3, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    lhs = jax.random.normal(keys[0], (rows, k))
    gate, up = (jax.random.normal(key, (groups, k, f)) / np.sqrt(k) for key in keys[1:])
    return lhs.astype(dtype), gate.astype(dtype), up.astype(dtype)


def _np_act(x, activation):
    if activation == "swiglu":
        return x / (1 + np.exp(-x))
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def fused(group_sizes=GROUP_SIZES, activation="swiglu", kernel=FUSED_REFERENCE):
    """The op through the primitive (what the fused kernel runs behind)."""
    return lambda x, wg, wu: gated_grouped_matmul(
        x, wg, wu, group_sizes, activation=activation, backend=kernel
    )


def composition(group_sizes=GROUP_SIZES, activation="swiglu"):
    """The unfused path: two grouped matmuls and the product, differentiated through them."""
    return lambda x, wg, wu: gated_grouped_matmul(
        x, wg, wu, group_sizes, activation=activation, backend="reference"
    )


def _close(got, want, rtol=1e-6):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) <= rtol * max(np.linalg.norm(want), 1e-30)


def np_act_slope(x, activation):
    """The activation's derivative, in closed form (float64)."""
    if activation == "swiglu":
        sig = 1 / (1 + np.exp(-x))
        return sig + x * sig * (1 - sig)
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c * (1 + 3 * 0.044715 * x**2)


def np_gated_grads(lhs, gate_w, up_w, group_sizes, cotangent, activation):
    """float64 d lhs, d gate_w, d up_w of act(lhs @ gate_w[g]) * (lhs @ up_w[g]); also the
    projections' cotangents (d gate, d up) for a caller that chains them."""
    gate, up = np_gmm(lhs, gate_w, group_sizes), np_gmm(lhs, up_w, group_sizes)
    cotangent = np.asarray(cotangent, np.float64)
    d_gate = cotangent * up * np_act_slope(gate, activation)
    d_up = cotangent * _np_act(gate, activation)
    d_lhs_g, d_gate_w = np_grads(lhs, gate_w, group_sizes, d_gate)
    d_lhs_u, d_up_w = np_grads(lhs, up_w, group_sizes, d_up)
    return d_lhs_g + d_lhs_u, d_gate_w, d_up_w


class GatedGroupedMatmulOp(OpTestBase):
    """The gated grouped matmul's hooks for ``OpTestBase``; a backend is ``(backend,
    activation)``. (Not collected itself: each file's ``Test`` subclass names its backends.)"""

    TOLERANCES = {
        "float32": Tol(1e-6, 1e-6, "frobenius"),
        # Each result's bf16 rounding; the gradients' two products and their sum round again.
        "bfloat16": Tol(1.6e-2, 3.2e-2),
    }

    def make_inputs(self, m, k, n, groups, dtype, seed):
        operands = _operands(jnp.dtype(dtype), rows=m, k=k, f=n, groups=groups, seed=seed)
        return operands, jax.random.normal(jax.random.key(7), (m, n)).astype(dtype)

    def call(self, backend, operands, group_sizes):
        kernel, activation = backend
        return gated_grouped_matmul(*operands, group_sizes, activation=activation, backend=kernel)

    def reference(self, operands, group_sizes):
        lhs, gate_w, up_w = operands
        gate, up = np_gmm(lhs, gate_w, group_sizes), np_gmm(lhs, up_w, group_sizes)
        return _np_act(gate, self.current_activation) * up

    def reference_grads(self, operands, group_sizes, cotangent):
        return np_gated_grads(*operands, group_sizes, as64(cotangent), self.current_activation)

    def check(self, spec, sizes, dtype, seed=0):
        self.current_activation = spec.impl[1]
        super().check(spec, sizes, dtype, seed)

    def group_sizes(self, case, m):
        if (case, m) == ("empty_and_tail", ROWS):
            return [3, 0, 6]  # an empty group; 3 rows past the groups
        return super().group_sizes(case, m)


class TestGatedGroupedMatmulBackends(GatedGroupedMatmulOp):
    """The unfused composition on each grouped-matmul backend, and the primitive (what the
    fused kernel runs behind) on the reference; the Mosaic kernel: its own file."""

    BACKENDS = {
        **{
            f"{name}-{act}": Backend((kernel, act), (ROWS, K, F), cases=cases)
            for name, kernel, cases in [
                ("reference", "reference", ("skewed", "single_group", "past_m", "no_rows")),
                ("fused_reference", FUSED_REFERENCE, ("skewed", "single_group", "past_m")),
            ]
            for act in ACTIVATIONS
        },
        "xla-swiglu": Backend(("xla", "swiglu"), (ROWS, K, F), cases=()),
        "pallas_triton-swiglu": Backend(("pallas_triton", "swiglu"), (ROWS, K, F), cases=()),
    }


def test_residuals_are_the_two_projections():
    lhs, gate_w, up_w = _operands()
    hidden, gate, up = primitives.gated_gmm(
        lhs, gate_w, up_w, GROUP_SIZES, kernel=FUSED_REFERENCE, activation="geglu", residuals=True
    )
    _close(gate, np_gmm(lhs, gate_w, GROUP_SIZES))
    _close(up, np_gmm(lhs, up_w, GROUP_SIZES))
    _close(hidden, composition(activation="geglu")(lhs, gate_w, up_w))


def test_grad_of_grad_and_forward_over_forward_equal_the_unfused_path():
    lhs, gate_w, up_w = _operands()

    def penalty(op):
        # d/d lhs of |d loss / d gate_w|^2: the backward pass differentiated again.
        loss = lambda x, wg: jnp.sum(jnp.sin(op(x, wg, up_w)))  # noqa: E731
        return jax.grad(lambda x: jnp.sum(jax.grad(loss, 1)(x, gate_w) ** 2))(lhs)

    _close(penalty(fused()), penalty(composition()))
    hessian = lambda op: jax.jacfwd(jax.jacfwd(lambda wu: op(lhs, gate_w, wu)))(up_w)  # noqa: E731
    _close(hessian(fused()), hessian(composition()))


def test_vmap_runs_the_composition_batched():
    lhs, gate_w, up_w = _operands()
    batch = jnp.stack([lhs, -lhs])
    sizes = jnp.array([[3, 0, 6], [12, 0, 0]], jnp.int32)
    kernel = PallasMosaicGatedGroupedMatmul(grouped=ReferenceGroupedMatmul())

    def op(x, group_sizes):
        return primitives.gated_gmm(
            x, gate_w, up_w, group_sizes, kernel=kernel, activation="swiglu", residuals=False
        )[0]

    got = jax.vmap(op)(batch, sizes)
    assert "mosaic" not in str(jax.make_jaxpr(jax.vmap(op))(batch, sizes))  # no kernel batched
    for i in range(2):
        _close(got[i], composition(sizes[i])(batch[i], gate_w, up_w))
    grads = jax.grad(lambda x: jnp.sum(jax.vmap(op)(x, sizes) ** 2))(batch)
    want = jax.grad(lambda x: jnp.sum(composition(sizes[0])(x, gate_w, up_w) ** 2))(batch[0])
    _close(grads[0], want)


def test_inside_shard_map_with_grads():
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    lhs, gate_w, up_w = _operands(rows=2 * ROWS)
    sizes = jnp.array([[3, 0, 6], [1, 10, 1]], jnp.int32)
    spec = jax.sharding.PartitionSpec

    def shard_loss(op):
        def body(x, wg, wu, gs):
            return jax.lax.psum(jnp.sum(op(gs[0])(x, wg, wu) ** 2), "data")

        sharded = jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(spec("data"), spec(), spec(), spec("data")),
            out_specs=spec(),
        )
        return jax.jit(jax.value_and_grad(sharded, argnums=(0, 1, 2)))

    got = shard_loss(fused)(lhs, gate_w, up_w, sizes)
    want = shard_loss(composition)(lhs, gate_w, up_w, sizes)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        _close(a, b)


def _ops_in(fn, *args) -> str:
    return str(jax.make_jaxpr(fn)(*args))


def test_auto_fuses_on_a_hopper_only_where_the_kernel_applies(monkeypatch):
    lhs, gate_w, up_w = _operands(jnp.bfloat16, rows=128, k=64, f=128)
    sizes = jnp.array([100, 0, 28], jnp.int32)
    op = lambda dtype, backend=None: (
        lambda x, wg, wu: gated_grouped_matmul(  # noqa: E731
            x.astype(dtype),
            wg.astype(dtype),
            wu.astype(dtype),
            sizes,
            activation="swiglu",
            backend=backend,
        )
    )
    assert "jaxmoe_gated" not in _ops_in(op(jnp.bfloat16), lhs, gate_w, up_w)  # a CPU: unfused
    monkeypatch.setattr(api, "default_backend_name", lambda platform=None: "pallas")  # a GPU
    assert "jaxmoe_gated" in _ops_in(op(jnp.bfloat16), lhs, gate_w, up_w)
    assert "jaxmoe_gated" not in _ops_in(op(jnp.float32), lhs, gate_w, up_w)  # fp32: unfused
    for named in ("xla", "pallas_triton", ReferenceGroupedMatmul()):  # a named backend stays
        assert "jaxmoe_gated" not in _ops_in(op(jnp.bfloat16, named), lhs, gate_w, up_w)
    monkeypatch.setattr(api, "AUTO_FUSED_MAX_K", 32)  # K = 64 is past it: unfused (measured)
    assert "jaxmoe_gated" not in _ops_in(op(jnp.bfloat16), lhs, gate_w, up_w)


def test_a_named_fused_backend_never_falls_back():
    lhs, gate_w, up_w = _operands()  # float32, and K, F not multiples of the blocks
    with pytest.raises(NotImplementedError, match="not bf16/fp16"):
        fused(kernel=PallasMosaicGatedGroupedMatmul())(lhs, gate_w, up_w)


@pytest.mark.parametrize(
    "change, argument",
    [({"activation": "relu"}, "activation"), ({"rhs_up": jnp.ones((3, K, F + 1))}, "rhs_up")],
)
def test_bad_arguments_raise_value_error(change, argument):
    lhs, gate_w, up_w = _operands()
    kwargs = {"rhs_up": up_w, "activation": "swiglu", **change}
    with pytest.raises(ValueError, match=argument):
        gated_grouped_matmul(
            lhs, gate_w, kwargs["rhs_up"], GROUP_SIZES, activation=kwargs["activation"]
        )


def test_layer_with_the_fused_primitive_equals_the_unfused_layer(monkeypatch):
    cfg = jaxmoe.MoEConfig(8, 2, 16, 32, aux_loss_coef=1e-2)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (2, 8, 16))

    def run(cfg):
        loss = lambda p, x: jnp.sum(jaxmoe.moe(p, x, cfg)[0] ** 2)  # noqa: E731
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)

    want = run(cfg)
    monkeypatch.setattr(api, "_fused_backend", lambda *args: FUSED_REFERENCE)
    fused_cfg = dataclasses.replace(cfg, grouped_matmul_backend="auto")  # a new jit cache key
    text = str(jax.make_jaxpr(functools.partial(jaxmoe.moe, cfg=fused_cfg))(params, x))
    assert "jaxmoe_gated" in text
    for a, b in zip(jax.tree.leaves(run(fused_cfg)), jax.tree.leaves(want), strict=True):
        _close(a, b)
