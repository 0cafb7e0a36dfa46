"""FP8 weights quantized once per step and reused: ``Fp8Weights``, ``quantize_fp8_weights``,
``fp8_grouped_matmul(rhs_fp8=)``, ``jaxmoe.quantize_expert_weights``, ``moe(fp8_weights=)``.

The cache holds exactly the operands the op computes from ``rhs`` itself, so every comparison
with the uncached op or layer is bitwise (``assert_array_equal``), gradients included. Tests
that the cache is actually read (a stale cache changes the forward and dgrad, never the wgrad;
no weight quantization runs) keep the bitwise ones from passing by ignoring it.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

import jaxmoe
from jaxmoe.nn import MoE, MoELinen
from jaxmoe.ops.fp8 import (
    Fp8Recipe,
    Fp8Weights,
    XlaScaledGroupedMatmul,
    fp8_grouped_matmul,
    quantize,
    quantize_fp8_weights,
)
from jaxmoe.ops.fp8 import weights as fp8_weights_module
from jaxmoe.ops.fp8.pallas_mosaic import PallasMosaicScaledGroupedMatmul
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig
from tests.xla_cpu import jit_xla_defaults

RECIPES = ["rowwise", "blockwise"]
SIZES = [90, 0, 7, 150]  # skewed, an empty group, 9 rows past the last group
M, K, N = 256, 256, 160  # blockwise: two K blocks, a partial N block
GROUPS = len(SIZES)


def _operands(seed=0, dtype=jnp.bfloat16, groups=GROUPS, k=K, n=N):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((M, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((groups, k, n)) / np.sqrt(k), dtype)
    dy = jnp.asarray(rng.standard_normal((M, n)), dtype)
    return lhs, rhs, dy


def _op_value_and_grads(lhs, rhs, dy, recipe, backend, rhs_fp8=None):
    """Output and (d lhs, d rhs) of ``sum(out * dy)``, the cache a non-differentiated input."""

    def loss(lhs, rhs, cache):
        out = fp8_grouped_matmul(
            lhs, rhs, jnp.asarray(SIZES), recipe=recipe, backend=backend, rhs_fp8=cache
        )
        return jnp.sum(out.astype(jnp.float32) * dy.astype(jnp.float32)), out

    grads, out = jax.grad(loss, argnums=(0, 1), has_aux=True)(lhs, rhs, rhs_fp8)
    return out, *grads


def _assert_trees_equal(got, want):
    for (path, g), w in zip(
        jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want), strict=True
    ):
        assert g.dtype == w.dtype, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(
            np.asarray(g, np.float32), np.asarray(w, np.float32), jax.tree_util.keystr(path)
        )


# ----------------------------------------------------------------------------- the op


@pytest.mark.parametrize("backend", ["xla", "reference"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_op_with_the_cache_is_bitwise_the_op_without(recipe, backend):
    lhs, rhs, dy = _operands()
    cache = quantize_fp8_weights(rhs, recipe, backend)
    want = _op_value_and_grads(lhs, rhs, dy, recipe, backend)
    got = _op_value_and_grads(lhs, rhs, dy, recipe, backend, cache)
    _assert_trees_equal(got, want)
    assert got[2].dtype == rhs.dtype  # the master weight's gradient, in its dtype
    assert np.all(np.asarray(got[0], np.float32)[sum(SIZES) :] == 0)


@pytest.mark.parametrize("recipe", RECIPES)
def test_jitted_op_with_the_cache_is_bitwise_the_op_without(recipe):
    lhs, rhs, dy = _operands(seed=1)
    run = jax.jit(_op_value_and_grads, static_argnums=(3, 4))
    cache = jax.jit(quantize_fp8_weights, static_argnums=(1, 2))(rhs, recipe, "xla")
    _assert_trees_equal(run(lhs, rhs, dy, recipe, "xla", cache), run(lhs, rhs, dy, recipe, "xla"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_stale_cache_runs_forward_and_dgrad_on_the_cached_weights_and_wgrad_unchanged(recipe):
    """The cache is read (a cache of other weights changes ``out`` and ``d lhs``) and the wgrad
    ``lhs^T @ dy`` (a linear loss: independent of the weights) is still taken for ``rhs``."""
    lhs, rhs, dy = _operands(seed=2)
    _, old_rhs, _ = _operands(seed=3)
    out, grad_lhs, grad_rhs = _op_value_and_grads(
        lhs, rhs, dy, recipe, "xla", quantize_fp8_weights(old_rhs, recipe, "xla")
    )
    want_old = _op_value_and_grads(lhs, old_rhs, dy, recipe, "xla")
    want_new = _op_value_and_grads(lhs, rhs, dy, recipe, "xla")
    _assert_trees_equal((out, grad_lhs), want_old[:2])
    assert not np.array_equal(np.asarray(out, np.float32), np.asarray(want_new[0], np.float32))
    _assert_trees_equal(grad_rhs, want_new[2])


@pytest.mark.parametrize("recipe", RECIPES)
def test_with_the_cache_no_weight_is_quantized(recipe, monkeypatch):
    """Forward and backward with a cache: no quantization of a 3-D (weight) operand at all."""
    lhs, rhs, dy = _operands()
    cache = quantize_fp8_weights(rhs, recipe, "xla")
    weight_passes = []

    def counting_quantize(x, blocks, *args, **kwargs):
        weight_passes.append(jnp.ndim(x) == 3)
        return quantize(x, blocks, *args, **kwargs)

    monkeypatch.setattr(fp8_weights_module, "quantize", counting_quantize)
    _op_value_and_grads(lhs, rhs, dy, recipe, "xla", cache)
    assert sum(weight_passes) == 0
    _op_value_and_grads(lhs, rhs, dy, recipe, "xla")  # the counter counts: uncached, >= 1
    assert sum(weight_passes) == (1 if recipe == "blockwise" else 2)


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_cache_holds_the_forward_and_dgrad_operands(recipe):
    rhs = _operands()[1]
    cache = quantize_fp8_weights(rhs, recipe, "xla")
    blocks = Fp8Recipe(recipe).rhs_blocks
    _assert_trees_equal(cache.forward_operand(), quantize(rhs, blocks))
    _assert_trees_equal(cache.dgrad_operand(), quantize(jnp.swapaxes(rhs, 1, 2), blocks))
    assert (cache.q_t is None) == (recipe == "blockwise")  # blockwise: the forward's, transposed


@pytest.mark.parametrize("recipe", RECIPES)
def test_quantizing_a_slice_of_experts_is_that_slice_of_the_cache(recipe):
    """Why the sharded layer may take the cache split over experts: each rank's slice is what it
    would quantize from its own experts (every block lies inside one expert)."""
    rhs = _operands()[1]
    whole = quantize_fp8_weights(rhs, recipe, "xla")
    for lo, hi in ((0, 1), (1, 3), (2, 4)):
        part = quantize_fp8_weights(rhs[lo:hi], recipe, "xla")
        _assert_trees_equal(part, jax.tree.map(lambda a, lo=lo, hi=hi: a[lo:hi], whole))


@pytest.mark.parametrize("recipe", RECIPES)
def test_gradient_with_respect_to_the_cache_is_zero(recipe):
    lhs, rhs, dy = _operands()
    cache = quantize_fp8_weights(rhs, recipe, "xla")

    def loss(cache):
        out = fp8_grouped_matmul(lhs, rhs, jnp.asarray(SIZES), recipe=recipe, rhs_fp8=cache)
        return jnp.sum(out.astype(jnp.float32) * dy.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss))(cache)
    assert isinstance(grads, Fp8Weights)
    for leaf in jax.tree.leaves(grads):
        assert not np.any(np.asarray(leaf, np.float32))


def test_pallas_interpreted_reads_the_cache():
    """The Mosaic GPU FP8 kernel (in its interpreter on CPU) takes the cache: forward only, in
    one kernel call, as each interpreted call costs ~5-10 s. The cache is of other weights
    (stale), so the output is within one bf16 ulp of the float64 product of the cached operands
    and far from the product of ``rhs``: the kernel computes from the cache, not from ``rhs``
    (bitwise equality with the uncached op: the XLA and reference backends above, the same
    ``Fp8Weights.forward_operand`` every backend reads). The dgrad reads the cache in code every
    backend shares (``Fp8Weights.dgrad_operand``, then the backend's ``scaled_gmm``, run here by
    the forward): bitwise for the XLA and reference backends above, K-major (the GPU's layout)
    in ``test_a_k_major_cache_is_bitwise_the_same_and_its_layout_is_checked``; the kernel's
    rowwise dgrad runs in tests/test_fp8_wgrad.py."""
    kernel = PallasMosaicScaledGroupedMatmul(
        tiles=MosaicTileConfig(64, 128, 128, stages=2, group_swizzle=2)
    )
    sizes = [70, 0, 50]  # an empty group, 8 rows past the last
    lhs, rhs, _ = (a[:128] if a.ndim == 2 else a[:3] for a in _operands(seed=4, k=128, n=128))
    stale_rhs = _operands(seed=5, groups=3, k=128, n=128)[1]
    stale = quantize_fp8_weights(stale_rhs, "rowwise", kernel)
    got = fp8_grouped_matmul(lhs, rhs, jnp.asarray(sizes), backend=kernel, rhs_fp8=stale)
    got = np.asarray(got.astype(jnp.float32), np.float64)
    lhs_q, lhs_scale = quantize(lhs, Fp8Recipe("rowwise").lhs_blocks)
    lhs64 = np.asarray(lhs_q.astype(jnp.float32), np.float64) * np.asarray(lhs_scale)

    def product64(rhs_q, rhs_scale):
        rhs64 = np.asarray(rhs_q.astype(jnp.float32), np.float64) * np.asarray(rhs_scale)
        out, start = np.zeros((lhs64.shape[0], rhs64.shape[2])), 0
        for g, size in enumerate(sizes):
            out[start : start + size] = lhs64[start : start + size] @ rhs64[g]
            start += size
        return out

    want = product64(*stale.forward_operand())
    assert np.all(np.abs(got - want) <= 2.0**-8 * np.abs(want) + 1e-30)
    fresh = product64(*quantize(rhs, Fp8Recipe("rowwise").rhs_blocks))
    assert np.max(np.abs(got - fresh)) > 0.1 * np.max(np.abs(fresh))


# ----------------------------------------------------------------------------- op errors


@dataclasses.dataclass(frozen=True)
class KMajorXla(XlaScaledGroupedMatmul):
    """The XLA backend asking for K-major weights (as the GPU kernel does): same values."""

    @property
    def k_major_weights(self) -> bool:
        return True


def _call_with(cache, recipe="rowwise", backend="xla", rhs=None):
    lhs, default_rhs, _ = _operands()
    rhs = default_rhs if rhs is None else rhs
    return fp8_grouped_matmul(
        lhs, rhs, jnp.asarray(SIZES), recipe=recipe, backend=backend, rhs_fp8=cache
    )


def test_a_k_major_cache_is_bitwise_the_same_and_its_layout_is_checked():
    """The GPU kernel's layout: forward, dgrad and wgrad read it bitwise as the uncached op."""
    lhs, rhs, dy = _operands()
    k_major = quantize_fp8_weights(rhs, "rowwise", KMajorXla())
    assert k_major.k_major
    _assert_trees_equal(
        _op_value_and_grads(lhs, rhs, dy, "rowwise", KMajorXla(), k_major),
        _op_value_and_grads(lhs, rhs, dy, "rowwise", "xla"),
    )
    with pytest.raises(ValueError, match=r"`rhs_fp8` was made for a backend reading K-major"):
        _call_with(k_major, backend="xla")


@pytest.mark.parametrize(
    "make_cache, match",
    [
        (
            lambda rhs: quantize_fp8_weights(rhs[:, :, :128], "rowwise", "xla"),
            r"`rhs_fp8`\.q must be float8_e4m3fn of shape \(4, 256, 160\)",
        ),
        (
            lambda rhs: quantize_fp8_weights(rhs[:3], "rowwise", "xla"),
            r"`rhs_fp8`\.q must be .* of shape \(4, 256, 160\) .*; got float8_e4m3fn \(3, 256",
        ),
        (
            lambda rhs: quantize_fp8_weights(rhs, "blockwise", "xla"),
            r"`rhs_fp8` was quantized with recipe Fp8Recipe\(name='blockwise'",
        ),
        (
            lambda rhs: quantize_fp8_weights(rhs, Fp8Recipe("rowwise", dtype=jnp.float8_e5m2)),
            r"`rhs_fp8` was quantized with recipe .*float8_e5m2",
        ),
        (
            lambda rhs: quantize(rhs, (1, None, 1)),
            r"`rhs_fp8` must be a jaxmoe\.ops\.fp8\.Fp8Weights or None; got tuple",
        ),
    ],
    ids=["narrower", "fewer_experts", "other_recipe", "other_fp8_format", "a_tuple"],
)
def test_a_mismatched_cache_is_refused_naming_rhs_fp8(make_cache, match):
    cache = make_cache(_operands()[1])
    with pytest.raises(ValueError, match=r"^fp8_grouped_matmul: " + match):
        _call_with(cache)
    with pytest.raises(ValueError, match=r"quantize_fp8_weights\(rhs, recipe, backend\)"):
        _call_with(cache)  # the fix


def test_a_cache_serves_either_weight_gradient_and_no_other_recipe():
    """The weight gradient's precision does not change the weights' FP8 operands: a cache made
    with one ``wgrad`` serves the others; another recipe is refused by name, also when the
    matmul's ``wgrad`` is one the cache's recipe could not take."""
    rhs = _operands()[1]
    cache = quantize_fp8_weights(rhs, Fp8Recipe("rowwise", wgrad="high"), "xla")
    want = _call_with(quantize_fp8_weights(rhs, Fp8Recipe("rowwise", wgrad="fp8"), "xla"))
    np.testing.assert_array_equal(_call_with(cache, recipe=Fp8Recipe("rowwise", wgrad="fp8")), want)
    blockwise = quantize_fp8_weights(rhs, "blockwise", "xla")
    with pytest.raises(ValueError, match=r"was quantized with recipe Fp8Recipe\(name='blockwise'"):
        _call_with(blockwise, recipe=Fp8Recipe("rowwise", wgrad="fp8"))


def test_quantize_fp8_weights_refuses_a_weight_that_is_not_g_k_n():
    with pytest.raises(ValueError, match=r"^quantize_fp8_weights: `rhs` must be a floating"):
        quantize_fp8_weights(jnp.ones((4, 8)))
    with pytest.raises(ValueError, match=r"^quantize_fp8_weights: `recipe` must be one of"):
        quantize_fp8_weights(jnp.ones((2, 4, 8)), "fp4")


# ----------------------------------------------------------------------------- the layer

LAYER = {"num_experts": 4, "top_k": 2, "hidden_size": 64, "ffn_size": 160}


def _layer_case(recipe="rowwise", **extra):
    """bf16 compute on float32 master weights: a cache made from the float32 weights (not the
    bf16 ones the layer quantizes) would differ, so the bitwise tests see the cast."""
    cfg = jaxmoe.MoEConfig(**LAYER, dtype=jnp.bfloat16, fp8_recipe=recipe, **extra)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (8, 8, LAYER["hidden_size"]), jnp.float32)
    return cfg, params, x


