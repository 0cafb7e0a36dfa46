"""FP8 quantization and the FP8 grouped matmul (``jaxmoe.ops.fp8``), forward and VJP, on CPU.

Bounds asserted, and why:

* Quantize: ``|x - dequantize(quantize(x))| <= 2**-m * |x| + 2**-s * scale`` per element, with
  ``m`` = mantissa bits + 1 (e4m3: 4, half an ulp of a normal number) and ``2**-s`` half the
  smallest subnormal (e4m3: 2**-10; e5m2: 2**-17), plus float32 slack of 2**-20 relative.
* FP8 product vs float64 product of the dequantized operands: relative Frobenius <= 1e-6 (the
  only difference is float32 accumulation and the float32 scale multiplies).
* FP8 product vs the unquantized product: relative Frobenius < 6% (each operand is within
  2**-4 relative per element, RMS about 2.5%; two operands give about 3.7% on Gaussian data,
  which is also what torch's ``_scaled_grouped_mm`` measured), and > 0.5% (it did quantize).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_test_base import Backend, OpTestBase, Tol

from jaxmoe.bench.harness import relative_error
from jaxmoe.ops.fp8 import (
    E4M3,
    E5M2,
    SCALE_EPS,
    Fp8Recipe,
    XlaScaledGroupedMatmul,
    dequantize,
    fp8_grouped_matmul,
    quantize,
    scaled_grouped_matmul,
)
from jaxmoe.ops.grouped_matmul import grouped_matmul

BACKENDS = ("reference", "xla")
# Small blocks so that small test shapes have several K and N blocks (and partial ones).
RECIPES = {
    "rowwise": Fp8Recipe("rowwise"),
    "blockwise16": Fp8Recipe("blockwise", block_size=16),
    "blockwise128": Fp8Recipe("blockwise"),
    "rowwise_e5m2_grad": Fp8Recipe("rowwise", grad_dtype=E5M2),
}
# dtype -> (relative half-ulp of a normal number, half the smallest subnormal, both scaled).
ROUNDING = {E4M3: (2.0**-4, 2.0**-10), E5M2: (2.0**-3, 2.0**-17)}
# 6 drawn examples (each eager, ~0.1-0.3 s); the group sizes' edges: TestFp8Backends.
PROPERTY = settings(max_examples=6, deadline=None)


def _grouped64(lhs, rhs, group_sizes) -> np.ndarray:
    """float64 NumPy: row block g of lhs times rhs[g]; rows past the groups are zeros."""
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for g, size in enumerate(np.asarray(group_sizes)):
        size = min(int(size), lhs.shape[0] - start)
        out[start : start + size] = lhs[start : start + size] @ rhs[g]
        start += size
    return out


def _operands(seed, m=48, k=40, n=24, groups=4, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    lhs = rng.standard_normal((m, k)) * np.exp(rng.uniform(-3, 3, (m, 1)))  # rows of any scale
    rhs = rng.standard_normal((groups, k, n)) / np.sqrt(k)
    return jnp.asarray(lhs, dtype), jnp.asarray(rhs, dtype)


group_sizes_strategy = st.lists(st.integers(0, 60), min_size=4, max_size=4)


# ----------------------------------------------------------------------------- quantize

BLOCKS = {
    "act_rowwise": ((37, 300), (1, None)),
    "act_blockwise": ((37, 300), (1, 128)),
    "w_rowwise": ((3, 300, 20), (1, None, 1)),
    "w_blockwise": ((3, 300, 140), (1, 128, 128)),
}


@pytest.mark.parametrize("case", sorted(BLOCKS))
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=str)
def test_exactly_representable_values_survive_the_round_trip(case, dtype):
    shape, block_shape = BLOCKS[case]
    rng = np.random.default_rng(0)
    # FP8 values times a power of two, with each block's amax at the format's max: exact.
    q = rng.standard_normal(shape).astype(np.float32) * 50
    q = np.array(jnp.asarray(q).astype(dtype).astype(jnp.float32))
    fmax = float(jnp.finfo(dtype).max)
    corners = tuple(slice(None, None, b or d) for b, d in zip(block_shape, shape, strict=True))
    q[corners] = fmax  # one element of every block is the max
    x = jnp.asarray(q) * 2.0**-7
    q_out, scale = quantize(x, block_shape, dtype)
    np.testing.assert_array_equal(np.asarray(scale), 2.0**-7)
    np.testing.assert_array_equal(np.asarray(q_out.astype(jnp.float32)), q)
    np.testing.assert_array_equal(np.asarray(dequantize(q_out, scale, block_shape)), x)


@pytest.mark.parametrize("case", sorted(BLOCKS))
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=str)
def test_round_trip_error_is_within_half_an_ulp_times_the_scale(case, dtype):
    shape, block_shape = BLOCKS[case]
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-8, 8, shape))  # wide dynamic range
    x = jnp.asarray(x, jnp.float32)
    q, scale = quantize(x, block_shape, dtype)
    assert q.dtype == dtype and scale.dtype == jnp.float32
    back = dequantize(q, scale, block_shape)
    half_ulp, half_subnormal = ROUNDING[dtype]
    full_scale = np.asarray(scale)
    for axis, block in enumerate(block_shape):
        full_scale = np.repeat(full_scale, block or shape[axis], axis=axis)
    full_scale = full_scale[tuple(slice(0, d) for d in shape)]
    error = np.abs(np.asarray(back, np.float64) - np.asarray(x, np.float64))
    bound = (half_ulp + 2.0**-20) * np.abs(np.asarray(x)) + half_subnormal * full_scale
    assert np.all(error <= bound)
    # The bound is not vacuous: normal values do lose up to about half an ulp.
    normal = np.abs(np.asarray(x)) > full_scale * float(jnp.finfo(dtype).smallest_normal)
    assert np.max(error[normal] / np.abs(np.asarray(x))[normal]) > half_ulp / 2


def test_scales_come_from_the_amax_and_saturate_at_448():
    x = jnp.array([[1.0, -3.0, 2.0], [0.0, 0.0, 0.0], [1e-30, 5e30, -1.0]], jnp.float32)
    q, scale = quantize(x, (1, None))
    np.testing.assert_allclose(np.asarray(scale[:, 0]), [3 / 448, SCALE_EPS / 448, 5e30 / 448])
    assert np.all(np.isfinite(np.asarray(scale))) and np.all(np.asarray(scale) > 0)
    assert float(q[0, 1]) == -448.0 and float(q[2, 1]) == 448.0  # the amax maps to the max
    np.testing.assert_array_equal(np.asarray(dequantize(q, scale, (1, None))[1]), 0.0)
    # x / scale may round above 448 in float32: clipped, never NaN (e4m3fn has no infinity).
    big = jnp.full((1, 4), np.float32(np.nextafter(np.float32(3e38), np.float32(np.inf))))
    assert np.all(np.asarray(quantize(big, (1, None))[0].astype(jnp.float32)) == 448.0)


def test_empty_and_zero_size_tensors_quantize():
    q, scale = quantize(jnp.zeros((0, 8)), (1, 4))
    assert q.shape == (0, 8) and scale.shape == (0, 2)
    assert dequantize(q, scale, (1, 4)).shape == (0, 8)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: quantize(jnp.ones((2, 3)), (1, None), jnp.bfloat16), "`dtype`"),
        (lambda: quantize(jnp.ones((2, 3)), (1,)), "`block_shape` needs one entry per dim"),
        (lambda: quantize(jnp.ones((2, 3)), (1, 0)), "None or an int >= 1"),
        (lambda: quantize(jnp.ones((2, 3)), (1, True)), "None or an int >= 1"),
        (lambda: dequantize(jnp.ones((2, 3), E4M3), jnp.ones((2, 2)), (1, None)), "`scale`"),
    ],
)
def test_quantize_rejects_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- forward


def dequantized_operands(lhs, rhs, recipe):
    """``(lhs_q, lhs_scale, rhs_q, rhs_scale)``, dequantized lhs, dequantized rhs."""
    lhs_q, lhs_scale = quantize(lhs, recipe.lhs_blocks, recipe.dtype)
    rhs_q, rhs_scale = quantize(rhs, recipe.rhs_blocks, recipe.dtype)
    return (
        (lhs_q, lhs_scale, rhs_q, rhs_scale),
        dequantize(lhs_q, lhs_scale, recipe.lhs_blocks),
        dequantize(rhs_q, rhs_scale, recipe.rhs_blocks),
    )


def fp8_reference_grads(lhs, rhs, cotangent, group_sizes, recipe):
    """float64 ``(d lhs, d rhs)`` of the FP8 product: dgrad, the FP8 cotangent (quantized like
    an activation along N) times the weight quantized for a contraction over N; wgrad, the
    dequantized FP8 activations times the exact cotangent."""
    grad_q, grad_scale = quantize(cotangent, recipe.lhs_blocks, recipe.grad_dtype)
    rhs_t_q, rhs_t_scale = quantize(jnp.swapaxes(rhs, 1, 2), recipe.rhs_blocks, recipe.dtype)
    d_lhs = _grouped64(
        dequantize(grad_q, grad_scale, recipe.lhs_blocks),
        dequantize(rhs_t_q, rhs_t_scale, recipe.rhs_blocks),
        group_sizes,
    )
    _, lhs_deq, _ = dequantized_operands(lhs, rhs, recipe)
    lhs_deq = np.asarray(lhs_deq, np.float64)
    ct = np.asarray(jnp.asarray(cotangent, jnp.float32), np.float64)
    d_rhs = np.zeros(rhs.shape)
    start = 0
    for g, size in enumerate(group_sizes):
        size = min(size, lhs.shape[0] - start)
        d_rhs[g] = lhs_deq[start : start + size].T @ ct[start : start + size]
        start += size
    return d_lhs, d_rhs


class Fp8Op(OpTestBase):
    """The FP8 grouped matmul's hooks for ``OpTestBase``: a backend is ``(backend, recipe)``;
    the reference is the float64 product of the dequantized operands (and of the dequantized
    FP8 cotangent and weights for d lhs; the dequantized activations and the exact cotangent
    for d rhs). (Not collected itself: each file's ``Test`` subclass names its backends.)"""

    TOLERANCES = {"float32": Tol(1e-6, 1e-6, "frobenius")}

    def make_inputs(self, m, k, n, groups, dtype, seed):
        lhs, rhs = _operands(seed, m=m, k=k, n=n, groups=groups, dtype=jnp.dtype(dtype))
        cotangent = np.random.default_rng(seed + 1).standard_normal((m, n))
        return (lhs, rhs), jnp.asarray(cotangent, dtype)

    def call(self, backend, operands, group_sizes):
        kernel, recipe = backend
        return fp8_grouped_matmul(*operands, group_sizes, recipe=recipe, backend=kernel)

    def check(self, spec, sizes, dtype, seed=0):
        self.recipe = spec.impl[1]
        super().check(spec, sizes, dtype, seed)

    def reference(self, operands, group_sizes):
        _, lhs_deq, rhs_deq = dequantized_operands(*operands, self.recipe)
        return _grouped64(lhs_deq, rhs_deq, group_sizes)

    def reference_grads(self, operands, group_sizes, cotangent):
        return fp8_reference_grads(*operands, cotangent, group_sizes, self.recipe)


class TestFp8Backends(Fp8Op):
    """reference and xla, each recipe (small blocks: several K and N blocks, partial ones), on
    the group sizes' edges at M = 48 (drawn sizes: the two property tests below)."""

    BACKENDS = {
        f"{backend}-{name}": Backend((backend, recipe), (48, 40, 24), cases=("past_m", "no_rows"))
        for backend in BACKENDS
        for name, recipe in sorted(RECIPES.items())
        if backend == "xla" or name == "rowwise"  # the reference's other recipes: drawn sizes
    }

    def group_sizes(self, case, m):
        # One-row groups and an empty one, short of M; empty groups first and in the middle
        # with sizes past M (clipped); every group empty.
        edges = {"empty_and_tail": [1, 1, 0, 3], "past_m": [0, 30, 0, 25], "no_rows": [0] * 4}
        return edges[case]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@PROPERTY
@given(sizes=group_sizes_strategy, seed=st.integers(0, 2**16))
def test_forward_equals_the_float64_product_of_the_dequantized_operands(
    backend, recipe, sizes, seed
):
    recipe = RECIPES[recipe]
    lhs, rhs = _operands(seed)
    group_sizes = jnp.asarray(sizes, jnp.int32)  # empty, skewed, short of or past M
    quantized, lhs_deq, rhs_deq = dequantized_operands(lhs, rhs, recipe)
    expected = _grouped64(lhs_deq, rhs_deq, sizes)
    out = fp8_grouped_matmul(lhs, rhs, group_sizes, recipe=recipe, backend=backend)
    assert out.dtype == jnp.float32
    assert relative_error(out, expected) <= 1e-6
    end = min(sum(sizes), lhs.shape[0])
    np.testing.assert_array_equal(np.asarray(out[end:]), 0.0)  # rows past the groups
    scaled = scaled_grouped_matmul(
        *quantized, group_sizes, recipe=recipe, backend=backend, preferred_element_type=jnp.float32
    )
    np.testing.assert_array_equal(np.asarray(scaled), np.asarray(out))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=str)
