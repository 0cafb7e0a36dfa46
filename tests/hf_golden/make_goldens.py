"""Makes the golden files of the Hugging Face parity tests (needs torch and transformers).

For each family a tiny random transformers model (float32, seeded) is built and saved with
``save_pretrained``; from it this writes, under ``tests/hf_golden/<case>/``:

* ``config.json``: the checkpoint's own;
* ``model.safetensors``: the tensors of one MoE layer's block, under the checkpoint's keys;
* ``golden.safetensors``: ``hidden`` (the block's input), ``loss_weights`` (the loss is
  ``sum(output * loss_weights)``), ``output`` and ``input_grad`` of the transformers block, and
  ``top_k_indices`` (its routing choices, each row sorted); the layer index in its metadata.

Run: ``python tests/hf_golden/make_goldens.py`` (in an environment with torch + transformers).
``tests/test_hf_transformers.py`` imports this file to re-check the goldens whenever
transformers is importable.
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
from packaging.version import Version
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENS = (2, 5)  # [B, S] of the hidden states
SEED = 0

_SMALL = dict(vocab_size=16, hidden_size=32, num_attention_heads=2, max_position_embeddings=64)
_MLA = dict(
    num_key_value_heads=2,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
)

# case -> (config class, config kwargs, MoE layer, block key prefix)
CASES = {
    "mixtral": (
        transformers.MixtralConfig,
        dict(
            **_SMALL,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=8,
            num_hidden_layers=1,
            num_local_experts=8,
            num_experts_per_tok=2,
        ),
        0,
        "model.layers.0.block_sparse_moe.",
    ),
    "qwen3_moe": (
        transformers.Qwen3MoeConfig,
        dict(
            **_SMALL,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=16,
            moe_intermediate_size=8,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            mlp_only_layers=[0],
        ),
        1,
        "model.layers.1.mlp.",
    ),
    "qwen3_moe_no_norm": (
        transformers.Qwen3MoeConfig,
        dict(
            **_SMALL,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=16,
            moe_intermediate_size=8,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=3,
            norm_topk_prob=False,
            decoder_sparse_step=2,
        ),
        1,
        "model.layers.1.mlp.",
    ),
    "olmoe": (
        transformers.OlmoeConfig,
        dict(
            **_SMALL,
            num_key_value_heads=1,
            intermediate_size=8,
            num_hidden_layers=1,
            eos_token_id=2,
            num_experts=8,
            num_experts_per_tok=2,
        ),
        0,
        "model.layers.0.mlp.",
    ),
    "deepseek_v3": (
        transformers.DeepseekV3Config,
        dict(
            **_SMALL,
            **_MLA,
            intermediate_size=16,
            moe_intermediate_size=8,
            num_hidden_layers=2,
            first_k_dense_replace=1,
            n_routed_experts=8,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        ),
        1,
        "model.layers.1.mlp.",
    ),
    "glm4_moe": (
        transformers.Glm4MoeConfig,
        dict(
            **_SMALL,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=16,
            moe_intermediate_size=8,
            num_hidden_layers=2,
            first_k_dense_replace=1,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            routed_scaling_factor=1.5,
            norm_topk_prob=True,
        ),
        1,
        "model.layers.1.mlp.",
    ),
    "deepseek_v2": (
        transformers.DeepseekV2Config,
        dict(
            **_SMALL,
            **_MLA,
            intermediate_size=16,
            moe_intermediate_size=8,
            num_hidden_layers=1,
            first_k_dense_replace=0,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=2,
            routed_scaling_factor=1.5,
            topk_method="greedy",
            norm_topk_prob=False,
        ),
        0,
        "model.layers.0.mlp.",
    ),
    "qwen2_moe": (
        transformers.Qwen2MoeConfig,
        dict(
            **_SMALL,
            num_key_value_heads=1,
            intermediate_size=16,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=12,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            mlp_only_layers=[0],
        ),
        1,
        "model.layers.1.mlp.",
    ),
    # The clamp limit is small so that the clamps bind on the tiny model's activations.
    "gpt_oss": (
        transformers.GptOssConfig,
        dict(
            **_SMALL,
            num_key_value_heads=1,
            head_dim=16,
            intermediate_size=8,
            num_hidden_layers=1,
            num_local_experts=8,
            num_experts_per_tok=2,
            swiglu_alpha=1.25,
            swiglu_limit=0.15,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        0,
        "model.layers.0.mlp.",
    ),
}


def _swiglu_from_config(model) -> None:
    """Gives every gpt-oss experts module its config's ``swiglu_alpha`` and ``swiglu_limit``, as
    transformers 5.19 and later do (earlier ones fix them at 1.702 and 7.0)."""
    for layer in model.model.layers:
        layer.mlp.experts.alpha = model.config.swiglu_alpha
        layer.mlp.experts.limit = model.config.swiglu_limit


# case -> (the first transformers version whose block computes the case's goldens, why earlier
# versions compute another function, what turns an earlier version's block into the later one's).
# A case's block must compute one function in every version from its first one up to the
# goldens' own: tests/test_hf_transformers.py checks that where it can.
FIRST_MATCHING_VERSION = {
    "gpt_oss": (
        "5.19.0",
        "transformers before 5.19 fixes gpt-oss's SwiGLU at alpha 1.702 and limit 7.0, ignoring "
        "the config's swiglu_alpha and swiglu_limit (1.25 and 0.15 in this case; every gpt-oss "
        "Hub checkpoint has 1.702 and 7.0, where the versions agree)",
        _swiglu_from_config,
    ),
}


def computes_another_function(case: str) -> str | None:
    """Why the installed transformers' block of ``case`` computes another function than its
    goldens, or None where it computes theirs."""
    first, reason, _ = FIRST_MATCHING_VERSION.get(case, ("0", "", None))
    if Version(transformers.__version__) >= Version(first):
        return None
    return f"transformers {transformers.__version__} is installed; {reason}"


def as_in_goldens(case: str, model):
    """``model`` computing the goldens' function: an earlier transformers' block aligned with the
    later one (:data:`FIRST_MATCHING_VERSION`), or ``model`` untouched where it already does."""
    if computes_another_function(case) is not None:
        FIRST_MATCHING_VERSION[case][2](model)
    return model


def build_model(case: str):
    """The case's tiny random model (seeded; float32). A selection bias, where the family has
    one, and gpt-oss's expert biases are drawn at random too (transformers starts them at zero,
    which would not test them)."""
    config_class, kwargs, layer, _ = CASES[case]
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(config_class(**kwargs))
    model = model.float().eval()
    block = model.model.layers[layer].mlp
    gate = router_of(block)
    with torch.no_grad():
        if hasattr(gate, "e_score_correction_bias"):
            gate.e_score_correction_bias.copy_(
                0.1 * torch.randn(gate.e_score_correction_bias.shape)
            )
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            if hasattr(block.experts, name):
                bias = getattr(block.experts, name)
                bias.copy_(0.1 * torch.randn(bias.shape))
    return model


def router_of(block):
    """The block's router module (gpt-oss names it ``router``, the others ``gate``)."""
    return block.router if hasattr(block, "router") else block.gate


