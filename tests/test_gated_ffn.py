"""The gated FFN op (gated grouped matmul, then the down projection, with the activation's
derivative fused into the down projection's dgrad): its primitives against the unfused
composition to every order and under jit, vmap and shard_map (float32, reference backend), and
the fused Mosaic backward (Mosaic GPU's interpreter, bf16) against a float64 NumPy reference."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_test_base import Backend, as64
from test_gated_grouped_matmul import (
    GatedGroupedMatmulOp,
    _close,
    _np_act,
    _operands,
    np_gated_grads,
)
from test_grouped_matmul import np_gmm, np_grads

from jaxmoe.ops.gated_grouped_matmul import (
    ReferenceGatedGroupedMatmul,
    api,
    base,
    ffn_primitives,
    gated_ffn,
    gated_grouped_matmul,
)
from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as fused_mosaic
from jaxmoe.ops.gated_grouped_matmul import primitives as gated_primitives
from jaxmoe.ops.gated_grouped_matmul.pallas_mosaic import PallasMosaicGatedGroupedMatmul
from jaxmoe.ops.grouped_matmul import ReferenceGroupedMatmul, grouped_matmul
from jaxmoe.ops.mosaic import tiles as mosaic_tiles

ROWS, K, F, H_OUT = 12, 5, 4, 6
GROUP_SIZES = jnp.array([3, 0, 6], jnp.int32)  # an empty group; 3 rows past the groups
REFERENCE = ReferenceGatedGroupedMatmul(grouped=ReferenceGroupedMatmul())
# The projections' input gradient as one linear primitive (evaluated by the reference backend's
# input_dgrad: the two transposed products and their sum).
REFERENCE_INPUT_DGRAD = ReferenceGatedGroupedMatmul(
    grouped=ReferenceGroupedMatmul(), fused_input_dgrad=True
)
KERNELS = pytest.mark.parametrize(
    "kernel", [REFERENCE, REFERENCE_INPUT_DGRAD], ids=["reference", "input_dgrad"]
)


def _ffn_operands(dtype=jnp.float32, rows=ROWS, k=K, f=F, h_out=H_OUT, seed=0):
    lhs, gate_w, up_w = _operands(dtype, rows=rows, k=k, f=f, seed=seed)
    down_w = jax.random.normal(jax.random.key(seed + 1), (3, f, h_out)) / np.sqrt(f)
    return lhs, gate_w, up_w, down_w.astype(dtype)


def fused(group_sizes=GROUP_SIZES, activation="swiglu", kernel=REFERENCE):
    return lambda x, wg, wu, wd: gated_ffn(
        x, wg, wu, wd, group_sizes, activation=activation, backend=kernel
    )


def composition(group_sizes=GROUP_SIZES, activation="swiglu"):
    def op(x, wg, wu, wd):
        hidden = gated_grouped_matmul(
            x, wg, wu, group_sizes, activation=activation, backend="reference"
        )
        return grouped_matmul(hidden, wd, group_sizes, backend="reference")

    return op


def _loss(op):
    return lambda *args: jnp.sum(jnp.sin(op(*args)))


def _all_close(got, want, rtol=1e-6):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        _close(a, b, rtol)


class TestGatedFfnBackends(GatedGroupedMatmulOp):
    """The FFN through its primitives on the reference backend (the backward's glu dgrad, and
    with the input gradient as one primitive) against float64 NumPy; a backend is ``(backend,
    activation)``, the shape ``(rows, k, h_out)`` with F hidden columns. The fused Mosaic
    backward: test_gradients_through_the_fused_backward_kernels_against_numpy."""

    BACKENDS = {
        f"{name}-{act}": Backend((kernel, act), (ROWS, K, H_OUT), cases=cases)
        for name, kernel, cases in [
            ("reference", REFERENCE, ("skewed", "single_group")),
            ("input_dgrad", REFERENCE_INPUT_DGRAD, ()),
        ]
        for act in ("swiglu", "geglu")
    }

    def group_sizes(self, case, m):
        edges = {"skewed": [1, m - 2, 1], "single_group": [0, m, 0]}  # three groups
        return edges.get(case) or super().group_sizes(case, m)

    def make_inputs(self, m, k, n, groups, dtype, seed):
        operands = _ffn_operands(jnp.dtype(dtype), rows=m, k=k, f=F, h_out=n, seed=seed)
        return operands, jax.random.normal(jax.random.key(7), (m, n)).astype(dtype)

    def call(self, backend, operands, group_sizes):
        kernel, activation = backend
        return gated_ffn(*operands, group_sizes, activation=activation, backend=kernel)

    def reference(self, operands, group_sizes):
        lhs, gate_w, up_w, down_w = operands
        hidden = super().reference((lhs, gate_w, up_w), group_sizes)
        return np_gmm(hidden, down_w, group_sizes)

    def reference_grads(self, operands, group_sizes, cotangent):
        lhs, gate_w, up_w, down_w = operands
        hidden = super().reference((lhs, gate_w, up_w), group_sizes)
        d_hidden, d_down = np_grads(hidden, down_w, group_sizes, as64(cotangent))
        act = self.current_activation
        return (*np_gated_grads(lhs, gate_w, up_w, group_sizes, d_hidden, act), d_down)


def test_the_backward_transposes_into_one_glu_dgrad():
    operands = _ffn_operands()
    text = str(jax.make_jaxpr(jax.grad(_loss(fused()), argnums=(0, 1, 2, 3)))(*operands))
    assert text.count("jaxmoe_glu_dgrad") == 1
    # Only the weight gradient of the down projection needs h: no dgrad of it is left.
    assert "jaxmoe_glu_down" not in text
    assert "jaxmoe_gated_input" not in text  # off by default


def test_the_input_gradient_transposes_into_one_input_dgrad():
    operands = _ffn_operands()
    grad = jax.grad(_loss(fused(kernel=REFERENCE_INPUT_DGRAD)), argnums=(0, 1, 2, 3))
    text = str(jax.make_jaxpr(grad)(*operands))
    assert text.count("jaxmoe_gated_input_dgrad") == 1
    assert "jaxmoe_gated_input_tangent" not in text  # transposed away
    # No grouped matmul of a cotangent with transposed gate or up weights is left: the two
    # products the default backward runs are the one input_dgrad.
    default = str(jax.make_jaxpr(jax.grad(_loss(fused()), argnums=(0, 1, 2, 3)))(*operands))
    assert default.count("transpose_rhs=True") == 2 and text.count("transpose_rhs=True") == 0
    # Without the lhs in the gradient, nothing of it is computed.
    text = str(jax.make_jaxpr(jax.grad(_loss(fused(kernel=REFERENCE_INPUT_DGRAD)), 1))(*operands))
    assert "jaxmoe_gated_input" not in text


def test_input_dgrad_batches_under_vmap_of_grad():
    # grad inside vmap: the JVP rule binds the input primitives under the batch trace, so their
    # own batching rules (the unfused forms, vmapped) run.
    lhs, gate_w, up_w, down_w = _ffn_operands(rows=2 * ROWS)
    sizes = jnp.array([[3, 0, 6], [1, 10, 1]], jnp.int32)
    batch = lhs.reshape(2, ROWS, K)

    def per_example(op):
        def grad_x(x, gs):
            return jax.grad(lambda x: jnp.sum(jnp.sin(op(gs)(x, gate_w, up_w, down_w))))(x)

        return jax.vmap(grad_x)(batch, sizes)

    fused_input = functools.partial(fused, kernel=REFERENCE_INPUT_DGRAD)
    text = str(jax.make_jaxpr(lambda b: per_example(fused_input))(batch))
    assert "jaxmoe_gated_input" not in text  # batched: the unfused forms
    # Jitted: the same batching rules, without eager op-by-op dispatch.
    _all_close(*(jax.jit(per_example, static_argnums=0)(op) for op in (fused_input, composition)))


def test_input_dgrad_runs_the_backend_kernel_where_it_applies(monkeypatch):
    operands = _ffn_operands()
    calls = []
    real = ReferenceGatedGroupedMatmul.input_dgrad

    def recording(self, *args):
        calls.append(args[0].shape)
        return real(self, *args)

    monkeypatch.setattr(ReferenceGatedGroupedMatmul, "input_dgrad", recording)
    jax.grad(_loss(fused(kernel=REFERENCE_INPUT_DGRAD)))(*operands)
    assert calls == [(ROWS, F)]
    calls.clear()
    jax.grad(_loss(fused(kernel=REFERENCE)))(*operands)  # off: the two products
    assert calls == []


@KERNELS
def test_every_order_equals_the_composition(kernel):
    operands = _ffn_operands()
    tangents = tuple(jax.random.normal(jax.random.key(9), a.shape) for a in operands)
    ops = (fused(kernel=kernel), composition())
    _all_close(*(jax.jvp(op, operands, tangents)[1] for op in ops), rtol=1e-5)
    grads = [jax.grad(_loss(op), argnums=(0, 1, 2, 3)) for op in ops]
    # Forward over reverse (Hessian-vector products in every operand).
    _all_close(*(jax.jvp(grad, operands, tangents)[1] for grad in grads), rtol=1e-5)

    def penalty(op):  # reverse over reverse: |d loss / d lhs|^2, differentiated again
        inner = jax.grad(_loss(op))
        return jax.grad(lambda *a: jnp.sum(inner(*a) ** 2), argnums=(0, 3))(*operands)

    _all_close(*(penalty(op) for op in ops), rtol=1e-5)


@KERNELS
def test_vmap_and_shard_map(kernel):
    lhs, gate_w, up_w, down_w = _ffn_operands(rows=2 * ROWS)
    fused_ = functools.partial(fused, kernel=kernel)
    sizes = jnp.array([[3, 0, 6], [1, 10, 1]], jnp.int32)
    batch = lhs.reshape(2, ROWS, K)

    def batched(op):
        loss = lambda x: jnp.sum(  # noqa: E731
            jax.vmap(lambda xb, gs: op(gs)(xb, gate_w, up_w, down_w))(x, sizes) ** 2
        )
        return jax.value_and_grad(loss)(batch)

    _all_close(batched(fused_), batched(composition))

    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = jax.sharding.PartitionSpec

    def sharded(op):
        def body(x, wg, wu, wd, gs):
            return jax.lax.psum(jnp.sum(op(gs[0])(x, wg, wu, wd) ** 2), "data")

        in_specs = (spec("data"), spec(), spec(), spec(), spec("data"))
        loss = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=spec())
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(
            lhs, gate_w, up_w, down_w, sizes
        )

    _all_close(sharded(fused_), sharded(composition))


def test_auto_and_named_backends(monkeypatch):
    operands = _ffn_operands(jnp.bfloat16, rows=128, k=64, f=256, h_out=64)
    sizes = jnp.array([100, 0, 28], jnp.int32)

    def ops(backend=None, dtype=jnp.bfloat16):
        op = lambda *a: gated_ffn(  # noqa: E731
            *(x.astype(dtype) for x in a), sizes, activation="swiglu", backend=backend
        )
        return str(jax.make_jaxpr(op)(*operands))

    assert "jaxmoe_gated_ffn" not in ops()  # a CPU: the unfused composition
    monkeypatch.setattr(api, "default_backend_name", lambda platform=None: "pallas")  # a GPU
    assert "jaxmoe_gated_ffn" in ops()
    assert "jaxmoe_gated_ffn" not in ops(dtype=jnp.float32)  # the kernels take no fp32
    for named in ("xla", "pallas_triton", ReferenceGroupedMatmul()):  # a named backend stays
        assert "jaxmoe_gated_ffn" not in ops(named)
    monkeypatch.setattr(api, "AUTO_FUSED_MAX_K", 32)  # K past the fused forward's limit
    assert "jaxmoe_gated_ffn" not in ops()


@pytest.mark.parametrize(
    "rhs_down, match",
    [
        (jnp.ones((3, F + 1, H_OUT)), r"rhs_down.*\[G, F, H\]"),
        (jnp.ones((3, F, H_OUT), jnp.int32), "rhs_down"),
    ],
)
def test_bad_down_weights_raise_value_error(rhs_down, match):
    lhs, gate_w, up_w, _ = _ffn_operands()
    with pytest.raises(ValueError, match=match):
        gated_ffn(lhs, gate_w, up_w, rhs_down, GROUP_SIZES, activation="swiglu")


# --- the fused Mosaic backward (Mosaic GPU's interpreter) ---------------------------------------

M, H, FF = 256, 64, 256
# An empty group, a group cut inside a 128-row tile, a tile of three groups, 36 rows past them.
MOSAIC_SIZES = np.array([100, 0, 7, 113], np.int32)


def _np_down_dgrad(out_bar, gate, up, down_w, sizes, activation):
    as64 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)  # noqa: E731
    out_bar, gate, up, down_w = map(as64, (out_bar, gate, up, down_w))
    hidden_bar = np.zeros(gate.shape)
    start = 0
    for group, size in enumerate(sizes):
        hidden_bar[start : start + size] = out_bar[start : start + size] @ down_w[group].T
        start += size
    eps = 1e-6  # act' by a central difference in float64 (exact to ~1e-10 here)
    slope = (_np_act(gate + eps, activation) - _np_act(gate - eps, activation)) / (2 * eps)
    return hidden_bar * up * slope, hidden_bar * _np_act(gate, activation)


def _rel_err(got, want):
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("approx", [False, True], ids=["exact", "approx"])
@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_in_kernel_activation_and_slope_are_the_activation_and_its_derivative(activation, approx):
    # Against float64 (the slope by a central difference, exact to ~1e-10 here). approx: the
    # forms the kernels take under approx_math (sigmoid from exp2 and rsqrt; geglu as x
    # sigmoid(2y)). On a CPU exp2 and rsqrt are exact, so this checks their algebra; the GPU's
    # approximate instructions were measured within 2e-5 of the exact forms on an H100.
    # The exact geglu slope, (1 + tanh(y)) / 2 + ..., cancels where tanh(y) -> -1 (x ~ -5: 3e-6
    # off, as jax.grad of jax.nn.gelu; 5e-6 under XLA's older CPU emitters, `tests/xla_cpu.py`);
    # the sigmoid form does not.
    x = np.concatenate([np.linspace(-6.0, 6.0, 241), [-200.0, 200.0]]).astype(np.float32)
    x64, eps = x.astype(np.float64), 1e-6
    want_value = _np_act(x64, activation)
    want_slope = (_np_act(x64 + eps, activation) - _np_act(x64 - eps, activation)) / (2 * eps)
    value, slope = fused_mosaic._KERNEL_ACTIVATION_SLOPES[activation](jnp.asarray(x), approx)
    np.testing.assert_allclose(value, want_value, rtol=1e-6, atol=1e-6)
    slope_atol = 6e-6 if activation == "geglu" and not approx else 1e-6
    np.testing.assert_allclose(slope, want_slope, rtol=1e-5, atol=slope_atol)
    np.testing.assert_allclose(
        fused_mosaic._KERNEL_ACTIVATIONS[activation](jnp.asarray(x), approx), value, rtol=1e-6
    )
    if not approx:  # the exact forms are jax's own activation and derivative, as before
        act = base.GATE_ACTIVATIONS[activation]
        np.testing.assert_allclose(value, act(jnp.asarray(x)), rtol=1e-6, atol=1e-6)
        grad = jax.vmap(jax.grad(act))(jnp.asarray(x))
        np.testing.assert_allclose(slope, grad, rtol=1e-5, atol=1e-6)


def _recording(monkeypatch, method):
    """Records each call of the Mosaic backend's ``method``: its operands and results (NumPy)."""
    calls = []
    real = getattr(PallasMosaicGatedGroupedMatmul, method)

    def recording(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        calls.append(jax.tree.map(np.asarray, (args, out)))
        return out

    monkeypatch.setattr(PallasMosaicGatedGroupedMatmul, method, recording)
    return calls


def _mosaic_ffn_gradients(kernel, k, f, h=H):
    """d sum(sin(ffn)) in every operand through ``kernel`` (bf16, eager: so the recorded kernel
    calls see arrays) and through the float32 composition, on MOSAIC_SIZES."""
    groups = len(MOSAIC_SIZES)
    lhs, gate_w, up_w = _operands(jnp.bfloat16, rows=M, k=k, f=f, groups=groups)
    down_w = jax.random.normal(jax.random.key(1), (groups, f, h)) / np.sqrt(f)
    operands = (lhs, gate_w, up_w, down_w.astype(jnp.bfloat16))
    sizes = jnp.asarray(MOSAIC_SIZES)
    f32 = tuple(a.astype(jnp.float32) for a in operands)
    got = jax.grad(_loss(fused(sizes, kernel=kernel)), argnums=(0, 1, 2, 3))(*operands)
    want = jax.jit(jax.grad(_loss(composition(sizes)), argnums=(0, 1, 2, 3)))(*f32)
    for a, b in zip(got, want, strict=True):  # bf16 against the float32 composition
        _close(a, b, rtol=2e-2)
    assert np.all(np.asarray(got[0][MOSAIC_SIZES.sum() :]) == 0)  # rows past the groups
    return operands


def _check_down_dgrad(call, down_w):
    """The fused down dgrad's recorded operands and results against float64 NumPy."""
    (out_bar, gate, up, rhs_down, sizes), got = call
    assert gate.shape == (M, FF) and np.array_equal(sizes, MOSAIC_SIZES)
    want = _np_down_dgrad(out_bar, gate, up, rhs_down, MOSAIC_SIZES, "swiglu")
    unfused = ffn_primitives.unfused_glu_dgrad(
        *map(jnp.asarray, (out_bar, gate, up, rhs_down, sizes)),
        kernel=REFERENCE,
        activation="swiglu",
    )
    for got_bar, unfused_bar, want_bar in zip(got, unfused, want, strict=True):
        # One rounding (float32 h_bar and derivative) against the unfused path's several.
        assert _rel_err(got_bar, want_bar) < 4e-3
        assert _rel_err(got_bar, want_bar) <= _rel_err(unfused_bar, want_bar)
        assert np.all(np.asarray(got_bar[MOSAIC_SIZES.sum() :]) == 0)  # rows past the groups
    assert PallasMosaicGatedGroupedMatmul(interpret=True).fused_backward  # the default
    kernel_off = PallasMosaicGatedGroupedMatmul(fused_backward=False, interpret=True)
    reason = kernel_off.down_dgrad_unsupported_reason(jnp.asarray(out_bar), down_w, sizes)
    assert reason == "fused_backward=False"


def _check_input_dgrad(call, k):
    """The fused input dgrad's recorded operands and result against float64 NumPy."""
    (gate_bar, up_bar, gate_w, up_w, sizes), got = call
    assert gate_w.shape == (len(MOSAIC_SIZES), k, FF)
    assert np.array_equal(sizes, MOSAIC_SIZES)
    as64 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)  # noqa: E731
    want = np.zeros((M, k))
    start = 0
    for group, size in enumerate(MOSAIC_SIZES):
        rows = slice(start, start + size)
        want[rows] = as64(gate_bar)[rows] @ as64(gate_w)[group].T
        want[rows] += as64(up_bar)[rows] @ as64(up_w)[group].T
        start += size
    unfused = gated_primitives.unfused_input_dgrad(
        *map(jnp.asarray, (gate_bar, up_bar, gate_w, up_w, sizes)), kernel=REFERENCE
    )
    # One rounding of the float32 sum against the unfused path's three (each product, the sum).
    assert _rel_err(got, want) < 4e-3
    assert _rel_err(got, want) <= _rel_err(unfused, want)
    assert np.all(np.asarray(got[MOSAIC_SIZES.sum() :]) == 0)  # rows past the groups
    assert PallasMosaicGatedGroupedMatmul(interpret=True).fused_input_dgrad  # the default
    off = PallasMosaicGatedGroupedMatmul(fused_input_dgrad=False, interpret=True)
    gate_bar, gate_w = jnp.asarray(gate_bar), jnp.asarray(gate_w)
    assert off.input_dgrad_unsupported_reason(gate_bar, gate_w, sizes) == "fused_input_dgrad=False"


