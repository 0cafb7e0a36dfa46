"""The Qwen3-MoE decoder as flax NNX modules, its MoE blocks :class:`jaxmoe.nn.MoE`.

Each layer is pre-norm, as transformers' ``Qwen3MoeDecoderLayer``::

    h = x + o_proj(attention(rope(q_norm(q_proj(rms(x)))), rope(k_norm(k_proj(rms(x)))),
                             v_proj(rms(x))))
    y = h + mlp(rms(h))        # mlp: an MoE block, or a dense SwiGLU MLP where the config says

``rms(x) = weight * x / sqrt(mean(x^2) + eps)`` (float32 inside); ``q_norm`` / ``k_norm`` are
RMSNorms over each head's ``head_dim``; rotary embeddings rotate the two halves of each head
(``x * cos + rotate_half(x) * sin``, frequencies ``rope_theta^(-2i / head_dim)``); attention is
causal grouped-query attention through ``jax.nn.dot_product_attention``. After the last layer a
final RMSNorm and the LM head (its own kernel, or the embeddings when tied) give float32 logits.

Parameters carry logical axis names as sharding metadata: ``vocab``, ``embed``, ``heads``,
``kv_heads``, ``mlp``, ``norm`` here, and the MoE blocks' own (``expert``, ``embed``, ``mlp``,
``router``); :func:`examples.qwen3_moe.train` maps them onto a mesh with jaxmoe's rules.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import jaxmoe
import jaxmoe.nn

from .config import DecoderConfig

CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128


def attention_implementation(cfg: DecoderConfig, backend: str | None = None) -> str:
    """``jax.nn.dot_product_attention``'s ``implementation`` for ``cfg`` on ``backend``
    (``jax.default_backend()`` when None).

    ``"auto"``: cuDNN's fused flash attention on a GPU when it can run the case (bf16 or fp16,
    ``head_dim`` a multiple of 8 and at most 128), else XLA's. ``"xla"`` / ``"cudnn"``: as named
    (cuDNN raises on a platform or case it cannot run; never a silent fallback).
    """
    if cfg.attention != "auto":
        return cfg.attention
    backend = jax.default_backend() if backend is None else backend
    fits = (
        jnp.dtype(cfg.dtype) in tuple(map(jnp.dtype, CUDNN_DTYPES))
        and cfg.head_dim % 8 == 0
        and cfg.head_dim <= CUDNN_MAX_HEAD_DIM
    )
    return "cudnn" if backend == "gpu" and fits else "xla"


def _param(value: jax.Array, axes: tuple) -> nnx.Param:
    # Logical names as metadata only: no mesh is needed to build the model.
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], cfg: DecoderConfig) -> jax.Array:
    std = cfg.initializer_range
    return (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(cfg.param_dtype)


def _last_axis(vector: jax.Array, ndim: int) -> jax.Array:
    """``vector`` ``[D]`` shaped ``[1, ..., 1, D]`` to broadcast against an ``ndim``-d array."""
    return vector.reshape((1,) * (ndim - 1) + vector.shape)


class Dense(nnx.Module):
    """``x @ kernel`` without a bias; ``kernel`` is ``[in, out]`` (transformers stores
    ``[out, in]``)."""

    def __init__(self, size_in: int, size_out: int, axes: tuple, cfg: DecoderConfig, *, rngs):
        self.kernel = _param(_normal(rngs, (size_in, size_out), cfg), axes)
        self.dtype = cfg.dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.dot(x, self.kernel[...].astype(self.dtype))


class RMSNorm(nnx.Module):
    """``weight * x / sqrt(mean(x^2, -1) + eps)``, normalised in float32."""

    def __init__(self, size: int, cfg: DecoderConfig):
        self.weight = _param(jnp.ones((size,), cfg.param_dtype), ("norm",))
        self.eps = cfg.rms_norm_eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return _last_axis(self.weight[...].astype(x.dtype), x.ndim) * normed.astype(x.dtype)


def rotary_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)`` ``[S, head_dim]`` float32 of positions ``0..S-1``: frequency ``i`` is
    ``theta^(-2i / head_dim)``, each used for both halves of a head."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """``x * cos + rotate_half(x) * sin`` for ``x`` ``[B, S, N, D]``, ``rotate_half(x) =
    [-x2, x1]`` of its halves."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos = cos[None, :, None, :].astype(x.dtype)
    sin = sin[None, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


class Attention(nnx.Module):
    """Causal grouped-query self-attention with Qwen3's per-head q/k RMSNorms."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        hidden, heads, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads
        self.q_proj = Dense(hidden, heads, ("embed", "heads"), cfg, rngs=rngs)
        self.k_proj = Dense(hidden, kv * cfg.head_dim, ("embed", "kv_heads"), cfg, rngs=rngs)
        self.v_proj = Dense(hidden, kv * cfg.head_dim, ("embed", "kv_heads"), cfg, rngs=rngs)
        self.o_proj = Dense(heads, hidden, ("heads", "embed"), cfg, rngs=rngs)
        self.q_norm = RMSNorm(cfg.head_dim, cfg)
        self.k_norm = RMSNorm(cfg.head_dim, cfg)
        self.cfg = cfg

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        batch, seq, _ = x.shape
        cfg = self.cfg
        q = self.q_norm(self.q_proj(x).reshape(batch, seq, cfg.num_heads, cfg.head_dim))
        k = self.k_norm(self.k_proj(x).reshape(batch, seq, cfg.num_kv_heads, cfg.head_dim))
        v = self.v_proj(x).reshape(batch, seq, cfg.num_kv_heads, cfg.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation=attention_implementation(cfg)
        )
        return self.o_proj(out.reshape(batch, seq, cfg.num_heads * cfg.head_dim))


class DenseMLP(nnx.Module):
    """``down(silu(x @ gate) * (x @ up))``: the MLP of the layers that are not MoE."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        hidden, ffn = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Dense(hidden, ffn, ("embed", "mlp"), cfg, rngs=rngs)
        self.up_proj = Dense(hidden, ffn, ("embed", "mlp"), cfg, rngs=rngs)
        self.down_proj = Dense(ffn, hidden, ("mlp", "embed"), cfg, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm attention then pre-norm MLP, each with a residual; the MLP an MoE block for
    the layers in ``cfg.moe_layers``."""

    def __init__(self, cfg: DecoderConfig, layer: int, *, rngs: nnx.Rngs, mesh=None):
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg)
        self.self_attn = Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg)
        self.is_moe = cfg.is_moe_layer(layer)
        if self.is_moe:
            self.mlp = jaxmoe.nn.MoE(cfg.moe, rngs=rngs, mesh=mesh)
        else:
            self.mlp = DenseMLP(cfg, rngs=rngs)

    def __call__(self, x, cos, sin) -> tuple[jax.Array, jaxmoe.MoEStats | None]:
        # The scopes name the step profile's shares (examples.qwen3_moe.profile_step).
        with jax.named_scope("attention"):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        hidden = self.post_attention_layernorm(x)
        if self.is_moe:
            y, stats = self.mlp(hidden)
            return x + y, stats
        return x + self.mlp(hidden), None


def _run_layer(layer: DecoderLayer, x, cos, sin):
    return layer(x, cos, sin)


class Qwen3MoE(nnx.Module):
    """The decoder: ``__call__(tokens [B, S]) -> (logits [B, S, V] float32, stats)``.

    ``stats`` is a :class:`jaxmoe.MoEStats` whose leaves are stacked over the MoE layers
    (``tokens_per_expert`` is ``[len(cfg.moe_layers), E]``): add ``stats.aux_loss.sum()`` to
    the training loss. With ``mesh``, the MoE blocks run expert-parallel on it
    (``cfg.moe.ep_axis`` and ``data_axes`` name its axes).

    Attribute names follow the transformers checkpoint (``embed_tokens``, ``layers``,
    ``norm``, ``lm_head``), which :mod:`examples.qwen3_moe.hf_checkpoint` maps key by key.
    """

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs, mesh=None):
        self.cfg = cfg
        self.embed_tokens = _param(
            _normal(rngs, (cfg.vocab_size, cfg.hidden_size), cfg), ("vocab", "embed")
        )
        self.layers = nnx.List(
            [DecoderLayer(cfg, i, rngs=rngs, mesh=mesh) for i in range(cfg.num_layers)]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = Dense(
                cfg.hidden_size, cfg.vocab_size, ("embed", "vocab"), cfg, rngs=rngs
            )

    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, jaxmoe.MoEStats]:
        cfg = self.cfg
        x = jnp.take(self.embed_tokens[...], tokens, axis=0).astype(cfg.dtype)
        cos, sin = rotary_tables(tokens.shape[-1], cfg.head_dim, cfg.rope_theta)
        run = nnx.remat(_run_layer) if cfg.remat else _run_layer
        moe_stats = []
        for layer in self.layers:
            x, stats = run(layer, x, cos, sin)
            if stats is not None:
                moe_stats.append(stats)
        with jax.named_scope("lm_head"):
            x = self.norm(x)
            written = jnp.float32 if cfg.float32_logits else cfg.dtype
            if cfg.tie_word_embeddings:
                head = self.embed_tokens[...].astype(cfg.dtype)
                logits = jnp.einsum("bsh,vh->bsv", x, head, preferred_element_type=written)
            else:
                head = self.lm_head.kernel[...].astype(cfg.dtype)
                logits = jnp.einsum("bsh,hv->bsv", x, head, preferred_element_type=written)
            logits = logits.astype(jnp.float32)
        return logits, jax.tree.map(lambda *leaves: jnp.stack(leaves), *moe_stats)
