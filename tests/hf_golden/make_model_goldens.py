"""Makes the goldens of the whole-model parity test of ``examples/qwen3_moe`` (needs torch and
transformers).

For each case a tiny random ``Qwen3MoeForCausalLM`` (float32, seeded) is saved with
``save_pretrained`` under ``tests/hf_golden/models/<case>/`` (``config.json`` and
``model.safetensors``: the whole checkpoint), with ``golden.safetensors``: ``input_ids``
``[B, S]`` and the transformers ``logits`` ``[B, S, V]`` (library versions in its metadata).

* ``qwen3_moe``: layer 0 dense (``mlp_only_layers``), layer 1 MoE; untied LM head;
  ``norm_topk_prob``.
* ``qwen3_moe_tied``: both layers MoE, the LM head tied to the embeddings, top-k weights not
  renormalised, another rotary base.

Run: ``python tests/hf_golden/make_model_goldens.py`` (with torch + transformers);
``tests/test_example_qwen3_moe.py`` imports it to re-check the goldens where transformers is
importable. (The goldens sit one folder down so that ``tests/test_hf.py``, which takes every
``tests/hf_golden/*/config.json`` as an MoE-layer case, does not see them.)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
SEED = 0
TOKENS = (2, 7)  # [B, S] of the input ids

_SHAPE = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=32,
    moe_intermediate_size=8,
    num_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=64,
)

CASES = {
    "qwen3_moe": dict(
        **_SHAPE,
        mlp_only_layers=[0],
        norm_topk_prob=True,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    "qwen3_moe_tied": dict(
        **_SHAPE,
        norm_topk_prob=False,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    ),
}


def build_model(case: str):
    """The case's tiny random model, float32, in eval mode. transformers initialises with
    std 0.02, which leaves the logits near-uniform; the weights are redrawn with std 0.2 so
    that the parity test sees logits (and routing choices) far from ties."""
    torch.manual_seed(SEED)
    config = transformers.Qwen3MoeConfig(**CASES[case])
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                param.normal_(0.0, 0.2)
            else:
                param.uniform_(0.5, 1.5)
    return model


def golden_inputs(case: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, CASES[case]["vocab_size"], TOKENS)
    return {"input_ids": ids.astype(np.int64)}


def model_logits(model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(inputs["input_ids"])).logits.numpy()


def versions() -> dict[str, str]:
    return {"transformers": transformers.__version__, "torch": torch.__version__}


def make_case(case: str) -> dict:
    """``{"config", "tensors", "golden"}`` of ``case``, made in memory."""
    model = build_model(case)
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        with open(os.path.join(directory, "config.json")) as file:
            config = json.load(file)
        tensors = load_file(os.path.join(directory, "model.safetensors"))
    inputs = golden_inputs(case)
    return {
        "config": config,
        "tensors": tensors,
        "golden": {**inputs, "logits": model_logits(model, inputs)},
    }


def reload(case: str, root: str = HERE):
    """The committed checkpoint of ``case`` loaded back into transformers (float32)."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(root, case), dtype=torch.float32
    ).eval()


def write_case(case: str, root: str = HERE) -> None:
    made = make_case(case)
    directory = os.path.join(root, case)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as file:
        json.dump(made["config"], file, indent=2, sort_keys=True)
        file.write("\n")
    save_file(made["tensors"], os.path.join(directory, "model.safetensors"), {"format": "pt"})
    save_file(made["golden"], os.path.join(directory, "golden.safetensors"), versions())


def main(cases=None) -> None:
    for case in cases or CASES:
        write_case(case)
        print(f"wrote {os.path.join(HERE, case)}")


if __name__ == "__main__":
    main(sys.argv[1:])