# The Mosaic gmm's default tiles (128 x 256 x 64): the input gradient's N (the hidden size K) is a
# multiple of 256, its contraction (F) of 64; the down dgrad's N (F) too, its contraction (H).
INPUT_K, INPUT_F = 256, 128


# One gradient through both fused backward kernels (the down dgrad with the activation's
# derivative, and the input dgrad): with the fused forward, the test's three interpreter calls
# (several seconds each; the two kernels had a test, and a forward, each). Each kernel's one
# call is the one inside the gradient: its operands and results, recorded, are checked against
# a float64 NumPy reference. SwiGLU through the kernels; each in-kernel (act, act') pair against
# jax's derivative of the activation above.
# The down dgrad's epilogue operands ride the ring (jaxmoe.ops.mosaic.ring_operands): at
# H = 128 (two K steps) its default tiles give each CTA 2 units (3 items, one pair and the odd
# last one) of 2 K steps and 4 epilogue steps each, so the tiles' epilogue steps wrap the 4-slot
# ring at every phase; the pair of CTAs multicasting the weights (the default on large experts)
# shares the ring's releases. Rows past the groups and tiles cut by group boundaries take zeros
# and row runs. (This was its own test, on the exact activation's forms: the kernel passes
# approx_math to the (act, act') pair, both of whose forms are checked above.)
DGRAD_H = 128


