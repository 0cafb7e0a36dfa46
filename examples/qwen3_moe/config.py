"""The decoder's configuration: sizes, which layers are MoE, dtypes, and the same from a
transformers Qwen3-MoE ``config.json``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

import jaxmoe
import jaxmoe.hf
from jaxmoe.hf.families import read_hf_config

ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """A Qwen3-MoE decoder (hashable: the model's static configuration).

    Attributes:
      vocab_size: V, token ids are ``[0, V)``.
      num_layers: decoder layers.
      num_heads, num_kv_heads: query heads and key/value heads (grouped-query attention:
        ``num_heads`` a multiple of ``num_kv_heads``).
      head_dim: width of one head (Qwen3 sets it apart from ``hidden_size / num_heads``).
      intermediate_size: the width of the dense SwiGLU MLP of the layers that are not MoE.
      moe: the MoE blocks' :class:`jaxmoe.MoEConfig`; its ``hidden_size`` is the model width.
      moe_layers: the indices of the layers whose MLP is an MoE block (the others are dense).
      rope_theta: the rotary embeddings' base.
      rms_norm_eps: epsilon of every RMSNorm (layer norms and the per-head q/k norms).
      tie_word_embeddings: the LM head is the embedding matrix (else its own ``[H, V]`` kernel).
      initializer_range: standard deviation of the normal initialisation of the embeddings and
        the attention / dense MLP / head kernels (transformers' rule; the MoE blocks use
        :func:`jaxmoe.init_params`).
      dtype: compute dtype (activations, matmul inputs); the loss's logits are float32.
      float32_logits: the head's matmul writes float32 logits (its ``preferred_element_type``;
        the default). False: it writes them in ``dtype`` and the loss takes them to float32,
        as torchtitan's autocast does; the cotangent reaching the head is then in ``dtype`` and
        the backward's two head matmuls run in it rather than in float32 (the head is the
        largest part of the ``h200`` step: docs/performance.md, 'A whole model').
      param_dtype: dtype of every parameter.
      attention: ``"auto"`` (cuDNN flash attention on a GPU where the dtype and head_dim allow,
        else XLA), ``"xla"`` or ``"cudnn"`` (``jax.nn.dot_product_attention``'s
        ``implementation``).
      remat: recompute each layer's activations in the backward pass (``jax.checkpoint``):
        activation memory of one layer instead of all of them, for about a third more compute.
    """

    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    moe: jaxmoe.MoEConfig
    moe_layers: tuple[int, ...]
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    attention: str = "auto"
    remat: bool = False
    float32_logits: bool = True

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DecoderConfig.{name}: must be an int >= 1; got {value!r}.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"DecoderConfig.num_heads: must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention; got {self.num_heads}."
            )
        if self.head_dim % 2:
            raise ValueError(
                f"DecoderConfig.head_dim: must be even (rotary embeddings rotate pairs of "
                f"dimensions); got {self.head_dim}."
            )
        layers = tuple(self.moe_layers)
        if not layers or any(not 0 <= i < self.num_layers for i in layers):
            raise ValueError(
                f"DecoderConfig.moe_layers: must list at least one layer index in "
                f"[0, {self.num_layers}) (an MoE decoder needs an MoE block); got {layers}."
            )
        object.__setattr__(self, "moe_layers", tuple(sorted(set(layers))))
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"DecoderConfig.attention: must be one of {ATTENTION_IMPLEMENTATIONS}; got "
                f"{self.attention!r}."
            )
        for name in ("dtype", "param_dtype"):
            mine, moe = jnp.dtype(getattr(self, name)), jnp.dtype(getattr(self.moe, name))
            if mine != moe:
                raise ValueError(
                    f"DecoderConfig.{name}: is {mine} but moe.{name} is {moe}; the whole model "
                    "computes and stores in one dtype each. Make both the same."
                )

    @property
    def hidden_size(self) -> int:
        return self.moe.hidden_size

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self.moe_layers


def _rope_theta(hf: dict) -> float:
    """The rotary base: top-level ``rope_theta`` (Hub configs) or ``rope_parameters``
    (transformers 5); anything but the default rotary embeddings is refused."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(
            f"qwen3_moe: rope_type {kind!r} is not supported: this decoder implements the "
            "default rotary embeddings only. Use a checkpoint without rope scaling."
        )
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def _refuse_unless(hf: dict, option: str, allowed: tuple, reason: str) -> None:
    if hf.get(option) not in allowed:
        raise ValueError(
            f"qwen3_moe: config.json's {option}={hf.get(option)!r} is not supported: {reason}."
        )


def decoder_config(hf_config, *, dtype=jnp.float32, param_dtype=None, **moe_overrides):
    """The :class:`DecoderConfig` of a transformers Qwen3-MoE checkpoint.

    Args:
      hf_config: ``config.json``: a dict, its path, or the checkpoint directory.
      dtype: the compute dtype.
      param_dtype: the parameters' dtype (``dtype`` when None).
      **moe_overrides: ``MoEConfig`` fields that are not the model's (``ep_axis``,
        ``data_axes``, ``fsdp_expert_weights``, ``fp8_recipe``, ``aux_loss_coef``, ...; see
        :func:`jaxmoe.hf.moe_config`). ``aux_loss_coef`` defaults to the checkpoint's
        ``router_aux_loss_coef``.

    Raises:
      ValueError: not a Qwen3-MoE config, or an option this decoder does not implement
        (attention biases, sliding-window attention, scaled rotary embeddings).
    """
    hf = read_hf_config(hf_config)
    if hf.get("model_type") != "qwen3_moe":
        raise ValueError(
            f"qwen3_moe: config.json's model_type must be 'qwen3_moe'; got "
            f"{hf.get('model_type')!r}. This example implements the Qwen3-MoE decoder only."
        )
    _refuse_unless(hf, "attention_bias", (None, False), "the decoder's projections have no bias")
    _refuse_unless(
        hf, "use_sliding_window", (None, False), "the decoder's attention is full causal"
    )
    param_dtype = dtype if param_dtype is None else param_dtype
    moe_overrides.setdefault("aux_loss_coef", float(hf.get("router_aux_loss_coef") or 0.0))
    moe = jaxmoe.hf.moe_config(hf, dtype=dtype, param_dtype=param_dtype, **moe_overrides)
    num_layers = int(hf["num_hidden_layers"])
    num_heads = int(hf["num_attention_heads"])
    return DecoderConfig(
        vocab_size=int(hf["vocab_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // num_heads),
        intermediate_size=int(hf["intermediate_size"]),
        moe=moe,
        moe_layers=tuple(i for i in range(num_layers) if jaxmoe.hf.is_moe_layer(hf, i)),
        rope_theta=_rope_theta(hf),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        dtype=dtype,
        param_dtype=param_dtype,
    )
