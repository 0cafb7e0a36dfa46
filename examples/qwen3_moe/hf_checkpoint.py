"""A whole transformers Qwen3-MoE checkpoint directory as a :class:`Qwen3MoE`.

The MoE blocks come from :func:`jaxmoe.hf.load_moe_layer`; every other tensor is read here
from the safetensors files (:class:`jaxmoe.hf.checkpoint.CheckpointFiles`), each ``nn.Linear``
weight ``[out, in]`` transposed to the decoder's ``[in, out]`` kernel::

    model.embed_tokens.weight                     [V, H]  -> embed_tokens
    model.layers.{i}.input_layernorm.weight       [H]     -> layers[i].input_layernorm.weight
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight      -> layers[i].self_attn.*_proj.kernel
    model.layers.{i}.self_attn.{q,k}_norm.weight  [D]     -> layers[i].self_attn.*_norm.weight
    model.layers.{i}.post_attention_layernorm.weight      -> ...post_attention_layernorm.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight       -> layers[i].mlp.*.kernel (dense)
    model.layers.{i}.mlp.*                                -> layers[i].mlp (MoE: jaxmoe.hf)
    model.norm.weight                             [H]     -> norm.weight
    lm_head.weight                                [V, H]  -> lm_head.kernel (untied only)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxmoe.hf
from jaxmoe.hf.checkpoint import CheckpointFiles

from .config import DecoderConfig, decoder_config
from .model import Qwen3MoE

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_DENSE_MLP = ("gate_proj", "up_proj", "down_proj")


def _linear(files: CheckpointFiles, key: str, shape: tuple, dtype) -> np.ndarray:
    """An ``nn.Linear`` weight as an ``[in, out]`` kernel of ``shape``, checked first."""
    _check_shape(files, key, tuple(reversed(shape)))
    return files.read(key).T.astype(dtype)


def _vector(files: CheckpointFiles, key: str, shape: tuple, dtype) -> np.ndarray:
    _check_shape(files, key, shape)
    return files.read(key).astype(dtype)


def _check_shape(files: CheckpointFiles, key: str, expected: tuple) -> None:
    found = files.shape(key)
    if found != expected:
        raise ValueError(
            f"qwen3_moe: {key!r} has shape {list(found)} but config.json implies "
            f"{list(expected)}. The weights and config.json are from different models."
        )


def _layer_tensors(files, cfg: DecoderConfig, layer: int, dtype) -> dict:
    """The pure-dict state of decoder layer ``layer`` except an MoE block."""
    prefix = f"model.layers.{layer}"
    hidden, head = cfg.hidden_size, cfg.head_dim
    widths = {
        "q_proj": (hidden, cfg.num_heads * head),
        "k_proj": (hidden, cfg.num_kv_heads * head),
        "v_proj": (hidden, cfg.num_kv_heads * head),
        "o_proj": (cfg.num_heads * head, hidden),
    }
    attention = {
        name: {"kernel": _linear(files, f"{prefix}.self_attn.{name}.weight", widths[name], dtype)}
        for name in _ATTENTION
    }
    for name in ("q_norm", "k_norm"):
        key = f"{prefix}.self_attn.{name}.weight"
        attention[name] = {"weight": _vector(files, key, (head,), dtype)}
    state = {
        "input_layernorm": {
            "weight": _vector(files, f"{prefix}.input_layernorm.weight", (hidden,), dtype)
        },
        "self_attn": attention,
        "post_attention_layernorm": {
            "weight": _vector(files, f"{prefix}.post_attention_layernorm.weight", (hidden,), dtype)
        },
    }
    if not cfg.is_moe_layer(layer):
        ffn = cfg.intermediate_size
        shapes = {"gate_proj": (hidden, ffn), "up_proj": (hidden, ffn), "down_proj": (ffn, hidden)}
        state["mlp"] = {
            name: {"kernel": _linear(files, f"{prefix}.mlp.{name}.weight", shapes[name], dtype)}
            for name in _DENSE_MLP
        }
    return state


def load_checkpoint(
    path, *, dtype=jnp.float32, param_dtype=None, mesh=None, **moe_overrides
) -> Qwen3MoE:
    """The decoder of a transformers Qwen3-MoE checkpoint directory, with its weights.

    Args:
      path: ``config.json`` plus ``model.safetensors`` or sharded files with their index (as
        ``save_pretrained`` writes or the Hub serves).
      dtype: the compute dtype.
      param_dtype: the parameters' dtype (``dtype`` when None); the tensors are cast to it.
      mesh: a ``jax.sharding.Mesh`` for the MoE blocks (their experts are read onto it shard
        by shard, over ``moe_overrides["ep_axis"]``); None for one device.
      **moe_overrides: ``MoEConfig`` fields that are not the model's (see
        :func:`examples.qwen3_moe.config.decoder_config`).

    Returns:
      A :class:`Qwen3MoE` whose logits are transformers' ``Qwen3MoeForCausalLM`` logits.

    Raises:
      ValueError: an unsupported config option, a missing tensor or shard file, or a tensor
        whose shape disagrees with ``config.json`` (all before the weights are read).
    """
    cfg = decoder_config(path, dtype=dtype, param_dtype=param_dtype, **moe_overrides)
    store = jnp.dtype(cfg.param_dtype)
    files = CheckpointFiles(path)
    keys = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie_word_embeddings:
        keys.append("lm_head.weight")
    files.check_files(keys)

    pure = {
        "embed_tokens": _vector(
            files, "model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size), store
        ),
        "norm": {"weight": _vector(files, "model.norm.weight", (cfg.hidden_size,), store)},
        "layers": {},
    }
    if not cfg.tie_word_embeddings:
        shape = (cfg.hidden_size, cfg.vocab_size)
        pure["lm_head"] = {"kernel": _linear(files, "lm_head.weight", shape, store)}
    for layer in range(cfg.num_layers):
        pure["layers"][layer] = _layer_tensors(files, cfg, layer, store)
        if cfg.is_moe_layer(layer):
            ep_axis = cfg.moe.ep_axis if mesh is not None else None
            _, block = jaxmoe.hf.load_moe_layer(
                path, layer, mesh=mesh, dtype=store, ep_axis=ep_axis
            )
            pure["layers"][layer]["mlp"] = block

    abstract = nnx.eval_shape(lambda: Qwen3MoE(cfg, rngs=nnx.Rngs(0), mesh=mesh))
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, pure))
    return nnx.merge(graphdef, state)