def test_gradients_through_the_fused_backward_kernels_against_numpy(monkeypatch):
    down_tiles = dataclasses.replace(
        fused_mosaic.default_down_dgrad_tiles(M, DGRAD_H, FF), multicast_weights=True
    )
    kernel = PallasMosaicGatedGroupedMatmul(
        grouped=ReferenceGroupedMatmul(),
        fused_backward=True,
        down_dgrad_tiles=down_tiles,
        fused_input_dgrad=True,
        interpret=True,
    )
    down_calls = _recording(monkeypatch, "down_dgrad")
    input_calls = _recording(monkeypatch, "input_dgrad")
    _, _, _, down_w = _mosaic_ffn_gradients(kernel, k=INPUT_K, f=FF, h=DGRAD_H)
    # The kernels ran: no silent fallback to the unfused dgrad or the two products.
    assert len(down_calls) == 1 and len(input_calls) == 1
    _check_down_dgrad(down_calls[0], down_w)
    _check_input_dgrad(input_calls[0], INPUT_K)


def test_fused_down_dgrad_names_the_tiles_its_ring_cannot_carry():
    # The epilogue operands ride split-rows ring tiles whose slots hold a [64, 128] part; other
    # tiles are refused before anything is traced, so the backend takes the unfused dgrad.
    default = mosaic_tiles.default_mosaic_gmm_tiles(M, H, FF)
    split_columns = dataclasses.replace(default, split_rows=False)
    short_k = dataclasses.replace(default, block_n=64, block_k=32)
    shapes = dict(out_bar_shape=(M, H), rhs_down_shape=(4, FF, H), dtype=jnp.bfloat16)
    assert fused_mosaic.down_dgrad_unsupported_reason(**shapes, cfg=default, interpret=True) is None
    reason = fused_mosaic.down_dgrad_unsupported_reason(**shapes, cfg=split_columns, interpret=True)
    assert "split_rows tiles only" in reason
    reason = fused_mosaic.down_dgrad_unsupported_reason(**shapes, cfg=short_k, interpret=True)
    assert "does not fit the ring's weight slot" in reason
    kernel = PallasMosaicGatedGroupedMatmul(
        fused_backward=True, down_dgrad_tiles=split_columns, interpret=True
    )
    out_bar, gate = jnp.zeros((M, H), jnp.bfloat16), jnp.zeros((M, FF), jnp.bfloat16)
    down_w = jnp.zeros((4, FF, H), jnp.bfloat16)
    assert "split_rows" in kernel.down_dgrad_unsupported_reason(out_bar, down_w, MOSAIC_SIZES)
    with pytest.raises(NotImplementedError, match="split_rows tiles only"):
        fused_mosaic.fused_down_dgrad(
            out_bar,
            gate,
            gate,
            down_w,
            jnp.asarray(MOSAIC_SIZES),
            activation="swiglu",
            tiles=split_columns,
        )