@functools.cache
def _jitted_layer_grads(cfg, mesh):
    """One jitted program per layer: a second cache of the same shapes (another weights') runs
    the traced program again instead of tracing and lowering it anew."""

    def loss(params, x, fp8_weights):
        y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh, fp8_weights=fp8_weights)
        return jnp.sum(y.astype(jnp.float32) ** 2) + stats.aux_loss, y

    return jit_xla_defaults(jax.grad(loss, argnums=(0, 1), has_aux=True))


def _layer_value_and_grads(cfg, params, x, fp8_weights=None, mesh=None):
    """``y`` and the gradients of ``params`` and ``x``; the cache a non-differentiated input."""
    grads, y = _jitted_layer_grads(cfg, mesh)(params, x, fp8_weights)
    return y, grads


def _quantize(params, cfg):
    return jit_xla_defaults(jaxmoe.quantize_expert_weights, static_argnums=1)(params, cfg)


@pytest.mark.parametrize(
    "recipe, capacity_factor",
    [("rowwise", None), ("blockwise", 1.0)],
    # Each recipe's cache and each dispatch once (the cache reaches the experts the same way
    # whatever the dispatch); the sharded test below compares with these two programs.
    ids=["rowwise-dropless", "blockwise-capacity"],
)
def test_layer_with_fp8_weights_is_bitwise_the_layer_without(recipe, capacity_factor):
    cfg, params, x = _layer_case(recipe, capacity_factor=capacity_factor)
    fp8 = _quantize(params, cfg)
    assert set(fp8) == {"w_gate", "w_up", "w_down"}
    assert all(isinstance(value, Fp8Weights) for value in fp8.values())
    want = _layer_value_and_grads(cfg, params, x)
    got = _layer_value_and_grads(cfg, params, x, fp8)
    _assert_trees_equal(got, want)
    assert got[1][0]["experts"]["w_up"].dtype == jnp.float32  # master weights' dtype


