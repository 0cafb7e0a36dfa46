"""Plain JAX MoE layers for the layer benchmark: the float32 per-expert reference (what every
peer is checked against) and the dense peer (every expert on every token, masked)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.bench.presets import LayerPreset


def _route_dense(router_kernel, x, top_k: int) -> jax.Array:
    """``[T, E]`` combine weights: softmax over each token's top-K logits, zero elsewhere."""
    logits = jnp.dot(x.astype(jnp.float32), router_kernel.astype(jnp.float32))
    top_logits, top_experts = jax.lax.top_k(logits, top_k)
    weights = jax.nn.softmax(top_logits, axis=-1)
    one_hot = jax.nn.one_hot(top_experts, logits.shape[-1], dtype=jnp.float32)  # [T, K, E]
    return jnp.einsum("tk,tke->te", weights, one_hot)


def reference_layer(params: dict, x: jax.Array, top_k: int) -> jax.Array:
    """Float32 reference, one expert at a time (memory ``O(T*F)``): ``[T, H] -> [T, H]`` f32."""
    f32 = jnp.float32
    x = x.astype(f32)
    combine_weights = _route_dense(params["router"]["kernel"], x, top_k)
    experts = jax.tree.map(lambda w: w.astype(f32), params["experts"])
    hp = jax.lax.Precision.HIGHEST

    def one_expert(acc, args):
        w_gate, w_up, w_down, weight = args
        hidden = jax.nn.silu(jnp.dot(x, w_gate, precision=hp)) * jnp.dot(x, w_up, precision=hp)
        return acc + jnp.dot(hidden, w_down, precision=hp) * weight[:, None], None

    xs = (experts["w_gate"], experts["w_up"], experts["w_down"], combine_weights.T)
    out, _ = jax.lax.scan(one_expert, jnp.zeros_like(x), xs)
    return out


def dense_layer(params: dict, x: jax.Array, top_k: int) -> jax.Array:
    """Every expert on every token (in ``x``'s dtype, float32 accumulation), masked and summed."""
    dtype = x.dtype
    experts = params["experts"]
    combine_weights = _route_dense(params["router"]["kernel"], x, top_k)

    def matmul(spec, lhs, rhs):
        # No preferred_element_type: XLA's CPU dot has no bf16 x bf16 -> f32 (GPUs accumulate in
        # float32 either way).
        return jnp.einsum(spec, lhs, rhs.astype(dtype))

    gate = matmul("th,ehf->etf", x, experts["w_gate"])
    up = matmul("th,ehf->etf", x, experts["w_up"])
    out = matmul("etf,efh->eth", jax.nn.silu(gate) * up, experts["w_down"])
    return jnp.einsum("eth,te->th", out.astype(jnp.float32), combine_weights).astype(dtype)


def dense_bytes(preset: LayerPreset, itemsize: int) -> int:
    """Live bytes of the dense layer's forward+backward: gate, up, hidden, out (+ cotangents)."""
    per_expert = preset.tokens * (3 * preset.ffn_size + 2 * preset.hidden_size)
    return 2 * preset.num_experts * per_expert * itemsize