def test_fused_down_dgrad_lowers_for_cuda():
    # The GPU path reads the down weights transposed (which the interpreter cannot run); its
    # default tiles put the activation's derivative on approximate instructions (approx_math:
    # PTX's ex2.approx and rsqrt.approx in the kernel).
    assert fused_mosaic.default_down_dgrad_tiles(M, H, FF).approx_math
    fn = jax.jit(
        functools.partial(fused_mosaic.fused_down_dgrad, activation="swiglu", interpret=False)
    )
    shapes = [(M, H), (M, FF), (M, FF), (4, FF, H), (4,)]
    dtypes = [jnp.bfloat16] * 4 + [jnp.int32]
    args = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes, strict=True)]
    text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text and "ex2.approx" in text and "rsqrt.approx" in text


def test_fused_input_dgrad_lowers_for_cuda():
    kernel = PallasMosaicGatedGroupedMatmul(fused_input_dgrad=True, interpret=False)
    shapes = [(M, INPUT_F), (M, INPUT_F), (4, INPUT_K, INPUT_F), (4, INPUT_K, INPUT_F), (4,)]
    dtypes = [jnp.bfloat16] * 4 + [jnp.int32]
    args = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes, strict=True)]
    fn = jax.jit(kernel.input_dgrad)
    assert "mosaic_gpu" in fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
