"""Wrong arguments to ``init_params``, ``jaxmoe.nn.MoE`` and ``jaxmoe.nn.MoELinen`` raise our
TypeError / ValueError naming the argument (and, for parameters of another size, the leaf, both
shapes and the config field), before anything is traced; the key forms that work stay accepted."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxmoe
import jaxmoe.nn

CFG = jaxmoe.MoEConfig(num_experts=8, top_k=2, hidden_size=16, ffn_size=8)
X = jnp.ones((2, 4, CFG.hidden_size))


def test_int_key_names_key_and_suggests_a_key():
    with pytest.raises(TypeError, match=r"init_params: `key`.*got a int.*jax\.random\.key\(0\)"):
        jaxmoe.init_params(0, CFG)


@pytest.mark.parametrize(
    "key", [None, [0, 0], jnp.zeros(2), jnp.zeros(2, jnp.int32)], ids=["none", "list", "f32", "i32"]
)
def test_non_key_values_name_key(key):
    with pytest.raises(TypeError, match="init_params: `key` must be a jax PRNG key"):
        jaxmoe.init_params(key, CFG)


def test_several_typed_keys_name_key():
    keys = jax.random.split(jax.random.key(0), 3)
    with pytest.raises(ValueError, match=r"`key` must be a single PRNG key.*shape \(3,\)"):
        jaxmoe.init_params(keys, CFG)


@pytest.mark.parametrize("shape", [(4,), (3, 2)])
def test_raw_key_data_of_another_shape_names_key(shape):
    with pytest.raises(
        ValueError, match=rf"`key` as raw uint32 key data.*got shape {re.escape(str(shape))}"
    ):
        jaxmoe.init_params(jnp.zeros(shape, jnp.uint32), CFG)


def test_accepted_keys_give_the_same_parameters():
    """Legacy uint32 keys (jax or NumPy) worked before the check and still do; a traced key
    (under jit and vmap) passes the check by its shape and dtype."""
    typed = jaxmoe.init_params(jax.random.key(0), CFG)
    legacy = jaxmoe.init_params(jax.random.PRNGKey(0), CFG)
    legacy_np = jaxmoe.init_params(np.asarray(jax.random.PRNGKey(0)), CFG)
    jitted = jax.jit(lambda k: jaxmoe.init_params(k, CFG))(jax.random.key(0))
    batched = jax.vmap(lambda k: jaxmoe.init_params(k, CFG))(jax.random.split(jax.random.key(0)))
    for tree in (legacy, legacy_np):
        for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(typed), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(jitted), jax.tree.leaves(typed), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    assert batched["experts"]["w_up"].shape == (2, *typed["experts"]["w_up"].shape)


def test_dict_config_names_cfg():
    with pytest.raises(
        TypeError,
        match=r"init_params: `cfg` must be a jaxmoe\.MoEConfig; got a "
        r"dict\. Build it with jaxmoe\.MoEConfig\(\*\*that_mapping\)",
    ):
        jaxmoe.init_params(jax.random.key(0), dataclasses.asdict(CFG))


def test_nnx_dict_config_names_cfg():
    with pytest.raises(TypeError, match=r"jaxmoe\.nn\.MoE: `cfg` must be a jaxmoe\.MoEConfig"):
        jaxmoe.nn.MoE(dataclasses.asdict(CFG), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("rngs", [0, jax.random.key(0)], ids=["int", "key"])
def test_nnx_rngs_not_rngs_names_rngs(rngs):
    with pytest.raises(
        TypeError,
        match=r"jaxmoe\.nn\.MoE: `rngs` must be a flax\.nnx\.Rngs.*"
        r"nnx\.Rngs\(0\)",
    ):
        jaxmoe.nn.MoE(CFG, rngs=rngs)


def test_nnx_mesh_not_a_mesh_names_mesh():
    with pytest.raises(TypeError, match=r"jaxmoe\.nn\.MoE: `mesh` must be a jax\.sharding\.Mesh"):
        jaxmoe.nn.MoE(CFG, rngs=nnx.Rngs(0), mesh="ep")


def test_nnx_mesh_that_does_not_divide_the_experts_names_the_axis():
    cfg = dataclasses.replace(CFG, ep_axis="ep")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:3]), ("ep",))
    with pytest.raises(
        ValueError,
        match=r"num_experts: must be divisible by the size of ep_axis "
        r"'ep' \(3\); got 8",
    ):
        jaxmoe.nn.MoE(cfg, rngs=nnx.Rngs(0), mesh=mesh)


@pytest.mark.parametrize("cfg", [None, {"num_experts": 8}], ids=["none", "dict"])
def test_linen_bad_config_names_cfg_at_construction(cfg):
    with pytest.raises(TypeError, match=r"MoELinen: `cfg` must be a jaxmoe\.MoEConfig"):
        jaxmoe.nn.MoELinen(cfg)


def test_linen_mesh_not_a_mesh_names_mesh():
    with pytest.raises(TypeError, match=r"MoELinen: `mesh` must be a jax\.sharding\.Mesh"):
        jaxmoe.nn.MoELinen(CFG, mesh="ep")


@pytest.mark.parametrize(
    ("change", "leaf", "field"),
    [
        ({"ffn_size": 16}, r"\['experts'\]\['w_down'\]", r"axis 1 is 16 \(MoEConfig\.ffn_size\)"),
        (
            {"num_experts": 4},
            r"\['experts'\]\['w_down'\]",
            r"axis 0 is 4 \(MoEConfig\.num_experts\)",
        ),
    ],
    ids=["ffn_size", "num_experts"],
)
def test_linen_apply_with_variables_of_another_size_names_leaf_shapes_and_field(
    change, leaf, field
):
    variables = jaxmoe.nn.MoELinen(CFG).init(jax.random.key(0), X)
    other = jaxmoe.nn.MoELinen(dataclasses.replace(CFG, **change))
    with pytest.raises(
        ValueError,
        match=rf"MoELinen\.apply: params{leaf} has shape .*, expected "
        rf".*{field}, these params have",
    ):
        other.apply(variables, X)


def test_linen_apply_without_variables_names_the_missing_leaf():
    with pytest.raises(
        ValueError,
        match=r"MoELinen\.apply: params\['experts'\]\['w_down'\] is "
        "missing",
    ):
        jaxmoe.nn.MoELinen(CFG).apply({}, X)


def test_linen_apply_with_matching_variables_still_runs():
    layer = jaxmoe.nn.MoELinen(CFG)
    variables = layer.init(jax.random.key(0), X)
    y, _ = jax.jit(layer.apply)(variables, X)
    assert y.shape == X.shape


def test_moe_params_of_another_config_name_the_field():
    params = jaxmoe.init_params(jax.random.key(0), CFG)
    shared = dataclasses.replace(CFG, num_shared_experts=1)
    with_shared = jaxmoe.init_params(jax.random.key(0), shared)
    with pytest.raises(
        ValueError,
        match=r"moe: params\['experts'\]\['w_down'\] has shape \(8, 8, 16\), expected "
        r"\(4, 8, 16\).*axis 0 is 4 \(MoEConfig\.num_experts\), these params have 8",
    ):
        jaxmoe.moe(params, X, dataclasses.replace(CFG, num_experts=4, top_k=2))
    wider = dataclasses.replace(shared, shared_ffn_size=32)
    with pytest.raises(
        ValueError,
        match=r"params\['shared'\]\['w_down'\].*axis 0 is 32 "
        r"\(MoEConfig\.shared_ffn_size, or ffn_size \* num_shared_experts",
    ):
        jaxmoe.moe(with_shared, X, wider)