def test_layer_reads_the_cache():
    """A cache of other weights changes the output: the bitwise test above is not vacuous."""
    cfg, params, x = _layer_case()
    other = jaxmoe.init_params(jax.random.key(7), cfg)
    y, _ = _layer_value_and_grads(cfg, params, x, _quantize(other, cfg))
    want, _ = _layer_value_and_grads(cfg, params, x)
    assert not np.array_equal(np.asarray(y), np.asarray(want))


# Rowwise (the cache's most operands: forward and dgrad weights); the blockwise cache in a
# layer's gradients: test_layer_with_fp8_weights_is_bitwise_the_layer_without[blockwise-*].
@pytest.mark.parametrize("recipe", ["rowwise"])
def test_gradient_accumulation_reuses_one_cache_over_micro_batches(recipe):
    """One ``quantize_expert_weights`` before a ``lax.scan`` over 3 micro-batches: the summed
    gradients equal the sum of the micro-batches' gradients computed the normal way."""
    cfg, params, _ = _layer_case(recipe)
    micro_batches = jax.random.normal(jax.random.key(2), (3, 4, 16, LAYER["hidden_size"]))

    def loss(params, x, fp8_weights):
        y, stats = jaxmoe.moe(params, x, cfg, fp8_weights=fp8_weights)
        return jnp.sum(y.astype(jnp.float32) ** 2) + stats.aux_loss

    @jax.jit
    def accumulated(params, micro_batches):
        fp8 = jaxmoe.quantize_expert_weights(params, cfg)  # once per step

        def step(total, x):
            return jax.tree.map(jnp.add, total, jax.grad(loss)(params, x, fp8)), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        return jax.lax.scan(step, zeros, micro_batches)[0]

    per_batch = [jax.jit(jax.grad(loss))(params, x, None) for x in micro_batches]
    want = jax.tree.map(lambda *grads: grads[0] + grads[1] + grads[2], *per_batch)
    got = accumulated(params, micro_batches)
    for (path, g), w in zip(
        jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want), strict=True
    ):
        # One program against three: XLA may fuse the float32 sums differently (last bits).
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9, err_msg=jax.tree_util.keystr(path))
    assert np.any(np.asarray(got["experts"]["w_down"]))


