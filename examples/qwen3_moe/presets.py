"""The training presets, and the memory estimate the ``h200`` preset's layer count comes from.

* ``tiny``: a 2-layer model for a CPU (CI): width 64, 4 query / 2 KV heads of 16, 8 experts
  top-2 of width 64, layer 0 dense; 16 sequences of 64 tokens, float32.
* ``h200``: Qwen3-30B-A3B's layer, fewer layers, on one H200 (141 GB). The 30B-A3B shapes:
  H=2048, 128 experts top-8 of width 768 (softmax, renormalised top-k, aux loss 1e-3), 32
  query / 4 KV heads of 128, q/k norms, rope_theta 1e6, untied head, and its full vocabulary
  (151936: the same model as torchtitan's ``30B-A3B`` flavour with ``n_layers`` changed, and
  the head's share of the memory and FLOPs that a user of this shape pays). Sequence 4096,
  batch 2 (8192 tokens a step). Parameters float32 (master weights), compute bf16, AdamW
  moments float32: what torchtitan does on one GPU (float32 parameters under bf16 autocast;
  optax keeps Adam's moments in the parameters' dtype, so bf16 parameters would also mean
  bf16 moments). **8 layers**, from :func:`memory_estimate` (every figure in GB, 1e9 bytes)::

      parameters: 622M (embedding + head) + 623M per layer = 5.61 G     x 4 B     22.4
      gradients                                                          x 4 B     22.4
      AdamW mu + nu                                                      x 8 B     44.9
      activations, 8192 tokens: 8 layers x 148 kB/token + head 1.8 MB/token        24.6
      total                                                                       114.4

  (9 layers: 125.5; 10: 136.7.) 114 GB is 106 GiB: with
  ``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95`` (JAX reserves 75% of the GPU by default) that leaves
  about 27 GiB for XLA's temporaries, the cuDNN and grouped-matmul workspaces and
  fragmentation. The activation figure counts what the backward pass keeps per token (see
  :func:`activation_bytes_per_token`); a measurement of the peak replaces the estimate.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

import jaxmoe

from .config import DecoderConfig
from .flops import parameter_counts


@dataclasses.dataclass(frozen=True)
class Preset:
    """A model and its training run's defaults (each overridable by a flag)."""

    name: str
    model: dict  # DecoderConfig fields, with the MoE block's as "moe": {...}
    seq_len: int
    batch_size: int
    steps: int
    learning_rate: float
    warmup_steps: int
    dtype: str
    param_dtype: str


PRESETS = {
    "tiny": Preset(
        name="tiny",
        model=dict(
            vocab_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            intermediate_size=128,
            moe_layers=(1,),
            rope_theta=1e4,
            moe=dict(
                num_experts=8,
                top_k=2,
                hidden_size=64,
                ffn_size=64,
                score="softmax",
                pre_softmax=True,
                normalize_weights=True,
                aux_loss_coef=1e-2,
            ),
        ),
        seq_len=64,
        batch_size=16,
        steps=200,
        learning_rate=3e-3,
        warmup_steps=10,
        dtype="float32",
        param_dtype="float32",
    ),
    "h200": Preset(
        name="h200",
        model=dict(
            vocab_size=151936,
            num_layers=8,
            num_heads=32,
            num_kv_heads=4,
            head_dim=128,
            intermediate_size=6144,
            moe_layers=tuple(range(8)),
            rope_theta=1e6,
            moe=dict(
                num_experts=128,
                top_k=8,
                hidden_size=2048,
                ffn_size=768,
                score="softmax",
                pre_softmax=True,
                normalize_weights=True,
                aux_loss_coef=1e-3,
            ),
        ),
        seq_len=4096,
        batch_size=2,
        steps=50,
        learning_rate=3e-4,
        warmup_steps=10,
        dtype="bfloat16",
        param_dtype="float32",
    ),
}


def build_config(
    preset: Preset, *, dtype=None, param_dtype=None, remat=False, **moe_overrides
) -> DecoderConfig:
    """The preset's :class:`DecoderConfig`; ``moe_overrides`` are further ``MoEConfig`` fields
    (``ep_axis``, ``data_axes``, ``fsdp_expert_weights``, ``fp8_recipe``, ...)."""
    dtype = jnp.dtype(dtype or preset.dtype)
    param_dtype = jnp.dtype(param_dtype or preset.param_dtype)
    fields = dict(preset.model)
    moe = jaxmoe.MoEConfig(
        **fields.pop("moe"), dtype=dtype, param_dtype=param_dtype, **moe_overrides
    )
    return DecoderConfig(**fields, moe=moe, dtype=dtype, param_dtype=param_dtype, remat=remat)


def activation_bytes_per_token(cfg: DecoderConfig) -> dict[str, int]:
    """What the backward pass keeps per token, in bytes, without ``remat``: per attention,
    MoE and dense block, and for the head and loss.

    Attention: the block's input and its norm (H each), q and k before and after their norm
    and rotation, v, the attention output, and the softmax's log-sum-exp (float32). MoE: the
    input and its norm, the router's float32 logits and probabilities, the ``K`` dispatched
    copies (``K * H``), the gate, up and gated products (``3 * K * F``), the experts' output
    rows (``K * H``). Dense MLP: input, norm, gate, up, product. Head: the final norm and the
    float32 logits, their softmax and its gradient (``12 * V``).
    """
    c = jnp.dtype(cfg.dtype).itemsize
    hidden, q_width = cfg.hidden_size, cfg.num_heads * cfg.head_dim
    kv_width = cfg.num_kv_heads * cfg.head_dim
    moe = cfg.moe
    return {
        "attention": c * (2 * hidden + 3 * q_width + 3 * kv_width) + 4 * cfg.num_heads,
        "moe": c * (2 * hidden + 2 * moe.top_k * hidden + 3 * moe.top_k * moe.ffn_size)
        + 8 * moe.num_experts,
        "dense": c * (2 * hidden + 3 * cfg.intermediate_size),
        "head": c * hidden + 12 * cfg.vocab_size,
    }


def memory_estimate(cfg: DecoderConfig, tokens: int) -> dict[str, float]:
    """Training memory in GB (1e9 bytes) for ``tokens`` tokens a step with AdamW: parameters,
    gradients (the parameters' dtype), Adam's two moments (the parameters' dtype, as optax
    keeps them), activations (:func:`activation_bytes_per_token`; with ``remat`` one layer's
    plus every layer's input)."""
    params = parameter_counts(cfg)["total"]
    width = jnp.dtype(cfg.param_dtype).itemsize
    per_token = activation_bytes_per_token(cfg)
    layers = [
        per_token["attention"] + per_token["moe" if cfg.is_moe_layer(i) else "dense"]
        for i in range(cfg.num_layers)
    ]
    if cfg.remat:
        kept = max(layers) + cfg.num_layers * cfg.hidden_size * jnp.dtype(cfg.dtype).itemsize
    else:
        kept = sum(layers)
    estimate = {
        "parameters": params * width / 1e9,
        "gradients": params * width / 1e9,
        "adam": 2 * params * width / 1e9,
        "activations": tokens * (kept + per_token["head"]) / 1e9,
    }
    estimate["total"] = sum(estimate.values())
    return estimate
