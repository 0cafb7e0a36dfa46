"""The two-pass Pallas weight quantization is the XLA path's bits (Pallas interpreter on CPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmoe.ops.fp8.quantize import E4M3
from jaxmoe.ops.fp8.weight_quantize_pallas import (
    WeightQuantizeTiles,
    fit_block,
    quantize_weights_rowwise_pallas,
    quantize_weights_rowwise_xla,
)

SMALL_TILES = WeightQuantizeTiles(32, 64, 4, 32, 32, 4)
NAMES = ("q_fwd_nk", "scale_fwd", "q_dgrad", "scale_dgrad")


def as_bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def assert_bitwise_equal(got, want):
    for name, g, w in zip(NAMES, got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        differ = int(np.count_nonzero(as_bits(g) != as_bits(w)))
        assert differ == 0, f"{name}: {differ} elements differ"


def spread_weight(shape, seed=0, dtype=jnp.bfloat16):
    """Normal values times per-row and per-column magnitudes exp(uniform(-3, 3))."""
    g, k, n = shape
    keys = jax.random.split(jax.random.key(seed), 3)
    rows = jnp.exp(jax.random.uniform(keys[1], (g, k, 1), minval=-3.0, maxval=3.0))
    cols = jnp.exp(jax.random.uniform(keys[2], (g, 1, n), minval=-3.0, maxval=3.0))
    return (jax.random.normal(keys[0], shape) * rows * cols).astype(dtype)


def check(w, tiles=SMALL_TILES):
    got = quantize_weights_rowwise_pallas(w, tiles=tiles, interpret=True)
    assert_bitwise_equal(got, quantize_weights_rowwise_xla(w))
    return got


@pytest.mark.parametrize(
    "shape, tiles",
    [
        ((2, 64, 128), SMALL_TILES),  # several tiles along both dims, non-square amax tiles
        ((1, 32, 32), SMALL_TILES),  # one tile
        ((3, 128, 48), SMALL_TILES),  # N = 48: tiles shrink to 16
        ((2, 96, 64), WeightQuantizeTiles(64, 16, 4, 16, 64, 4)),  # K = 96: 64 -> 32
    ],
)
def test_spread_weights_bitwise(shape, tiles):
    check(spread_weight(shape), tiles)


def test_float32_weights_bitwise():
    check(spread_weight((2, 32, 64), seed=3, dtype=jnp.float32))


def test_zero_expert_and_zero_column_bitwise():
    w = spread_weight((3, 64, 64), seed=1)
    w = w.at[1].set(0).at[0, :, 5].set(0).at[2, 7, :].set(0)
    q_fwd_nk, scale_fwd, q_dgrad, scale_dgrad = check(w)
    assert not np.any(np.asarray(q_dgrad[1], np.float32))  # the zero expert quantizes to zeros
    assert np.all(np.isfinite(np.asarray(scale_fwd)))
    assert float(scale_fwd[0, 0, 5]) > 0  # SCALE_EPS floor, not zero


def test_clip_ties_and_signed_extremes_bitwise():
    """Largest |x| in a row/column (hits 448 after the float32 division), ties of it, both signs,
    values on e4m3 rounding midpoints, and negative zero."""
    w = spread_weight((2, 32, 64), seed=2).astype(jnp.float32)
    w = w.at[0, 3, :].set(-1024.0).at[0, 4, :].set(1024.0)  # two tied extremes, both signs
    w = w.at[1, :, 9].set(jnp.linspace(-448.0, 448.0, 32))  # 448 / 448 = 1: exact scale
    w = w.at[1, 0, :].set(1.0625).at[1, 1, :].set(-0.0)  # e4m3 midpoint (1 + 1/16); -0
    check(w.astype(jnp.bfloat16))


def test_a_wrong_variant_fails():
    """The check can fail: a reference with the transposed copy not transposed, or an off
    scale, is caught."""
    w = spread_weight((1, 32, 64))
    got = quantize_weights_rowwise_pallas(w, tiles=SMALL_TILES, interpret=True)
    q_fwd_nk, scale_fwd, q_dgrad, scale_dgrad = quantize_weights_rowwise_xla(w)
    with pytest.raises(AssertionError):
        untransposed = q_dgrad.reshape(q_fwd_nk.shape)
        assert_bitwise_equal(got, (untransposed, scale_fwd, q_dgrad, scale_dgrad))
    with pytest.raises(AssertionError):
        assert_bitwise_equal(got, (q_fwd_nk, scale_fwd * 1.0000001, q_dgrad, scale_dgrad))
    wrong = (jnp.swapaxes(w, 1, 2).astype(E4M3), scale_fwd, q_dgrad, scale_dgrad)  # no scaling
    with pytest.raises(AssertionError):
        assert_bitwise_equal(got, wrong)


def test_output_shapes_and_dtypes():
    q_fwd_nk, scale_fwd, q_dgrad, scale_dgrad = quantize_weights_rowwise_pallas(
        jnp.ones((2, 32, 64), jnp.bfloat16), tiles=SMALL_TILES, interpret=True
    )
    assert (q_fwd_nk.shape, q_fwd_nk.dtype) == ((2, 64, 32), E4M3)
    assert (q_dgrad.shape, q_dgrad.dtype) == ((2, 32, 64), E4M3)
    assert (scale_fwd.shape, scale_fwd.dtype) == ((2, 1, 64), jnp.float32)
    assert (scale_dgrad.shape, scale_dgrad.dtype) == ((2, 32, 1), jnp.float32)


def test_under_jit():
    w = spread_weight((2, 32, 64), seed=4)
    fn = jax.jit(lambda x: quantize_weights_rowwise_pallas(x, tiles=SMALL_TILES, interpret=True))
    assert_bitwise_equal(fn(w), quantize_weights_rowwise_xla(w))


@pytest.mark.parametrize(
    "w, match",
    [
        (jnp.ones((32, 64), jnp.bfloat16), r"`w` must be a 3-D"),
        (jnp.ones((1, 32, 64), jnp.int8), r"`w` must be bfloat16"),
        (jnp.ones((0, 32, 64), jnp.bfloat16), r"no experts"),
        (jnp.ones((1, 40, 64), jnp.bfloat16), r"w.shape\[1\] \(K\) = 40"),
        (jnp.ones((1, 32, 24), jnp.bfloat16), r"w.shape\[2\] \(N\) = 24"),
    ],
)
def test_value_errors(w, match):
    with pytest.raises(ValueError, match=match):
        quantize_weights_rowwise_pallas(w, interpret=True)


def test_tiles_must_be_powers_of_two():
    with pytest.raises(ValueError, match="cast_block_k"):
        WeightQuantizeTiles(cast_block_k=96)
    with pytest.raises(ValueError, match="amax_block_n"):
        WeightQuantizeTiles(amax_block_n=8)


def test_fit_block():
    assert fit_block(14336, 128, "N") == 128
    assert fit_block(48, 128, "N") == 16
    assert fit_block(96, 64, "K") == 32
    with pytest.raises(ValueError, match="K = 40"):
        fit_block(40, 128, "K")
