"""The FP8 weight gradient (``Fp8Recipe(wgrad="fp8")``) on CPU: the columnwise quantization and
its padded layout (``jaxmoe.ops.fp8.columnwise``), every backend's ``scaled_tgmm``, the VJP and
the layer.

Bounds: quantization as in tests/test_fp8.py (half an e4m3 ulp per element, plus half the
smallest subnormal times the scale); ``scaled_tgmm`` against the float64 product of the
dequantized operands within 1e-6 relative (FP8 products are exact in float32; only the float32
sums and the two scale multiplies round); the FP8 wgrad against the unquantized one within 6%
(two operands each within 2**-4 relative per element, as for the forward).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxmoe
from jaxmoe.bench.harness import relative_error
from jaxmoe.ops.fp8 import E4M3, E5M2, Fp8Recipe, fp8_grouped_matmul, resolve_fp8_backend
from jaxmoe.ops.fp8.columnwise import (
    ALIGN,
    padded_group_starts,
    padded_length,
    quantize_columnwise,
)
from jaxmoe.ops.grouped_matmul import grouped_matmul

BACKENDS = ("reference", "xla")
FP8_WGRAD = Fp8Recipe("rowwise", wgrad="fp8")
PROPERTY = settings(max_examples=12, deadline=None)
sizes_strategy = st.lists(st.integers(0, 200), min_size=3, max_size=3)


def _rows(seed, m, k, past=0):
    """``[m, k]`` rows of varied scale (columns too), the last ``past`` rows NaN."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp(rng.uniform(-2, 2, (m, 1)) + rng.uniform(-2, 2, k))
    if past:
        x[m - past :] = np.nan
    return jnp.asarray(x, jnp.float32)


