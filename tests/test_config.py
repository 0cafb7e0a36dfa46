"""MoEConfig validation and moe()'s input checks: ValueError naming the offending field."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe import layer_body
from jaxmoe.ops.mosaic import tiles as pallas_mosaic_tiles

BASE = {"num_experts": 8, "top_k": 2, "hidden_size": 16, "ffn_size": 32}

INVALID = [
    # (field named in the message, overrides)
    ("top_k", {"top_k": 0}),
    ("top_k", {"top_k": 9}),
    ("top_k", {"top_k": 1.5}),
    ("num_experts", {"num_experts": 0}),
    ("num_experts", {"num_experts": -4}),
    ("hidden_size", {"hidden_size": 0}),
    ("ffn_size", {"ffn_size": -1}),
    ("ffn_size", {"ffn_size": True}),
    ("num_groups", {"num_groups": 3}),
    ("num_groups", {"num_groups": 0}),
    ("group_top_k", {"num_groups": 4, "group_top_k": 3}),  # does not divide top_k
    ("group_top_k", {"num_groups": 2, "top_k": 4, "group_top_k": 4}),  # > num_groups
    ("group_top_k", {"num_groups": 4, "group_top_k": 0}),
    ("group_top_k", {"num_groups": 8, "top_k": 4, "group_top_k": 1}),  # 4 per group > 1 expert
    ("score", {"score": "tanh"}),
    ("activation", {"activation": "swish"}),
    ("pre_softmax", {"score": "sigmoid", "pre_softmax": True}),
    ("use_expert_bias", {"use_expert_bias": True}),  # softmax
    ("capacity_factor", {"capacity_factor": 0.0}),
    ("capacity_factor", {"capacity_factor": -1.25}),
    ("capacity_factor", {"capacity_factor": float("nan")}),
    ("routed_scaling", {"routed_scaling": 0.0}),
    ("aux_loss_coef", {"aux_loss_coef": -0.1}),
    ("z_loss_coef", {"z_loss_coef": float("inf")}),
    ("num_shared_experts", {"num_shared_experts": -1}),
    ("shared_ffn_size", {"shared_ffn_size": 8}),  # without shared experts
    ("shared_ffn_size", {"num_shared_experts": 1, "shared_ffn_size": 0}),
    ("alignment", {"alignment": 0}),
    ("dtype", {"dtype": jnp.int32}),
    ("param_dtype", {"param_dtype": "not-a-dtype"}),
    ("data_axes", {"ep_axis": "expert", "data_axes": ("data", "expert")}),
    ("data_axes", {"data_axes": ("data", "data")}),
    ("ep_receive_factor", {"ep_receive_factor": 0.0}),
    ("ep_fast_slot_factor", {"ep_fast_slot_factor": 0.9}),
    ("ep_fast_slot_factor", {"ep_fast_slot_factor": float("inf")}),
    ("ep_fast_slot_factor", {"ep_fast_slot_factor": "1.5"}),
    ("ep_chunks", {"ep_chunks": 0}),
    ("ep_chunks", {"ep_chunks": 2, "capacity_factor": 1.25}),
]


@pytest.mark.parametrize("field, overrides", INVALID, ids=[f"{f}-{o}" for f, o in INVALID])
def test_invalid_config_names_the_field(field, overrides):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        jaxmoe.MoEConfig(**{**BASE, **overrides})


VALID = [
    {},
    {"top_k": 8},
    {"top_k": 1, "score": "sigmoid"},
    {"num_groups": 4, "group_top_k": 2},
    {"num_groups": 4, "group_top_k": 1},
    {"num_groups": 8, "top_k": 4, "group_top_k": 4},
    {"score": "sqrtsoftplus", "use_expert_bias": True},
    {"pre_softmax": True, "normalize_weights": True},
    {"capacity_factor": 1.25},
    {"capacity_factor": 1},
    {"num_shared_experts": 2, "shared_ffn_size": 8},
    {"ep_axis": "expert", "data_axes": "data"},
    {"dtype": "bfloat16", "param_dtype": jnp.float32},
    {"alignment": 8, "grouped_matmul_backend": "xla"},
]


@pytest.mark.parametrize("overrides", VALID, ids=[str(v) for v in VALID])
def test_valid_configs_construct_and_hash(overrides):
    cfg = jaxmoe.MoEConfig(**{**BASE, **overrides})
    assert hash(cfg) == hash(jaxmoe.MoEConfig(**{**BASE, **overrides}))  # a static jit argument


def test_string_data_axes_become_a_tuple_and_dtypes_are_normalised():
    cfg = jaxmoe.MoEConfig(**BASE, data_axes="data", dtype="bfloat16")
    assert cfg.data_axes == ("data",)
    assert cfg.dtype == jnp.bfloat16


def test_capacity_formula():
    cfg = jaxmoe.MoEConfig(**BASE, capacity_factor=1.25)
    assert cfg.capacity(10) == 4  # ceil(1.25 * 10 * 2 / 8) = ceil(3.125)
    assert cfg.capacity(16) == 5  # ceil(5.0): exact products are not rounded up
    assert jaxmoe.MoEConfig(**BASE).capacity(10) is None


# ----------------------------------------------------------------------------- moe() inputs


@pytest.fixture(scope="module")
def layer():
    cfg = jaxmoe.MoEConfig(4, 2, 8, 16, use_expert_bias=True, score="sigmoid")
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (3, 8))
    return cfg, params, x


def test_valid_call(layer):
    cfg, params, x = layer
    y, _ = jaxmoe.moe(params, x, cfg)
    assert y.shape == x.shape


def test_wrong_hidden_size(layer):
    cfg, params, x = layer
    with pytest.raises(ValueError, match=r"`x`.*hidden_size=8"):
        jaxmoe.moe(params, jnp.ones((3, 7)), cfg)
    with pytest.raises(ValueError, match=r"`x`"):
        jaxmoe.moe(params, jnp.ones(()), cfg)


def test_integer_x(layer):
    cfg, params, _ = layer
    with pytest.raises(ValueError, match=r"`x`.*floating"):
        jaxmoe.moe(params, jnp.ones((3, 8), jnp.int32), cfg)


@pytest.mark.parametrize(
    "path, shape",
    [
        (("experts", "w_up"), (4, 8, 15)),
        (("experts", "w_down"), (3, 16, 8)),
        (("experts", "w_gate"), (4, 8)),
        (("router", "kernel"), (8, 5)),
        (("expert_bias",), (5,)),
    ],
)
def test_wrong_param_shape_names_the_leaf(layer, path, shape):
    cfg, params, x = layer
    params = jax.tree.map(lambda a: a, params)  # a copy
    node = params
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = jnp.zeros(shape)
    with pytest.raises(ValueError, match=rf"{path[-1]}.*shape"):
        jaxmoe.moe(params, x, cfg)


def test_missing_and_extra_leaves(layer):
    cfg, params, x = layer
    missing = {**params, "experts": {k: v for k, v in params["experts"].items() if k != "w_gate"}}
    with pytest.raises(ValueError, match=r"w_gate.*missing"):
        jaxmoe.moe(missing, x, cfg)
    no_bias = {k: v for k, v in params.items() if k != "expert_bias"}
    with pytest.raises(ValueError, match=r"expert_bias.*missing"):
        jaxmoe.moe(no_bias, x, cfg)
    extra = {**params, "shared": {"w_up": jnp.zeros((8, 16)), "w_down": jnp.zeros((16, 8))}}
    with pytest.raises(ValueError, match=r"shared"):
        jaxmoe.moe(extra, x, cfg)


def test_integer_params(layer):
    cfg, params, x = layer
    bad = {**params, "router": {"kernel": np.zeros((8, 4), np.int32)}}
    with pytest.raises(ValueError, match=r"kernel.*floating"):
        jaxmoe.moe(bad, x, cfg)


def test_ep_axis_without_mesh(layer):
    _, params, x = layer
    cfg = jaxmoe.MoEConfig(4, 2, 8, 16, use_expert_bias=True, score="sigmoid", ep_axis="expert")
    with pytest.raises(ValueError, match=r"ep_axis"):
        jaxmoe.moe(params, x, cfg)


def test_not_a_config(layer):
    _, params, x = layer
    with pytest.raises(ValueError, match=r"`cfg`"):
        jaxmoe.moe(params, x, {"num_experts": 4})


@pytest.mark.parametrize(
    "overrides, platform, hopper, want",
    [
        ({}, "cpu", False, 1),  # no padding off GPU
        ({}, "gpu", True, 64),  # the Mosaic kernels' measured padding
        ({"grouped_matmul_backend": "pallas"}, "gpu", True, 64),
        ({}, "gpu", False, 128),  # another GPU: the Triton kernels' row tile
        ({"grouped_matmul_backend": "pallas_triton"}, "gpu", True, 128),
        ({"fp8_recipe": "rowwise"}, "gpu", True, 128),  # FP8: measured with 128 only
        ({"alignment": 32}, "gpu", True, 32),  # the user's choice wins
    ],
)
def test_default_alignment_follows_the_kernels(monkeypatch, overrides, platform, hopper, want):
    monkeypatch.setattr(layer_body.jax, "default_backend", lambda: platform)
    monkeypatch.setattr(pallas_mosaic_tiles, "hopper_gpu", lambda: hopper)
    cfg = jaxmoe.MoEConfig(num_experts=4, top_k=2, hidden_size=8, ffn_size=16, **overrides)
    assert layer_body.resolve_alignment(cfg) == want