def test_forward_is_within_what_e4m3_allows_of_the_unquantized_product(backend, recipe, dtype):
    lhs, rhs = _operands(2, m=256, k=256, n=192, dtype=dtype)
    group_sizes = jnp.array([100, 0, 120, 30], jnp.int32)
    exact = grouped_matmul(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)
    out = fp8_grouped_matmul(lhs, rhs, group_sizes, recipe=recipe, backend=backend)
    assert out.dtype == dtype
    assert 0.005 < relative_error(out, exact) < 0.06


def test_the_xla_backend_multiplies_float8_operands():
    """The product runs on float8 inputs (ragged_dot lowers on CPU), not on a dequantized copy."""
    lhs, rhs = _operands(3, k=40)
    for recipe, dots in (("rowwise", 1), (Fp8Recipe("blockwise", block_size=16), 3)):
        step = jax.jit(
            lambda a, b, r=recipe: fp8_grouped_matmul(
                a, b, jnp.full(4, 10), recipe=r, backend="xla"
            )
        )
        lines = step.lower(lhs, rhs).as_text().splitlines()
        fp8_dots = [line for line in lines if "dot_general" in line and "xf8E4M3FN>" in line]
        assert len(fp8_dots) == dots  # one per K block (K = 40 in blocks of 16: 3)
        assert all(line.endswith("xf32>") for line in fp8_dots)  # float32 accumulation
        assert np.all(np.isfinite(np.asarray(step(lhs, rhs))))


