"""The goldens re-checked against transformers itself, where torch and transformers are installed
(they are too heavy for the default test environment, which tests the goldens alone):

* the goldens are what the installed transformers computes from the golden weights, where its
  block computes the goldens' function (``make_goldens.FIRST_MATCHING_VERSION``: gpt-oss needs
  transformers >= 5.19); on an earlier version, that the difference is the one it names;
* regenerating them in memory (``make_goldens.make_case``) gives a config.json that jaxmoe reads
  as the committed one, and, when the library versions are those that made them, the committed
  files (initialisation and the config keys written can change between versions);
* the round trip ``load_moe_layer`` -> ``moe_layer_state_dict`` -> a Hub-layout checkpoint
  reloads into transformers with no missing or unexpected keys and the same outputs;
* a gpt-oss checkpoint with MXFP4 experts computes in jaxmoe what transformers computes after
  its own dequantizing load.
"""

import importlib.util
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from test_hf import jaxmoe_outputs  # noqa: E402
from test_hf_mxfp4 import mxfp4_values, pack_mxfp4  # noqa: E402

import jaxmoe.hf  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(__file__), "hf_golden")
_spec = importlib.util.spec_from_file_location(
    "make_goldens", os.path.join(GOLDEN, "make_goldens.py")
)
make_goldens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_goldens)
CASES = sorted(make_goldens.CASES)


def _golden(case):
    path = os.path.join(GOLDEN, case, "golden.safetensors")
    with safe_open(path, "np") as file:
        metadata = file.metadata()
    return int(metadata["layer"]), load_file(path), metadata


def _close(got, want, tolerance):
    for name in ("output", "input_grad"):
        error = np.max(np.abs(got[name] - want[name])) / np.max(np.abs(want[name]))
        assert error <= tolerance, (name, error)
    np.testing.assert_array_equal(got["top_k_indices"], want["top_k_indices"])


def _skip_where_another_function(case):
    reason = make_goldens.computes_another_function(case)
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize("case", CASES)
def test_goldens_are_what_transformers_computes(case, tmp_path):
    _skip_where_another_function(case)
    layer, want, _ = _golden(case)
    block = load_file(os.path.join(GOLDEN, case, "model.safetensors"))
    model, _ = make_goldens.reload_with_block(case, block, str(tmp_path))
    _close(make_goldens.block_outputs(model, layer, want), want, 1e-6)


@pytest.mark.parametrize("case", sorted(make_goldens.FIRST_MATCHING_VERSION))
def test_an_earlier_transformers_differs_only_as_said(case, tmp_path):
    """Where the installed transformers predates the first version that computes a case's
    goldens: its block misses them, and aligned as ``FIRST_MATCHING_VERSION`` says, it hits them."""
    if make_goldens.computes_another_function(case) is None:
        pytest.skip(
            f"transformers {transformers.__version__} computes the {case} goldens itself "
            "(test_goldens_are_what_transformers_computes)"
        )
    layer, want, _ = _golden(case)
    block = load_file(os.path.join(GOLDEN, case, "model.safetensors"))
    model, _ = make_goldens.reload_with_block(case, block, str(tmp_path))
    with pytest.raises(AssertionError):
        _close(make_goldens.block_outputs(model, layer, want), want, 1e-6)
    model = make_goldens.as_in_goldens(case, model)
    _close(make_goldens.block_outputs(model, layer, want), want, 1e-6)


def _moe_view(config):
    """What jaxmoe reads of a config.json: its MoE config and which layers are MoE."""
    layers = range(config["num_hidden_layers"])
    return jaxmoe.hf.moe_config(config), [jaxmoe.hf.is_moe_layer(config, i) for i in layers]


@pytest.mark.parametrize("case", CASES)
def test_regenerated_goldens_equal_the_committed_ones(case):
    layer, want, metadata = _golden(case)
    made = make_goldens.make_case(case)
    assert made["layer"] == layer
    with open(os.path.join(GOLDEN, case, "config.json")) as file:
        config = json.load(file)
    assert _moe_view(made["config"]) == _moe_view(config)
    made_with = {k: metadata[k] for k in ("transformers", "torch")}
    if make_goldens.versions() != made_with:
        differing = sorted(
            k
            for k in set(made["config"]) | set(config)
            if k != "transformers_version" and made["config"].get(k) != config.get(k)
        )
        pytest.skip(
            f"goldens made with {made_with}; installed {make_goldens.versions()} (config.json "
            f"keys written differently, none that jaxmoe reads: {differing or 'none'})"
        )
    assert {k: v for k, v in made["config"].items() if k != "transformers_version"} == {
        k: v for k, v in config.items() if k != "transformers_version"
    }
    stored = load_file(os.path.join(GOLDEN, case, "model.safetensors"))
    assert sorted(made["block"]) == sorted(stored)
    for key, value in stored.items():
        np.testing.assert_array_equal(made["block"][key], value)
    _close(made["golden"], want, 0.0)


@pytest.mark.parametrize("case", CASES)
def test_round_trip_reloads_into_transformers(case, tmp_path):
    layer, want, _ = _golden(case)
    directory = os.path.join(GOLDEN, case)
    cfg, params = jaxmoe.hf.load_moe_layer(directory, layer)
    block = jaxmoe.hf.moe_layer_state_dict(cfg, params, directory, layer)
    model, info = make_goldens.reload_with_block(case, block, str(tmp_path))
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _close(
        make_goldens.block_outputs(make_goldens.as_in_goldens(case, model), layer, want), want, 1e-6
    )


def test_mxfp4_checkpoint_computes_what_transformers_dequantizes(tmp_path):
    config_class, kwargs, layer, prefix = make_goldens.CASES["gpt_oss"]
    hidden, ffn, experts = kwargs["hidden_size"], 32, kwargs["num_local_experts"]  # 32 | widths
    torch.manual_seed(make_goldens.SEED)
    model = transformers.AutoModelForCausalLM.from_config(
        config_class(**{**kwargs, "intermediate_size": ffn})
    )
    model.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    rng = np.random.default_rng(make_goldens.SEED)
    for name, rows in (("gate_up_proj", (2 * ffn, hidden)), ("down_proj", (hidden, ffn))):
        del tensors[f"{prefix}experts.{name}"]
        blocks, scales = pack_mxfp4(np.ldexp(mxfp4_values(rng, (experts, *rows)), -6))
        tensors[f"{prefix}experts.{name}_blocks"] = blocks
        tensors[f"{prefix}experts.{name}_scales"] = scales
    save_file(tensors, tmp_path / "model.safetensors", {"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router"],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    reloaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path,
        dtype=torch.float32,
        quantization_config=transformers.Mxfp4Config(dequantize=True),
        output_loading_info=True,
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    inputs = make_goldens.golden_inputs("gpt_oss")
    reloaded = make_goldens.as_in_goldens("gpt_oss", reloaded)  # the config's SwiGLU constants
    # transformers before 5.23 dequantizes MXFP4 into bfloat16 whatever dtype is asked for. Every
    # MXFP4 value is exact in both, so float32 makes its block the one later versions load.
    reloaded = reloaded.float()
    want = make_goldens.block_outputs(reloaded, layer, inputs)
    cfg, params = jaxmoe.hf.load_moe_layer(tmp_path, layer)
    _close(jaxmoe_outputs(cfg, params, inputs), want, 1e-5)