def _mesh(shape, names):
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


@pytest.mark.parametrize(
    "recipe, capacity_factor, mesh_shape, data_axes, fsdp",
    [("rowwise", None, (2, 2), ("data",), True), ("blockwise", 1.0, (4,), (), False)],
    # Each recipe (its cache's leaves), each mesh (their specs) and each dispatch once: each
    # case compiles two ~8 s sharded programs; the one-device layers are the bitwise layer
    # test's (the same configs: one compile each). A capacity on the ep-only mesh, where it
    # counts the same tokens as one device (with data axes it counts one data shard's).
    ids=["rowwise-data2_ep2_fsdp", "blockwise-capacity-ep4"],
)
def test_sharded_layer_with_fp8_weights_equals_the_unsharded_layer(
    recipe, capacity_factor, mesh_shape, data_axes, fsdp
):
    """On 4 simulated devices, the cache of all experts split over ``ep``: bitwise the sharded
    layer without it, and the one-device layer up to the float32 order of the sharded sums. A
    cache of other weights changes the output: the cache reaches the experts inside
    ``shard_map`` (the bitwise comparison is not vacuous)."""
    names = (*data_axes, "ep")
    mesh = _mesh(mesh_shape, names)
    cfg, params, x = _layer_case(recipe, capacity_factor=capacity_factor)
    sharded = dataclasses.replace(cfg, ep_axis="ep", data_axes=data_axes, fsdp_expert_weights=fsdp)
    fp8 = _quantize(params, cfg)  # the one-device cache: the same values (checked below)
    got = _layer_value_and_grads(sharded, params, x, fp8, mesh)
    _assert_trees_equal(got, _layer_value_and_grads(sharded, params, x, None, mesh))
    y_one, grads_one = _layer_value_and_grads(cfg, params, x, fp8)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves((y_one, grads_one)), strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.max(np.abs(g - w)) <= 1e-2 * np.max(np.abs(w))
    other = _quantize(jaxmoe.init_params(jax.random.key(7), cfg), cfg)
    y_other, _ = _layer_value_and_grads(sharded, params, x, other, mesh)  # the same program
    assert not np.array_equal(np.asarray(y_other), np.asarray(got[0]))


