"""FP8 rows on the expert-parallel wire (``MoEConfig(ep_fp8_dispatch=True)``), 8 CPU devices.

The layer that quantizes each token before the exchange equals, bit for bit, the layer that
quantizes after it (forward and every gradient), on a (2, 4) and a (1, 8) mesh, for both
dispatches, both recipes and the overflow windows; and the dispatch's bytes on the wire, read
from the HLO, are at most 0.55x of bf16's, the whole forward's at most 0.8x.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_parallel import MESHES

import jaxmoe
from jaxmoe.bench.wire_bytes import collectives, wire_bytes
from jaxmoe.ops.fp8 import Fp8Recipe
from jaxmoe.parallel import fp8_wire

HIDDEN = 128  # a multiple of the blockwise recipe's 128


def _config(**kwargs):
    base = dict(
        num_experts=16,
        top_k=4,
        hidden_size=HIDDEN,
        ffn_size=64,
        ep_axis="ep",
        dtype=jnp.bfloat16,
        fp8_recipe="rowwise",
        alignment=1,
    )
    return jaxmoe.MoEConfig(**{**base, **kwargs})


def test_config_rules_name_the_fix():
    with pytest.raises(
        ValueError, match=r"ep_fp8_dispatch.*needs fp8_recipe.*fp8_recipe='rowwise'"
    ):
        _config(ep_fp8_dispatch=True, fp8_recipe=None)
    with pytest.raises(ValueError, match=r"ep_fp8_dispatch.*needs ep_axis.*Set ep_axis"):
        _config(ep_fp8_dispatch=True, ep_axis=None)
    with pytest.raises(ValueError, match=r"ep_fp8_dispatch.*wgrad='fp8'.*wgrad='high'"):
        _config(ep_fp8_dispatch=True, fp8_recipe=Fp8Recipe("rowwise", wgrad="fp8"))
    with pytest.raises(ValueError, match="ep_fp8_dispatch: must be a bool"):
        _config(ep_fp8_dispatch="yes")
    assert _config(ep_fp8_dispatch=True).ep_fp8_dispatch


def test_packed_rows_round_trip():
    """Packing is lossless: the bytes unpack to ``quantize``'s pair, bit for bit."""
    x = jax.random.normal(jax.random.key(0), (5, 256), jnp.bfloat16) * 3
    for name in ("rowwise", "blockwise"):
        recipe = Fp8Recipe(name)
        packed = fp8_wire.pack_rows(x, recipe)
        assert packed.shape == (5, fp8_wire.row_bytes(256, recipe)) and packed.dtype == jnp.uint8
        q, scale = fp8_wire.unpack_rows(packed, 256, recipe)
        want_q, want_scale = jaxmoe.ops.fp8.quantize(x, recipe.lhs_blocks, recipe.dtype)
        np.testing.assert_array_equal(q.view(jnp.uint8), want_q.view(jnp.uint8))
        np.testing.assert_array_equal(scale, want_scale)
    assert fp8_wire.row_bytes(256, Fp8Recipe("rowwise")) == 260
    assert fp8_wire.row_bytes(256, Fp8Recipe("blockwise")) == 264


def _value_and_grads(cfg, params, x, cotangent, mesh):
    def loss(params, x):
        y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh)
        return jnp.sum(y.astype(jnp.float32) * cotangent), (y, stats)

    return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)


@pytest.mark.parametrize(
    "mesh_name,dispatch,recipe,factor",
    # Each mesh, dispatch and recipe once, the overflow windows running in both (1.0: the fast
    # window runs first, the code that worst-case slots run alone). The recipe only reaches
    # fp8_wire's packing, which both dispatches call alike, and the mesh only the ep groups;
    # merged away: data2_ep4/copies/rowwise with worst-case slots (its one window is the fast
    # window of ep8/copies/rowwise), ep8/copies/blockwise (blockwise rows on the wire:
    # data2_ep4/tokens/blockwise), ep8/tokens/rowwise (the tokens path on ep8: its windows are
    # data2_ep4/tokens' in one ep group; rowwise rows: ep8/copies/rowwise).
    [
        ("data2_ep4", "tokens", "blockwise", 1.0),
        ("ep8", "copies", "rowwise", 1.0),
    ],
)
def test_fp8_wire_is_bitwise_the_layer_that_quantizes_after_the_exchange(
    mesh_name, dispatch, recipe, factor
):
    mesh, data_axes = MESHES[mesh_name]
    cfg = _config(
        data_axes=data_axes, ep_dispatch=dispatch, fp8_recipe=recipe, ep_fast_slot_factor=factor
    )
    keys = jax.random.split(jax.random.key(1), 3)
    params = jaxmoe.init_params(keys[0], cfg)
    x = jax.random.normal(keys[1], (8, 8, HIDDEN), jnp.float32)
    cotangent = jax.random.normal(keys[2], x.shape, jnp.float32)
    after = _value_and_grads(cfg, params, x, cotangent, mesh)
    before = _value_and_grads(
        dataclasses.replace(cfg, ep_fp8_dispatch=True), params, x, cotangent, mesh
    )
    (grads, (y, stats)), (ref_grads, (ref_y, ref_stats)) = before, after
    np.testing.assert_array_equal(y, ref_y)
    for path, grad in jax.tree_util.tree_flatten_with_path(grads)[0]:
        ref = dict(jax.tree_util.tree_flatten_with_path(ref_grads)[0])[path]
        np.testing.assert_array_equal(grad, ref, err_msg=jax.tree_util.keystr(path))
    assert int(stats.overflow_tokens) == int(ref_stats.overflow_tokens)
    assert (int(stats.overflow_tokens) > 0) == (factor is not None)  # the windows ran
    assert np.all(np.isfinite(np.asarray(grads[1], np.float32)))


