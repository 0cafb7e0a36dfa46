"""jaxmoe.hf against goldens made by transformers (tests/hf_golden/make_goldens.py): outputs,
input gradients and routing of every family's MoE block, the round trip back to the
checkpoint's tensors, sharded loading on 8 devices, and the refusals."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import jaxmoe
import jaxmoe.hf
from jaxmoe.hf import checkpoint as hf_checkpoint
from jaxmoe.router import route, router_logits

GOLDEN = os.path.join(os.path.dirname(__file__), "hf_golden")
CASES = sorted(
    name for name in os.listdir(GOLDEN) if os.path.isfile(os.path.join(GOLDEN, name, "config.json"))
)


def golden(case):
    path = os.path.join(GOLDEN, case, "golden.safetensors")
    with safe_open(path, "np") as file:
        layer = int(file.metadata()["layer"])
    return layer, load_file(path)


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))


def test_every_family_has_a_golden():
    assert set(CASES) == {
        "mixtral",
        "qwen3_moe",
        "qwen3_moe_no_norm",
        "olmoe",
        "deepseek_v3",
        "glm4_moe",
        "deepseek_v2",
        "qwen2_moe",
        "gpt_oss",
    }


def jaxmoe_outputs(cfg, params, inputs):
    """jaxmoe's block on a golden's ``hidden``: its ``output``, ``input_grad`` (of
    ``sum(output * loss_weights)``) and ``top_k_indices`` (each row sorted)."""
    x = jnp.asarray(inputs["hidden"])

    def loss(x):
        y, _ = jaxmoe.moe(params, x, cfg)
        return jnp.sum(y * inputs["loss_weights"]), y

    def routed(x):
        kernel, bias = params["router"]["kernel"], params["router"].get("bias")
        logits = router_logits(x.reshape(-1, cfg.hidden_size), kernel, bias)
        return route(logits, cfg, params.get("expert_bias")).experts

    # Compiled, not op by op: eager dispatch compiles each of the layer's ops on its own.
    (_, y), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(x)
    experts = jax.jit(routed)(x)
    return {
        "output": np.asarray(y),
        "input_grad": np.asarray(grad),
        "top_k_indices": np.sort(np.asarray(experts), -1),
    }


@pytest.mark.parametrize("case", CASES)
def test_layer_matches_transformers(case):
    layer, want = golden(case)
    cfg, params = jaxmoe.hf.load_moe_layer(os.path.join(GOLDEN, case), layer)
    got = jaxmoe_outputs(cfg, params, want)
    assert rel(got["output"], want["output"]) <= 1e-5
    assert rel(got["input_grad"], want["input_grad"]) <= 1e-5
    np.testing.assert_array_equal(got["top_k_indices"], want["top_k_indices"])


@pytest.mark.parametrize("case", CASES)
def test_state_dict_round_trip_is_bitwise(case):
    layer, _ = golden(case)
    directory = os.path.join(GOLDEN, case)
    cfg, params = jaxmoe.hf.load_moe_layer(directory, layer)
    back = jaxmoe.hf.moe_layer_state_dict(cfg, params, directory, layer)
    stored = load_file(os.path.join(directory, "model.safetensors"))
    assert sorted(back) == sorted(stored)
    for key, value in stored.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert back[key].tobytes() == value.tobytes(), key


def test_config_of_each_family():
    def config(case):
        return jaxmoe.hf.moe_config(os.path.join(GOLDEN, case))

    mixtral = config("mixtral")
    assert (mixtral.score, mixtral.pre_softmax, mixtral.normalize_weights) == ("softmax", 1, 1)
    assert (
        config("qwen3_moe").normalize_weights and not config("qwen3_moe_no_norm").normalize_weights
    )
    v3 = config("deepseek_v3")
    assert (v3.score, v3.num_groups, v3.group_top_k, v3.routed_scaling) == ("sigmoid", 4, 2, 2.5)
    assert v3.use_expert_bias and v3.num_shared_experts == 1 and v3.shared_ffn_size == 8
    v2 = config("deepseek_v2")
    assert (v2.normalize_weights, v2.routed_scaling, v2.effective_shared_ffn_size) == (0, 1.5, 16)
    assert config("glm4_moe").ep_axis is None
    assert jaxmoe.hf.moe_config(os.path.join(GOLDEN, "olmoe"), ep_axis="expert").ep_axis == "expert"
    qwen2 = config("qwen2_moe")
    assert (qwen2.score, qwen2.pre_softmax, qwen2.normalize_weights) == ("softmax", 1, 0)
    assert (qwen2.num_shared_experts, qwen2.shared_ffn_size, qwen2.shared_expert_gate) == (1, 12, 1)
    normed = {
        **json.load(open(os.path.join(GOLDEN, "qwen2_moe", "config.json"))),
        "norm_topk_prob": True,
    }
    assert jaxmoe.hf.moe_config(normed).normalize_weights
    oss = config("gpt_oss")
    assert (oss.score, oss.pre_softmax, oss.normalize_weights) == ("softmax", 0, 0)
    assert oss.router_bias and oss.expert_ffn_bias and not oss.num_shared_experts
    assert (oss.activation, oss.swiglu_alpha, oss.swiglu_limit) == ("swiglu_clamped", 1.25, 0.15)
    defaults = json.load(open(os.path.join(GOLDEN, "gpt_oss", "config.json")))
    del defaults["swiglu_alpha"], defaults["swiglu_limit"]  # older configs: the model's constants
    older = jaxmoe.hf.moe_config(defaults)
    assert (older.swiglu_alpha, older.swiglu_limit) == (1.702, 7.0)


def test_dense_layers_of_each_family():
    def dense(case):
        hf = os.path.join(GOLDEN, case)
        count = json.load(open(os.path.join(hf, "config.json")))["num_hidden_layers"]
        return [i for i in range(count) if not jaxmoe.hf.is_moe_layer(hf, i)]

    assert dense("qwen3_moe") == dense("qwen2_moe") == [0]  # mlp_only_layers
    assert dense("qwen3_moe_no_norm") == [0]  # decoder_sparse_step=2
    assert dense("deepseek_v3") == dense("glm4_moe") == [0]  # first_k_dense_replace
    assert dense("mixtral") == dense("olmoe") == dense("gpt_oss") == []


# ----------------------------------------------------------------------------- sharded loading


def _copy(case, tmp_path):
    target = tmp_path / case
    shutil.copytree(os.path.join(GOLDEN, case), target)
    return target


def _shard(directory, files=2):
    """Rewrites ``directory``'s model.safetensors as ``files`` shards with an index."""
    tensors = load_file(directory / "model.safetensors")
    os.remove(directory / "model.safetensors")
    keys = sorted(tensors)
    weight_map = {}
    for i in range(files):
        name = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        part = {k: tensors[k] for k in keys[i::files]}
        save_file(part, directory / name, {"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


def record_reads(monkeypatch) -> list:
    """``(key, index)`` of every ``CheckpointFiles.read`` from now on."""
    reads = []
    original = hf_checkpoint.CheckpointFiles.read

    def spy(self, key, index=None):
        reads.append((key, index))
        return original(self, key, index)

    monkeypatch.setattr(hf_checkpoint.CheckpointFiles, "read", spy)
    return reads


def _assert_sharded_equal(sharded, params):
    """Same arrays; every expert leaf (biases too) E-sharded, device d holding expert d."""
    for path, value in jax.tree_util.tree_flatten_with_path(params)[0]:
        got = sharded
        for entry in path:
            got = got[entry.key]
        np.testing.assert_array_equal(np.asarray(got), np.asarray(value))
        if path[0].key == "experts":
            assert got.sharding.spec[0] == "expert"
            for shard in got.addressable_shards:  # device d holds expert d (E=8 over 8)
                assert shard.index[0] == slice(shard.device.id, shard.device.id + 1)


@pytest.mark.parametrize("case", ["qwen3_moe", "deepseek_v3"])
def test_mesh_load_equals_unsharded_and_reads_own_experts(case, tmp_path, monkeypatch):
    directory = _copy(case, tmp_path)
    _shard(directory)
    layer, want = golden(case)
    cfg, params = jaxmoe.hf.load_moe_layer(directory, layer)
    reads = record_reads(monkeypatch)
    mesh = jax.make_mesh((8,), ("expert",))
    sharded_cfg, sharded = jaxmoe.hf.load_moe_layer(directory, layer, mesh=mesh)
    assert sharded_cfg.ep_axis == "expert"
    _assert_sharded_equal(sharded, params)
    expert_reads = [key for key, index in reads if ".experts." in key]
    # Every expert tensor is read exactly once, by the callback of the device that holds it.
    assert sorted(expert_reads) == sorted(set(expert_reads)) and len(expert_reads) == 8 * 3
    tiled = np.tile(want["hidden"], (4, 1, 1))  # a batch of 8: one sequence per device
    y, _ = jax.jit(lambda params, x: jaxmoe.moe(params, x, sharded_cfg, mesh=mesh))(
        sharded, jnp.asarray(tiled)
    )
    assert rel(y, np.tile(want["output"], (4, 1, 1))) <= 1e-5


def test_mesh_callbacks_read_only_their_expert_rows(tmp_path, monkeypatch):
    directory = _copy("mixtral", tmp_path)
    asked = {}
    original = jaxmoe.hf.layer._read_expert_block

    def spy(files, keys, index, dtype):
        block = original(files, keys, index, dtype)
        asked.setdefault(keys[0], []).append(index[0].indices(len(keys))[:2])
        return block

    monkeypatch.setattr(jaxmoe.hf.layer, "_read_expert_block", spy)
    mesh = jax.make_mesh((2, 4), ("data", "expert"))
    cfg, params = jaxmoe.hf.load_moe_layer(directory, 0, mesh=mesh, ep_axis="expert")
    for rows in asked.values():  # each of the 4 expert ranks' 2 experts, once per data replica
        assert sorted(rows) == sorted([(2 * r, 2 * r + 2) for r in range(4)] * 2)


def test_gpt_oss_mesh_load_shards_expert_biases_and_reads_own_experts(tmp_path, monkeypatch):
    directory = _copy("gpt_oss", tmp_path)
    _shard(directory)
    layer, want = golden("gpt_oss")
    cfg, params = jaxmoe.hf.load_moe_layer(directory, layer)
    reads = record_reads(monkeypatch)
    mesh = jax.make_mesh((8,), ("expert",))
    sharded_cfg, sharded = jaxmoe.hf.load_moe_layer(directory, layer, mesh=mesh)
    _assert_sharded_equal(sharded, params)
    assert set(sharded["experts"]) == {"w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"}
    # Each device reads only its own expert of the stacked tensors: the gate and up halves of
    # gate_up_proj(_bias) once each, down_proj(_bias) once.
    expert_reads = [(key, index[0]) for key, index in reads if ".experts." in key]
    per_expert = {name: 2 if "gate_up" in name else 1 for name in ("gate_up_proj", "down_proj")}
    want_reads = [
        (f"model.layers.0.mlp.experts.{name}{suffix}", slice(e, e + 1))
        for name, count in per_expert.items()
        for suffix in ("", "_bias")
        for e in range(8)
        for _ in range(count)
    ]
    assert sorted(expert_reads, key=str) == sorted(want_reads, key=str)
    tiled = np.tile(want["hidden"], (4, 1, 1))
    y, _ = jax.jit(lambda params, x: jaxmoe.moe(params, x, sharded_cfg, mesh=mesh))(
        sharded, jnp.asarray(tiled)
    )
    assert rel(y, np.tile(want["output"], (4, 1, 1))) <= 1e-5


# ----------------------------------------------------------------------------- refusals


def _edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def test_refuses_missing_and_dense_layers():
    with pytest.raises(ValueError, match=r"`layer` must be an int in \[0, 2\)"):
        jaxmoe.hf.load_moe_layer(os.path.join(GOLDEN, "deepseek_v3"), 2)
    with pytest.raises(ValueError, match="layer 0 .* dense MLP layer"):
        jaxmoe.hf.load_moe_layer(os.path.join(GOLDEN, "deepseek_v3"), 0)
    with pytest.raises(ValueError, match="layer 0 .* dense MLP layer"):
        jaxmoe.hf.moe_layer_state_dict(None, None, os.path.join(GOLDEN, "qwen3_moe"), 0)


def test_refuses_other_families():
    with pytest.raises(ValueError, match="model_type must be one of"):
        jaxmoe.hf.moe_config({"model_type": "llama"})


@pytest.mark.parametrize(
    "case, changes, match",
    [
        ("mixtral", {"router_jitter_noise": 0.1}, "Mixtral with router_jitter_noise"),
        ("mixtral", {"hidden_act": "gelu"}, "Mixtral with hidden_act"),
        ("deepseek_v3", {"num_experts_per_tok": 2}, "DeepSeek-V3 with num_experts_per_tok"),
        ("deepseek_v3", {"moe_layer_freq": 2}, "DeepSeek-V3 with moe_layer_freq"),
        ("deepseek_v3", {"scoring_func": "softmax"}, "DeepSeek-V3 with scoring_func"),
        ("glm4_moe", {"topk_method": "greedy"}, "GLM-4.5-MoE with topk_method"),
        (
            "deepseek_v2",
            {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2},
            "DeepSeek-V2 with topk_method='group_limited_greedy'",
        ),
        ("deepseek_v2", {"norm_topk_prob": True}, "DeepSeek-V2 with norm_topk_prob"),
        (
            "qwen2_moe",
            {"shared_expert_intermediate_size": 0},
            "Qwen2-MoE with shared_expert_intermediate_size=0",
        ),
        (
            "deepseek_v3",
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
            "DeepSeek-V3 with quantization_config.quant_method='fp8'",
        ),
        (
            "gpt_oss",
            {"quantization_config": {"quant_method": "bitsandbytes"}},
            "gpt-oss with quantization_config.quant_method='bitsandbytes'",
        ),
    ],
)
def test_refuses_options_it_cannot_express(case, changes, match):
    config = json.load(open(os.path.join(GOLDEN, case, "config.json")))
    with pytest.raises(ValueError, match=match):
        jaxmoe.hf.moe_config({**config, **changes})


def test_refuses_overriding_the_models_fields():
    with pytest.raises(ValueError, match=r"\['top_k'\] come from the OLMoE config.json"):
        jaxmoe.hf.moe_config(os.path.join(GOLDEN, "olmoe"), top_k=1)


def _no_bulk_reads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read before the checks")

    monkeypatch.setattr(hf_checkpoint.CheckpointFiles, "read", refuse)


def test_refuses_shape_disagreeing_with_config_before_reading(tmp_path, monkeypatch):
    directory = _copy("olmoe", tmp_path)
    _edit_config(directory, intermediate_size=4)
    _no_bulk_reads(monkeypatch)
    with pytest.raises(ValueError, match=r"experts.0.gate_proj.weight' has shape \[8, 32\] but"):
        jaxmoe.hf.load_moe_layer(directory, 0)


def test_refuses_missing_shard_and_missing_tensor_before_reading(tmp_path, monkeypatch):
    directory = _copy("glm4_moe", tmp_path)
    _shard(directory)
    os.remove(directory / "model-00002-of-00002.safetensors")
    _no_bulk_reads(monkeypatch)
    with pytest.raises(ValueError, match="shard 'model-00002-of-00002.safetensors' .* missing"):
        jaxmoe.hf.load_moe_layer(directory, 1)
    single = _copy("olmoe", tmp_path)
    _edit_config(single, num_experts=16, num_experts_per_tok=2)
    with pytest.raises(ValueError, match="no tensor 'model.layers.0.mlp.experts.8.gate_proj"):
        jaxmoe.hf.load_moe_layer(single, 0)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text((single / "config.json").read_text())
    with pytest.raises(ValueError, match="has neither model.safetensors.index.json nor"):
        jaxmoe.hf.load_moe_layer(tmp_path / "empty", 0)


def test_state_dict_refuses_a_foreign_config():
    cfg, params = jaxmoe.hf.load_moe_layer(os.path.join(GOLDEN, "qwen3_moe"), 1)
    with pytest.raises(ValueError, match="cfg.top_k is 2 but the Qwen3-MoE config.json gives 3"):
        jaxmoe.hf.moe_layer_state_dict(cfg, params, os.path.join(GOLDEN, "qwen3_moe_no_norm"), 1)


def test_dtype_casts_params_but_keeps_the_selection_bias_float32():
    cfg, params = jaxmoe.hf.load_moe_layer(
        os.path.join(GOLDEN, "deepseek_v3"), 1, dtype=jnp.bfloat16
    )
    assert cfg.dtype == cfg.param_dtype == jnp.bfloat16
    assert params["experts"]["w_up"].dtype == params["shared"]["w_down"].dtype == jnp.bfloat16
    assert params["expert_bias"].dtype == jnp.float32