# ----------------------------------------------------------------------------- layer errors


def test_fp8_weights_without_a_recipe_are_refused():
    cfg, params, x = _layer_case(None)
    fp8 = _quantize(params, dataclasses.replace(cfg, fp8_recipe="rowwise"))
    with pytest.raises(ValueError, match=r"^moe: `fp8_weights` needs MoEConfig\.fp8_recipe"):
        jaxmoe.moe(params, x, cfg, fp8_weights=fp8)
    with pytest.raises(
        ValueError, match=r"^quantize_expert_weights: `cfg` needs MoEConfig\.fp8_recipe"
    ):
        jaxmoe.quantize_expert_weights(params, cfg)


@pytest.mark.parametrize(
    "edit, match",
    [
        (
            lambda fp8, other: {k: v for k, v in fp8.items() if k != "w_gate"},
            r"`fp8_weights` must be a dict with one Fp8Weights per expert weight "
            r"\['w_down', 'w_gate', 'w_up'\]; got \['w_down', 'w_up'\]",
        ),
        (lambda fp8, other: list(fp8.values()), r"`fp8_weights` must be a dict .*; got list"),
        (
            lambda fp8, other: {**fp8, "w_up": other["w_up"]},
            r"`fp8_weights\['w_up'\]`\.q must be float8_e4m3fn of shape \(4, 64, 160\)",
        ),
        (
            lambda fp8, other: {**fp8, "w_down": other["w_down"]},
            r"`fp8_weights\['w_down'\]`\.q must be .* \(4, 160, 64\)",
        ),
    ],
    ids=["missing_weight", "not_a_dict", "other_ffn_size_up", "other_ffn_size_down"],
)
def test_a_mismatched_layer_cache_is_refused_naming_the_entry(edit, match):
    cfg, params, x = _layer_case()
    other_cfg = dataclasses.replace(cfg, ffn_size=96)
    other = _quantize(jaxmoe.init_params(jax.random.key(0), other_cfg), other_cfg)
    with pytest.raises(ValueError, match=r"^moe: " + match):
        jaxmoe.moe(params, x, cfg, fp8_weights=edit(_quantize(params, cfg), other))