@pytest.mark.parametrize("shape", [(2, 40, 24), (3, 33, 50), (1, 16, 16)])
def test_square_blocks_quantize_the_transpose_to_the_transposed_values(shape):
    """What the blockwise dgrad's reuse of the forward's FP8 weights rests on: with b x b
    blocks (ragged edge blocks included) quantize(w^T) == quantize(w)^T, bit for bit."""
    recipe = Fp8Recipe("blockwise", block_size=16)
    weights = jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32)
    q, scale = quantize(weights, recipe.rhs_blocks, recipe.dtype)
    q_t, scale_t = quantize(jnp.swapaxes(weights, 1, 2), recipe.rhs_blocks, recipe.dtype)
    np.testing.assert_array_equal(np.asarray(jnp.swapaxes(q, 1, 2)), np.asarray(q_t))
    np.testing.assert_array_equal(np.asarray(jnp.swapaxes(scale, 1, 2)), np.asarray(scale_t))


def _assert_same_bits(got, want):
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), b.astype(jnp.float32))


@pytest.mark.parametrize("recipe", [Fp8Recipe("rowwise"), Fp8Recipe("blockwise", block_size=16)])
def test_k_major_weight_quantization_is_the_same_bits_in_its_own_transpose_pass(recipe):
    """The K-major weights an FP8 ``wgmma`` reads: a bf16 transpose kept out of the cast's
    fusion (an optimization barrier), then the quantization along K; the same bits as
    quantizing ``[G, K, N]`` (ragged edge blocks included). Held as the kernels read them:
    the forward operand ``[G, N, K]``, the rowwise dgrad's ``[G, K, N]`` (K = 40 is no multiple
    of 16, so this is XLA's path, not the Pallas quantizer's)."""
    from jaxmoe.ops.fp8 import weights as fp8_weights

    weights = jnp.asarray(np.random.default_rng(1).standard_normal((3, 40, 24)), jnp.bfloat16)
    made = fp8_weights.make_fp8_weights(weights, recipe, k_major=True)
    assert made.q.shape == (3, 24, 40)
    _assert_same_bits(made.forward_operand(), quantize(weights, recipe.rhs_blocks, recipe.dtype))
    transposed = jnp.swapaxes(weights, 1, 2)
    _assert_same_bits(made.dgrad_operand(), quantize(transposed, recipe.rhs_blocks, recipe.dtype))
    if recipe.name == "rowwise":
        assert made.q_t.shape == (3, 40, 24)  # the master weight's layout: the dgrad's K-major
    jaxpr = jax.make_jaxpr(lambda w: fp8_weights.make_fp8_weights(w, recipe, True))(weights)
    lines = str(jaxpr).splitlines()
    barrier = next(i for i, line in enumerate(lines) if "optimization_barrier" in line)
    assert "bf16[3,24,40]" in lines[barrier]  # the bf16 weights, transposed, behind the barrier
    assert any("transpose" in line for line in lines[:barrier])


