"""The goldens re-checked against transformers itself, where torch and transformers are installed
(they are too heavy for the default test environment, which tests the goldens alone):

* the goldens are what the installed transformers computes from the golden weights;
* regenerating them in memory (``make_goldens.make_case``) gives the committed files, when the
  library versions are those that made them (initialisation can change between versions);
* the round trip ``load_moe_layer`` -> ``moe_layer_state_dict`` -> a Hub-layout checkpoint
  reloads into transformers with no missing or unexpected keys and the same outputs.
"""

import importlib.util
import json
import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

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


@pytest.mark.parametrize("case", CASES)
def test_goldens_are_what_transformers_computes(case, tmp_path):
    layer, want, _ = _golden(case)
    block = load_file(os.path.join(GOLDEN, case, "model.safetensors"))
    model, _ = make_goldens.reload_with_block(case, block, str(tmp_path))
    _close(make_goldens.block_outputs(model, layer, want), want, 1e-6)


@pytest.mark.parametrize("case", CASES)
def test_regenerated_goldens_equal_the_committed_ones(case):
    layer, want, metadata = _golden(case)
    made = make_goldens.make_case(case)
    assert made["layer"] == layer
    with open(os.path.join(GOLDEN, case, "config.json")) as file:
        config = json.load(file)
    assert {k: v for k, v in made["config"].items() if k != "transformers_version"} == {
        k: v for k, v in config.items() if k != "transformers_version"
    }
    if make_goldens.versions() != {k: metadata[k] for k in ("transformers", "torch")}:
        pytest.skip(f"goldens made with {metadata}; installed {make_goldens.versions()}")
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
    _close(make_goldens.block_outputs(model, layer, want), want, 1e-6)