def _group_slices(sizes):
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [slice(int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


@PROPERTY
@given(sizes=sizes_strategy, seed=st.integers(0, 2**16), dtype=st.sampled_from([E4M3, E5M2]))
def test_columnwise_layout_scales_and_round_trip(sizes, seed, dtype):
    m, k = 3 * 200 + 5, 24  # one shape for every example: its ops are compiled once
    x = _rows(seed, m, k, past=m - sum(sizes))  # NaN past the groups: neither in a scale nor copied
    q_t, scale, starts = quantize_columnwise(x, jnp.asarray(sizes, jnp.int32), dtype)
    assert q_t.dtype == dtype and q_t.shape == (k, padded_length(m, 3))
    assert scale.shape == (3, k) and scale.dtype == jnp.float32
    padded = -(-np.asarray(sizes) // ALIGN) * ALIGN
    np.testing.assert_array_equal(starts, np.cumsum(padded) - padded)
    q = np.asarray(q_t.astype(jnp.float32))
    fmax, (relative, subnormal) = (
        float(jnp.finfo(dtype).max),
        {
            E4M3: (2.0**-4, 2.0**-10),
            E5M2: (2.0**-3, 2.0**-17),
        }[jnp.dtype(dtype)],
    )
    copied = np.zeros(q.shape[1], bool)
    for g, rows in enumerate(_group_slices(sizes)):
        x_g = np.asarray(x[rows], np.float32)
        amax = np.abs(x_g).max(axis=0) if len(x_g) else np.zeros(k, np.float32)
        np.testing.assert_allclose(scale[g], np.maximum(amax, 1e-12) / fmax, rtol=1e-6)
        columns = slice(int(starts[g]), int(starts[g]) + len(x_g))
        copied[columns] = True
        restored = q[:, columns].T * np.asarray(scale[g])
        bound = relative * np.abs(x_g) + subnormal * np.asarray(scale[g]) + 2**-20 * np.abs(x_g)
        assert np.all(np.abs(restored - x_g) <= bound)
    np.testing.assert_array_equal(q[:, ~copied], 0.0)  # the padding, and no row past the sum


def _grouped_wgrad64(lhs, rhs, sizes):
    out = np.zeros((len(sizes), lhs.shape[1], rhs.shape[1]))
    for g, rows in enumerate(_group_slices(sizes)):
        out[g] = np.asarray(lhs[rows], np.float64).T @ np.asarray(rhs[rows], np.float64)
    return out


def _dequantized_rows(x, sizes, dtype=E4M3):
    """``Q_col(x)`` back in ``[M, K]`` row order (float64), rows past the groups zero."""
    q_t, scale, starts = quantize_columnwise(x, jnp.asarray(sizes, jnp.int32), dtype)
    out = np.zeros(x.shape)
    q = np.asarray(q_t.astype(jnp.float32), np.float64)
    for g, rows in enumerate(_group_slices(sizes)):
        start = int(starts[g])
        out[rows] = q[:, start : start + rows.stop - rows.start].T * np.asarray(scale[g])
    return out


# No "pallas" case: resolve_fp8_backend("auto") on CPU is the XLA backend (the same as "xla");
# the Mosaic kernel's scaled_tgmm: tests/test_fp8_mosaic_wgrad.py and
# test_the_mosaic_backend_runs_the_fp8_wgrad_kernel_in_the_interpreter below.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sizes", [[70, 0, 130], [0, 0, 200], [0, 0, 0], [1, 128, 3]])
def test_scaled_tgmm_is_the_float64_product_of_the_dequantized_operands(backend, sizes):
    m = sum(sizes) + 3
    lhs, grad = _rows(1, m, 40, past=3), _rows(2, m, 24, past=3)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    lhs_t_q, lhs_scale, starts = quantize_columnwise(lhs, group_sizes)
    grad_t_q, grad_scale, _ = quantize_columnwise(grad, group_sizes)
    impl = resolve_fp8_backend(backend)
    out = impl.scaled_tgmm(
        lhs_t_q, lhs_scale, grad_t_q, grad_scale, starts, group_sizes, out_dtype=jnp.float32
    )
    expected = _grouped_wgrad64(
        _dequantized_rows(lhs, sizes), _dequantized_rows(grad, sizes), sizes
    )
    assert out.shape == (3, 40, 24)
    assert relative_error(out, expected) <= 1e-6 if np.any(expected) else not np.any(out)


@functools.partial(jax.jit, static_argnames=("recipe", "backend"))
def _jitted_vjp(lhs, rhs, ct, group_sizes, *, recipe, backend):
    """Output, d lhs and d rhs: one program per (recipe, backend), whatever the group sizes."""
    fn = lambda a, b: fp8_grouped_matmul(a, b, group_sizes, recipe=recipe, backend=backend)  # noqa: E731
    out, pullback = jax.vjp(fn, lhs, rhs)
    return out, *pullback(ct)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=5, deadline=None, derandomize=True)
@given(sizes=sizes_strategy, seed=st.integers(0, 2**16))
def test_fp8_wgrad_vjp(backend, sizes, seed):
    """wgrad: the float64 product of the columnwise-quantized operands; forward and dgrad: the
    same bits as the recipe with the high-precision wgrad (both jitted: one program per recipe,
    compiled once, as every example has the same shapes: the rows past the groups, NaN in
    ``lhs``, fill up to the most the strategy can draw)."""
    m = 3 * 200 + 4
    lhs, ct = _rows(seed, m, 32, past=m - sum(sizes)), _rows(seed + 1, m, 16)
    rhs = jnp.asarray(np.random.default_rng(seed).standard_normal((3, 32, 16)) / 6, jnp.float32)
    group_sizes = jnp.asarray(sizes, jnp.int32)

    def vjp(recipe):
        return _jitted_vjp(lhs, rhs, ct, group_sizes, recipe=recipe, backend=backend)

    out, grad_lhs, grad_rhs = vjp(FP8_WGRAD)
    out_hp, grad_lhs_hp, _ = vjp(Fp8Recipe("rowwise"))
    np.testing.assert_array_equal(out, out_hp)
    np.testing.assert_array_equal(grad_lhs, grad_lhs_hp)
    assert grad_rhs.dtype == rhs.dtype and np.all(np.isfinite(np.asarray(grad_rhs)))
    expected = _grouped_wgrad64(_dequantized_rows(lhs, sizes), _dequantized_rows(ct, sizes), sizes)
    if np.any(expected):
        assert relative_error(grad_rhs, expected) <= 1e-6
    else:
        np.testing.assert_array_equal(grad_rhs, 0.0)


def test_fp8_wgrad_is_within_what_e4m3_allows_of_the_unquantized_wgrad():
    rng = np.random.default_rng(3)
    lhs = jnp.asarray(rng.standard_normal((300, 256)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((4, 256, 192)) / 16, jnp.float32)
    ct = jnp.asarray(rng.standard_normal((300, 192)), jnp.float32)
    group_sizes = jnp.array([100, 0, 150, 30], jnp.int32)

    def wgrad(fn):
        return jax.jit(lambda b: jax.vjp(lambda b: fn(lhs, b, group_sizes), b)[1](ct)[0])(rhs)

    exact = wgrad(grouped_matmul)
    fp8 = wgrad(lambda a, b, gs: fp8_grouped_matmul(a, b, gs, recipe=FP8_WGRAD))
    assert 0.005 < relative_error(fp8, exact) < 0.06


def test_auto_wgrad_picks_fp8_for_wide_matmuls_only():
    """``wgrad="auto"`` (the default): FP8 where ``2KN / (K + N) >= 2048``, rowwise only. The
    benchmark presets' matmuls: Mixtral and DeepSeek-V3 in FP8, Qwen3 in high precision."""
    auto = Fp8Recipe("rowwise")
    assert auto.wgrad == "auto"
    for k, n in ((4096, 14336), (14336, 4096), (7168, 2048), (2048, 2048)):
        assert auto.fp8_wgrad(k, n), (k, n)
    for k, n in ((2048, 768), (768, 2048), (2047, 2047), (64, 1 << 20)):
        assert not auto.fp8_wgrad(k, n), (k, n)
    assert not Fp8Recipe("blockwise").fp8_wgrad(4096, 14336)  # no blockwise FP8 wgrad
    assert FP8_WGRAD.fp8_wgrad(16, 16) and not Fp8Recipe(wgrad="high").fp8_wgrad(8192, 8192)


@pytest.mark.parametrize("min_width, runs", [(21, "fp8"), (22, "high")])
def test_auto_wgrad_runs_the_picked_weight_gradient(monkeypatch, min_width, runs):
    """At K=32, N=16 (2KN / (K + N) = 21.3) ``"auto"``'s gradients are bit for bit those of the
    precision it picks, and the two precisions differ (so the test sees the pick)."""
    from jaxmoe.ops.fp8 import recipe as recipe_module

    monkeypatch.setattr(recipe_module, "AUTO_FP8_WGRAD_MIN_WIDTH", min_width)
    lhs, rhs, ct = _rows(0, 40, 32), _rows(1, 48, 16).reshape(3, 16, 16)[:2], _rows(2, 40, 16)
    rhs = jnp.concatenate([rhs, rhs], axis=1)  # [2, 32, 16]
    group_sizes = jnp.array([25, 15], jnp.int32)

    def grads(wgrad):
        def loss(a, b):
            out = fp8_grouped_matmul(a, b, group_sizes, recipe=Fp8Recipe(wgrad=wgrad))
            return jnp.sum(out * ct)

        return jax.jit(jax.grad(loss, argnums=(0, 1)))(lhs, rhs)

    auto, picked, other = grads("auto"), grads(runs), grads({"fp8": "high", "high": "fp8"}[runs])
    for got, want in zip(auto, picked, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(auto[1], other[1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"wgrad": "fp16"}, "Fp8Recipe.wgrad must be one of"),
        ({"name": "blockwise", "wgrad": "fp8"}, "wgrad='fp8' needs name='rowwise'"),
    ],
)
def test_recipe_rejects_bad_wgrad(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Fp8Recipe(**kwargs)


def test_padded_length_bounds_every_layout():
    for sizes in ([0, 0, 0], [1, 1, 1], [129, 255, 0], [384, 0, 0]):
        starts = padded_group_starts(jnp.asarray(sizes))
        end = int(starts[-1]) + -(-sizes[-1] // ALIGN) * ALIGN
        assert end <= padded_length(sum(sizes), len(sizes))


# ----------------------------------------------------------------------------- the layer


def test_layer_takes_the_recipe_object_and_trains_its_experts_in_fp8():
    base = {"num_experts": 4, "top_k": 2, "hidden_size": 64, "ffn_size": 96}
    x = jax.random.normal(jax.random.key(1), (4, 32, 64), jnp.bfloat16)

    def grads(recipe):
        cfg = jaxmoe.MoEConfig(**base, dtype=jnp.bfloat16, fp8_recipe=recipe)
        params = jaxmoe.init_params(jax.random.key(0), cfg)
        loss = lambda p: jnp.sum(jaxmoe.moe(p, x, cfg)[0].astype(jnp.float32) ** 2)  # noqa: E731
        return jax.jit(jax.grad(loss))(params)["experts"]

    exact, high, fp8 = grads(None), grads("rowwise"), grads(FP8_WGRAD)
    for name in ("w_gate", "w_up", "w_down"):
        assert fp8[name].dtype == jnp.float32
        assert not np.array_equal(fp8[name], high[name])  # the wgrad ran in FP8
        assert relative_error(fp8[name], exact[name]) < 0.15


def test_config_refuses_objects_that_are_not_recipes():
    base = {"num_experts": 4, "top_k": 2, "hidden_size": 64, "ffn_size": 96}
    assert jaxmoe.MoEConfig(**base, fp8_recipe=FP8_WGRAD).fp8_recipe == FP8_WGRAD
    rule = r"MoEConfig\.fp8_recipe: .* or a jaxmoe\.ops\.fp8\.Fp8Recipe"
    with pytest.raises(ValueError, match=rule):
        jaxmoe.MoEConfig(**base, fp8_recipe=object())


def test_the_mosaic_backend_runs_the_fp8_wgrad_kernel_in_the_interpreter():
    """Backend "pallas" (no fallback) on CPU: the forward, dgrad and FP8 wgrad all in Mosaic
    GPU's interpreter, in one jitted program (every output used, so none is dead code); each
    within one bf16 ulp of the XLA backend's."""
    from jaxmoe.ops.fp8.pallas_mosaic import PallasMosaicScaledGroupedMatmul
    from jaxmoe.ops.mosaic.tiles import MosaicTileConfig

    kernel = PallasMosaicScaledGroupedMatmul(tiles=MosaicTileConfig(64, 128, 128, stages=2))
    rng = np.random.default_rng(9)
    lhs = jnp.asarray(rng.standard_normal((256, 128)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((3, 128, 256)) / 11, jnp.bfloat16)
    ct = jnp.asarray(rng.standard_normal((256, 256)), jnp.bfloat16)
    group_sizes = jnp.array([130, 0, 100], jnp.int32)  # an empty group, rows past the sum

    @functools.partial(jax.jit, static_argnums=0)
    def out_and_grads(backend):
        fn = lambda a, b: fp8_grouped_matmul(a, b, group_sizes, recipe=FP8_WGRAD, backend=backend)  # noqa: E731
        out, pullback = jax.vjp(fn, lhs, rhs)
        return out, *pullback(ct)

    (out, grad_lhs, got), (want_out, want_lhs, want) = out_and_grads(kernel), out_and_grads("xla")
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got[1], 0.0)
    assert relative_error(got, want) <= 2.0**-8
    assert relative_error(out, want_out) <= 2.0**-8
    assert relative_error(grad_lhs, want_lhs) <= 2.0**-8


COLUMNWISE_SIZES = [[130, 0, 300, 200], [0, 0, 0, 690], [0, 0, 0, 0], [128, 256, 1, 5]]


@pytest.mark.parametrize("sizes", COLUMNWISE_SIZES)
def test_the_pallas_columnwise_quantizer_is_the_xla_one(sizes):
    """In Pallas' interpreter: the same scales and starts bit for bit; the FP8 values too, up to
    one e4m3 step on a value that lands on a rounding tie (the interpreter's division may round
    a quotient onto the tie that XLA's does not: seen once in 180 k elements). On a GPU
    ``jaxmoe bench fp8-quantize --kind columnwise`` counts differing elements."""
    from jaxmoe.ops.fp8.columnwise_pallas import quantize_columnwise_pallas

    x = _rows(0, 700, 256, past=10).astype(jnp.bfloat16)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    want = quantize_columnwise(x, group_sizes)
    got = quantize_columnwise_pallas(x, group_sizes)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    got_q, want_q = (np.asarray(q.astype(jnp.float32)) for q in (got[0], want[0]))
    differ = got_q != want_q
    assert differ.sum() <= 2
    step = np.maximum(np.abs(want_q[differ]) * 2.0**-3, 2.0**-9)
    assert np.all(np.abs(got_q[differ] - want_q[differ]) <= step)


def test_the_pallas_columnwise_quantizer_lowers_for_a_gpu():
    """The Triton lowering of both passes (masked loads at dynamic row offsets, the transposed
    tile store), from this CPU host, at the Mixtral layer's hidden activations' shape."""
    from jaxmoe.ops.fp8.columnwise_pallas import quantize_columnwise_pallas

    fn = jax.jit(lambda x, g: quantize_columnwise_pallas(x, g, interpret=False))
    args = (
        jax.ShapeDtypeStruct((8192, 14336), jnp.bfloat16),
        jax.ShapeDtypeStruct((8,), jnp.int32),
    )
    text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("jaxmoe_columnwise_amax") >= 1 and "jaxmoe_columnwise_cast" in text


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("m, groups", [(8, 0), (0, 2)])
def test_fp8_wgrad_with_no_groups_or_no_rows(backend, m, groups):
    from jaxmoe.ops.fp8.columnwise_pallas import quantize_columnwise_pallas

    lhs, rhs = jnp.ones((m, 16)), jnp.ones((groups, 16, 4))
    sizes = jnp.zeros((groups,), jnp.int32)
    loss = lambda w: fp8_grouped_matmul(lhs, w, sizes, recipe=FP8_WGRAD, backend=backend).sum()  # noqa: E731
    grad = jax.grad(loss)(rhs)
    assert grad.shape == rhs.shape and not np.any(grad)
    got, want = quantize_columnwise_pallas(lhs, sizes), quantize_columnwise(lhs, sizes)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.astype(jnp.float32), b.astype(jnp.float32))