def test_k_major_rowwise_weights_come_from_the_pallas_quantizer_bit_for_bit():
    """Rowwise, K-major, dims multiples of 16: both operands from the two-pass Pallas kernel
    (the interpreter here), the same bits as XLA's quantize, each in its kernel's layout."""
    from jaxmoe.ops.fp8 import weights as fp8_weights

    recipe = Fp8Recipe("rowwise")
    rng = np.random.default_rng(2)
    spread = np.exp(rng.uniform(-3, 3, (2, 1, 48)))
    weights = jnp.asarray(rng.standard_normal((2, 32, 48)) * spread, jnp.bfloat16)
    jaxpr = str(jax.make_jaxpr(lambda w: fp8_weights.make_fp8_weights(w, recipe, True))(weights))
    assert "pallas_call" in jaxpr
    made = fp8_weights.make_fp8_weights(weights, recipe, k_major=True)
    assert made.q.shape == (2, 48, 32) and made.q_t.shape == (2, 32, 48)
    _assert_same_bits(made.forward_operand(), quantize(weights, recipe.rhs_blocks, recipe.dtype))
    transposed = jnp.swapaxes(weights, 1, 2)
    _assert_same_bits(made.dgrad_operand(), quantize(transposed, recipe.rhs_blocks, recipe.dtype))