def test_a_layer_cache_of_another_recipe_is_refused():
    cfg, params, x = _layer_case("rowwise")
    blockwise = _quantize(params, dataclasses.replace(cfg, fp8_recipe="blockwise"))
    with pytest.raises(
        ValueError,
        match=r"^moe: `fp8_weights\['w_down'\]` was quantized with recipe .*'blockwise'.* "
        r"jaxmoe\.quantize_expert_weights\(params, cfg\)",
    ):
        jaxmoe.moe(params, x, cfg, fp8_weights=blockwise)


# ----------------------------------------------------------------------------- Flax


def test_linen_module_takes_the_cache_as_a_call_argument():
    cfg, _, x = _layer_case()
    layer = MoELinen(cfg)
    # Jitted (init, the caches and apply): one program each, not op-by-op dispatch.
    variables = jax.jit(layer.init)(jax.random.key(0), x)
    quantize_jit = jax.jit(jaxmoe.quantize_expert_weights, static_argnums=1)
    fp8 = quantize_jit(nn.unbox(variables["params"]), cfg)
    apply = jax.jit(layer.apply)  # one program per cache argument
    without = apply(variables, x)
    _assert_trees_equal(apply(variables, x, fp8), without)
    other = quantize_jit(jaxmoe.init_params(jax.random.key(5), cfg), cfg)
    assert not np.array_equal(apply(variables, x, other)[0], without[0])


def test_nnx_module_takes_the_cache_as_a_call_argument():
    cfg, _, x = _layer_case("blockwise")
    layer = MoE(cfg, rngs=nnx.Rngs(0))
    # Jitted (the caches and the calls): one program each, not op-by-op dispatch.
    quantize_jit = jax.jit(jaxmoe.quantize_expert_weights, static_argnums=1)
    call = nnx.jit(lambda layer, x, fp8=None: layer(x, fp8))
    fp8 = quantize_jit(layer.params_tree(), cfg)
    without = call(layer, x)
    _assert_trees_equal(call(layer, x, fp8), without)
    other = quantize_jit(jaxmoe.init_params(jax.random.key(5), cfg), cfg)
    assert not np.array_equal(call(layer, x, other)[0], without[0])
