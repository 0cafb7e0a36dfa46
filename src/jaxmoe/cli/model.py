"""The demo's model: a small decoder-only character-level transformer whose FFNs are MoE layers.

Each block is pre-norm: ``x + attn(rms(x))`` then ``x + moe(rms(x))``, with causal multi-head
self-attention and a :class:`jaxmoe.nn.MoE` in place of the dense FFN. Every block's
:class:`jaxmoe.MoEStats` is returned alongside the logits, so the training loss can add the router
losses and the loop can watch the expert load.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

import jaxmoe
import jaxmoe.nn


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes of the demo transformer (the MoE knobs live in ``moe``)."""

    vocab_size: int
    seq_len: int = 96
    num_layers: int = 2
    num_heads: int = 4
    moe: jaxmoe.MoEConfig = dataclasses.field(
        default_factory=lambda: jaxmoe.MoEConfig(
            num_experts=8, top_k=2, hidden_size=128, ffn_size=128
        )
    )

    @property
    def width(self) -> int:
        return self.moe.hidden_size


class CausalSelfAttention(nnx.Module):
    """Multi-head self-attention where position ``s`` sees positions ``<= s`` only."""

    def __init__(self, width: int, num_heads: int, *, rngs: nnx.Rngs):
        if width % num_heads:
            raise ValueError(f"width {width} must be a multiple of num_heads {num_heads}.")
        self.num_heads = num_heads
        self.qkv = nnx.Linear(width, 3 * width, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(width, width, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # x: [B, S, D]
        batch, seq, width = x.shape
        head_dim = width // self.num_heads
        qkv = self.qkv(x).reshape(batch, seq, 3, self.num_heads, head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        logits = jnp.einsum("bqnd,bknd->bnqk", q, k) / jnp.sqrt(head_dim).astype(x.dtype)
        causal = jnp.tril(jnp.ones((1, 1, seq, seq), dtype=bool))
        logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
        attn = jax.nn.softmax(logits, axis=-1)
        return self.out(jnp.einsum("bnqk,bknd->bqnd", attn, v).reshape(batch, seq, width))


class Block(nnx.Module):
    """Pre-norm transformer block with an MoE feed-forward layer."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, mesh=None):
        self.attn_norm = nnx.RMSNorm(cfg.width, rngs=rngs)
        self.attn = CausalSelfAttention(cfg.width, cfg.num_heads, rngs=rngs)
        self.moe_norm = nnx.RMSNorm(cfg.width, rngs=rngs)
        self.moe = jaxmoe.nn.MoE(cfg.moe, rngs=rngs, mesh=mesh)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jaxmoe.MoEStats]:
        x = x + self.attn(self.attn_norm(x))
        y, stats = self.moe(self.moe_norm(x))
        return x + y, stats


class CharTransformer(nnx.Module):
    """Token + learned position embeddings, ``num_layers`` MoE blocks, a final norm, a tied head.

    ``__call__(tokens[B, S]) -> (logits[B, S, V], stats)`` where ``stats`` is a
    :class:`jaxmoe.MoEStats` whose leaves are stacked over layers (``tokens_per_expert`` is
    ``[L, E]``).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, mesh=None):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.width, rngs=rngs)
        self.pos_embed = nnx.Param(
            0.02 * jax.random.normal(rngs.params(), (cfg.seq_len, cfg.width))
        )
        self.blocks = nnx.List([Block(cfg, rngs=rngs, mesh=mesh) for _ in range(cfg.num_layers)])
        self.final_norm = nnx.RMSNorm(cfg.width, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, jaxmoe.MoEStats]:
        seq = tokens.shape[-1]
        x = self.embed(tokens) + self.pos_embed[...][None, :seq]
        layer_stats = []
        for block in self.blocks:
            x, stats = block(x)
            layer_stats.append(stats)
        logits = self.embed.attend(self.final_norm(x))
        return logits, jax.tree.map(lambda *leaves: jnp.stack(leaves), *layer_stats)

    def update_expert_bias(self, tokens_per_expert: jax.Array, rate: float) -> None:
        """Aux-loss-free balancing step for every layer (``tokens_per_expert``: ``[L, E]``)."""
        for block, counts in zip(self.blocks, tokens_per_expert, strict=True):
            block.moe.update_expert_bias(counts, rate)