def test_blockwise_backward_quantizes_the_weights_once(monkeypatch):
    """A training step quantizes the weights once with blockwise (the dgrad reuses them,
    transposed) and twice with rowwise (a contraction over N needs per-k scales)."""
    from jaxmoe.ops.fp8 import api, weights

    lhs, rhs = _operands(4, k=40)
    weight_passes = []

    def counting_quantize(x, blocks, *args, **kwargs):
        weight_passes.append(x.ndim == 3)
        return quantize(x, blocks, *args, **kwargs)

    monkeypatch.setattr(api, "quantize", counting_quantize)  # activations, gradients
    monkeypatch.setattr(weights, "quantize", counting_quantize)  # weights (Fp8Weights' module)
    for recipe, expected in ((Fp8Recipe("blockwise", 16), 1), ("rowwise", 2)):
        weight_passes.clear()

        def loss(a, b, r=recipe):
            return jnp.sum(fp8_grouped_matmul(a, b, jnp.full(4, 10), recipe=r, backend="xla"))

        jax.grad(loss, argnums=(0, 1))(lhs, rhs)
        assert sum(weight_passes) == expected, (recipe, weight_passes)


def test_bf16_wgrad_runs_on_bf16_operands():
    """The high-precision wgrad takes the gradient's dtype (bf16: tensor cores), not float32."""
    lhs, rhs = (a.astype(jnp.bfloat16) for a in _operands(3, k=40))
    seen = []

    class Recording(XlaScaledGroupedMatmul):
        def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
            seen.append((lhs.dtype, rhs.dtype, jnp.dtype(out_dtype)))
            return super().tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype)

    def loss(b):
        out = fp8_grouped_matmul(lhs, b, jnp.full(4, 10), backend=Recording())
        return jnp.sum(out.astype(jnp.float32))

    grad = jax.grad(loss)(rhs)
    assert seen == [(jnp.dtype(jnp.bfloat16),) * 3] and grad.dtype == jnp.bfloat16