def golden_inputs(case: str) -> dict[str, np.ndarray]:
    hidden_size = CASES[case][1]["hidden_size"]
    rng = np.random.default_rng(SEED)
    return {
        "hidden": rng.standard_normal((*TOKENS, hidden_size), dtype=np.float32),
        "loss_weights": rng.standard_normal((*TOKENS, hidden_size), dtype=np.float32),
    }


def block_outputs(model, layer: int, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The transformers MoE block's output, input gradient and routing on ``inputs``."""
    block = model.model.layers[layer].mlp
    hidden = torch.tensor(inputs["hidden"], requires_grad=True)
    output = block(hidden)
    if isinstance(output, tuple):  # gpt-oss returns (output, router scores)
        output = output[0]
    (output * torch.tensor(inputs["loss_weights"])).sum().backward()
    with torch.no_grad():
        _, _, indices = router_of(block)(hidden.reshape(-1, hidden.shape[-1]))
    return {
        "output": output.detach().numpy(),
        "input_grad": hidden.grad.numpy(),
        "top_k_indices": np.sort(indices.numpy(), axis=-1).astype(np.int32),
    }


def saved_checkpoint(model, directory: str) -> dict[str, np.ndarray]:
    """``save_pretrained`` into ``directory``; returns the saved tensors."""
    model.save_pretrained(directory)
    return load_file(os.path.join(directory, "model.safetensors"))


def reload_with_block(case: str, block: dict[str, np.ndarray], directory: str):
    """A fresh checkpoint of the case with ``block``'s tensors written over its own, reloaded
    with ``from_pretrained``: ``(model, loading_info)``."""
    tensors = saved_checkpoint(build_model(case), directory)
    unknown = sorted(set(block) - set(tensors))
    if unknown:
        raise KeyError(f"keys not in the {case} checkpoint: {unknown}")
    tensors.update(block)
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True
    )


def make_case(case: str) -> dict:
    """Everything the goldens of ``case`` hold: ``{"config", "block", "golden", "layer"}``."""
    _, _, layer, prefix = CASES[case]
    model = build_model(case)
    with tempfile.TemporaryDirectory() as directory:
        tensors = saved_checkpoint(model, directory)
        with open(os.path.join(directory, "config.json")) as file:
            config = json.load(file)
    inputs = golden_inputs(case)
    block = {key: value for key, value in tensors.items() if key.startswith(prefix)}
    return {
        "config": config,
        "block": block,
        "golden": {**inputs, **block_outputs(model, layer, inputs)},
        "layer": layer,
    }


def versions() -> dict[str, str]:
    """The library versions that made a golden (stored in its metadata)."""
    return {"transformers": transformers.__version__, "torch": torch.__version__}


def write_case(case: str, root: str = HERE) -> None:
    made = make_case(case)
    directory = os.path.join(root, case)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as file:
        json.dump(made["config"], file, indent=2, sort_keys=True)
        file.write("\n")
    save_file(made["block"], os.path.join(directory, "model.safetensors"), {"format": "pt"})
    save_file(
        made["golden"],
        os.path.join(directory, "golden.safetensors"),
        {"layer": str(made["layer"]), **versions()},
    )


def main(cases=None) -> None:
    for case in cases or CASES:
        write_case(case)
        print(f"wrote {os.path.join(HERE, case)}")


if __name__ == "__main__":
    main(sys.argv[1:])