def test_auto_wgrad_is_high_precision_on_the_fp8_wire(monkeypatch):
    """Only the rows' FP8 copies cross the wire, so there ``wgrad="auto"`` runs the
    high-precision weight gradient even where it would pick FP8 (here: every width), bit for bit
    ``wgrad="high"``; and a weight cache made for the config serves that layer."""
    from jaxmoe.ops.fp8 import recipe as recipe_module

    monkeypatch.setattr(recipe_module, "AUTO_FP8_WGRAD_MIN_WIDTH", 1)
    mesh, data_axes = MESHES["ep4"]
    cfg = _config(data_axes=data_axes, ep_fp8_dispatch=True)
    assert cfg.fp8_recipe == "rowwise" and Fp8Recipe(cfg.fp8_recipe).fp8_wgrad(HIDDEN, 64)
    keys = jax.random.split(jax.random.key(1), 3)
    params = jaxmoe.init_params(keys[0], cfg)
    x = jax.random.normal(keys[1], (8, 8, HIDDEN), jnp.float32)
    cotangent = jax.random.normal(keys[2], x.shape, jnp.float32)
    # Made with wgrad="auto"; jitted: one program, not op-by-op dispatch.
    fp8_weights = jax.jit(jaxmoe.quantize_expert_weights, static_argnums=1)(params, cfg)

    def grads(layer_cfg):
        def loss(params, x):
            y, _ = jaxmoe.moe(params, x, layer_cfg, mesh=mesh, fp8_weights=fp8_weights)
            return jnp.sum(y.astype(jnp.float32) * cotangent)

        return jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)

    got = grads(cfg)
    want = grads(dataclasses.replace(cfg, fp8_recipe=Fp8Recipe("rowwise", wgrad="high")))
    for (path, grad), ref in zip(
        jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want), strict=True
    ):
        np.testing.assert_array_equal(grad, ref, err_msg=jax.tree_util.keystr(path))


def _lowered_forward(cfg, mesh, tokens_per_rank=32):
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jnp.ones((mesh.size * tokens_per_rank, cfg.hidden_size), jnp.bfloat16)
    return jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg, mesh=mesh)[0]).lower(params, x)


def _hlo(lowered):
    return lowered.as_text(dialect="hlo", debug_info=True)


@pytest.mark.parametrize(
    "dispatch,recipe",
    [("copies", "rowwise"), ("copies", "blockwise"), ("tokens", "rowwise")],
)
def test_fp8_wire_bytes_against_bf16(dispatch, recipe):
    """Mixtral-like (K=2 of E=8, H=256) for the copies; K=4 of E=16 for the pairs (K=2 of E=8
    at EP=8 is one local expert: "tokens" runs the copies path). The lowered HLO is read: the
    CPU compiler runs bf16 collectives in float32, which would double bf16's bytes; the FP8
    rows are bytes (uint8), the same in the compiled text."""
    mesh, _ = MESHES["ep8"]
    experts, top_k = (8, 2) if dispatch == "copies" else (16, 4)
    cfg = _config(
        num_experts=experts,
        top_k=top_k,
        hidden_size=256,
        ffn_size=128,
        fp8_recipe=recipe,
        ep_dispatch=dispatch,
    )
    bf16 = _hlo(_lowered_forward(cfg, mesh))  # lowered only: its compiled text is not read
    fp8_lowered = _lowered_forward(dataclasses.replace(cfg, ep_fp8_dispatch=True), mesh)
    fp8 = _hlo(fp8_lowered)
    dispatch_ratio = wire_bytes(fp8, "ep_dispatch") / wire_bytes(bf16, "ep_dispatch")
    forward_ratio = wire_bytes(fp8) / wire_bytes(bf16)
    assert dispatch_ratio <= 0.55, dispatch_ratio
    assert forward_ratio <= 0.8, forward_ratio
    # The FP8 rows travel as bytes: a packed [ep, P, H + 4S] uint8 exchange, which the CPU
    # compiler leaves as it is (so the compiled text counts the same FP8 dispatch bytes). That
    # is the compiler's handling of a uint8 all-to-all, whatever the dispatch or the recipe
    # packed it: compiled in one case (a compile of the token dispatch's forward costs more
    # than the rest of its case).
    row = fp8_wire.row_bytes(256, Fp8Recipe(recipe))
    sent = [c for c in collectives(fp8) if c.scope == "ep_dispatch" and c.op == "all-to-all"]
    assert max(c.operand_bytes for c in sent) % row == 0, (sent, row)
    if (dispatch, recipe) == ("copies", "rowwise"):
        fp8_compiled = fp8_lowered.compile().as_text()
        assert wire_bytes(fp8_compiled, "ep_dispatch") == wire_bytes(fp8, "ep_dispatch")
    print(f"{dispatch} {recipe}: dispatch {dispatch_ratio:.3f}x, forward {forward_ratio:.3f}x")