# ----------------------------------------------------------------------------- VJP


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@PROPERTY
@given(sizes=group_sizes_strategy, seed=st.integers(0, 2**16))
def test_gradients_equal_the_float64_vjp_of_the_dequantized_product(backend, recipe, sizes, seed):
    """dgrad: FP8 cotangent (quantized like an activation along N) times the weight quantized
    for a contraction over N; wgrad: the dequantized FP8 activations times the exact cotangent."""
    recipe = RECIPES[recipe]
    lhs, rhs = _operands(seed)
    cotangent = jnp.asarray(np.random.default_rng(seed + 1).standard_normal((48, 24)), jnp.float32)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    _, vjp = jax.vjp(
        lambda a, b: fp8_grouped_matmul(a, b, group_sizes, recipe=recipe, backend=backend),
        lhs,
        rhs,
    )
    grad_lhs, grad_rhs = vjp(cotangent)
    assert grad_lhs.dtype == lhs.dtype and grad_rhs.dtype == rhs.dtype

    expected_lhs, expected_rhs = fp8_reference_grads(lhs, rhs, cotangent, sizes, recipe)
    assert relative_error(grad_lhs, expected_lhs) <= 1e-6
    assert relative_error(grad_rhs, expected_rhs) <= 1e-6


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_gradients_are_within_what_e4m3_allows_of_the_unquantized_gradients(recipe):
    lhs, rhs = _operands(4, m=256, k=256, n=192)
    group_sizes = jnp.array([100, 0, 120, 30], jnp.int32)
    cotangent = jnp.asarray(np.random.default_rng(5).standard_normal((256, 192)), jnp.float32)

    def grads(fn):
        return jax.vjp(lambda a, b: fn(a, b, group_sizes), lhs, rhs)[1](cotangent)

    exact = grads(grouped_matmul)
    fp8 = grads(lambda a, b, gs: fp8_grouped_matmul(a, b, gs, recipe=recipe))
    for got, want in zip(fp8, exact, strict=True):
        assert 0.005 < relative_error(got, want) < 0.06


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_rows_past_the_groups_stay_out_of_values_and_gradients(backend):
    lhs, rhs = _operands(6)
    lhs = lhs.at[40:].set(jnp.nan)  # rows past sum(group_sizes) = 40 may hold anything
    group_sizes = jnp.array([10, 0, 25, 5], jnp.int32)

    def loss(a, b):
        out = fp8_grouped_matmul(a, b, group_sizes, recipe="blockwise", backend=backend)
        return jnp.sum(out[:40] ** 2), out

    (_, out), (grad_lhs, grad_rhs) = jax.value_and_grad(loss, (0, 1), has_aux=True)(lhs, rhs)
    np.testing.assert_array_equal(np.asarray(out[40:]), 0.0)
    assert np.all(np.isfinite(np.asarray(out))) and np.all(np.isfinite(np.asarray(grad_rhs)))
    assert np.all(np.isfinite(np.asarray(grad_lhs[:40])))


def test_under_jit_with_traced_group_sizes():
    lhs, rhs = _operands(7)
    step = jax.jit(jax.grad(lambda a, b, gs: jnp.sum(fp8_grouped_matmul(a, b, gs)), (0, 1)))
    for sizes in ([48, 0, 0, 0], [0, 0, 0, 0], [1, 2, 3, 4]):
        grad_lhs, grad_rhs = step(lhs, rhs, jnp.asarray(sizes, jnp.int32))
        assert np.all(np.isfinite(np.asarray(grad_rhs)))
        np.testing.assert_array_equal(np.asarray(grad_lhs[sum(sizes) :]), 0.0)


# ----------------------------------------------------------------------------- bad input


def _call(**overrides):
    lhs, rhs = _operands(8)
    args = {"lhs": lhs, "rhs": rhs, "group_sizes": jnp.array([1, 2, 3, 4])} | overrides
    return lambda: fp8_grouped_matmul(**args)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (_call(recipe="tensorwise"), ValueError, "`recipe` must be one of"),
        (_call(backend="pallas_triton"), NotImplementedError, "'pallas_triton' has no FP8"),
        (_call(backend="cuda"), ValueError, "unknown `backend` 'cuda'"),
        (_call(lhs=jnp.ones((4, 3))), ValueError, "contracting dims differ"),
        (_call(group_sizes=jnp.ones(4)), ValueError, "`group_sizes` must be an integer"),
    ],
)
def test_fp8_grouped_matmul_rejects_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_scaled_grouped_matmul_rejects_unquantized_operands_and_wrong_scales():
    lhs, rhs = _operands(9)
    recipe = Fp8Recipe("blockwise", block_size=16)
    lhs_q, lhs_scale, rhs_q, rhs_scale = dequantized_operands(lhs, rhs, recipe)[0]
    sizes = jnp.array([1, 2, 3, 4])
    with pytest.raises(ValueError, match="`lhs_q` must be FP8"):
        scaled_grouped_matmul(lhs, lhs_scale, rhs_q, rhs_scale, sizes, recipe=recipe)
    with pytest.raises(ValueError, match=r"`rhs_scale` must be float32 of shape \(4, 3, 2\)"):
        scaled_grouped_matmul(lhs_q, lhs_scale, rhs_q, rhs_scale[:, :1], sizes, recipe=recipe)
    with pytest.raises(ValueError, match=r"`lhs_scale` must be float32 of shape \(48, 1\)"):
        scaled_grouped_matmul(lhs_q, lhs_scale, rhs_q, rhs_scale, sizes, recipe="rowwise")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "tensor"}, "Fp8Recipe.name"),
        ({"block_size": 0}, "block_size"),
        ({"grad_dtype": jnp.bfloat16}, "Fp8Recipe.grad_dtype"),
    ],
)
def test_recipe_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Fp8Recipe(**kwargs)
