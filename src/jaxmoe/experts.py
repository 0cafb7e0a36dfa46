"""Expert feed-forward networks: the routed experts (grouped matmuls) and the shared expert."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.ops.fp8 import fp8_grouped_matmul
from jaxmoe.ops.gated_grouped_matmul import gated_ffn
from jaxmoe.ops.gated_grouped_matmul.base import GATE_ACTIVATIONS
from jaxmoe.ops.grouped_matmul import grouped_matmul
from jaxmoe.ops.grouped_matmul.base import group_ids

# The routed experts' bias of each projection (``MoEConfig.expert_ffn_bias``).
PROJECTION_BIASES = {"w_gate": "b_gate", "w_up": "b_up", "w_down": "b_down"}


def activation_fn(name: str):
    """The nonlinearity of an activation name (GELU is the tanh approximation)."""
    if name in GATE_ACTIVATIONS:
        return GATE_ACTIVATIONS[name]
    if name == "gelu":  # geglu's nonlinearity, ungated
        return GATE_ACTIVATIONS["geglu"]
    if name == "relu":
        return jax.nn.relu
    raise ValueError(f"unknown activation {name!r}")


def _gated(activation: str) -> bool:
    return activation in ("swiglu", "geglu", "swiglu_clamped")


def gated_hidden(
    gate: jax.Array,
    up: jax.Array,
    activation: str,
    swiglu_alpha: float | None = None,
    swiglu_limit: float | None = None,
) -> jax.Array:
    """A gated FFN's hidden activations from its two projections.

    ``act(gate) * up`` for ``"swiglu"``/``"geglu"``; for ``"swiglu_clamped"`` (gpt-oss's, both
    constants required): ``g = min(gate, limit)``, ``u = clip(up, -limit, limit)``,
    ``(u + 1) * g * sigmoid(alpha * g)``. Every form maps ``gate = 0`` to 0. The clamps pass
    no gradient where they bind (as ``torch.clamp``).
    """
    if activation != "swiglu_clamped":
        return activation_fn(activation)(gate) * up
    if swiglu_alpha is None or swiglu_limit is None:
        raise ValueError(
            "gated_hidden: activation='swiglu_clamped' needs `swiglu_alpha` and `swiglu_limit` "
            f"(got {swiglu_alpha!r}, {swiglu_limit!r}); pass MoEConfig.swiglu_alpha/swiglu_limit."
        )
    gate = jnp.minimum(gate, jnp.asarray(swiglu_limit, gate.dtype))
    up = jnp.clip(up, -swiglu_limit, swiglu_limit).astype(up.dtype)
    return (up + 1) * (gate * jax.nn.sigmoid(gate * jnp.asarray(swiglu_alpha, gate.dtype)))


def _add_row_bias(out: jax.Array, bias: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """``out[r] + bias[e]`` for each row ``r`` of expert block ``e``; rows past every block
    (past ``sum(group_sizes)``) stay as they are (zero), and take no gradient into ``bias``."""
    padded = jnp.concatenate([bias, jnp.zeros((1, bias.shape[-1]), bias.dtype)])
    return out + padded[group_ids(group_sizes, out.shape[0])]


def routed_experts(
    buffer: jax.Array,
    group_sizes: jax.Array,
    weights: dict,
    activation: str,
    backend=None,
    *,
    block_rows: int | None = None,
    fp8_recipe: str | None = None,
    fp8_weights: dict | None = None,
    buffer_fp8: tuple[jax.Array, jax.Array] | None = None,
    swiglu_alpha: float | None = None,
    swiglu_limit: float | None = None,
) -> jax.Array:
    """Applies expert ``e``'s FFN to its block of rows of the expert-major ``buffer``.

    Gated: ``gated_hidden(x @ w_gate[e], x @ w_up[e]) @ w_down[e]`` (:func:`gated_hidden`);
    plain: ``act(x @ w_up[e]) @ w_down[e]``. With the biases ``b_gate``/``b_up``/``b_down`` in
    ``weights`` (``MoEConfig.expert_ffn_bias``) each projection adds its expert's bias row. Rows
    past ``sum(group_sizes)`` stay zero; without biases every zero row does (act(0) = 0).
    The gated grouped (not capacity-block, not FP8) path of ``"swiglu"``/``"geglu"`` without
    biases is :func:`jaxmoe.ops.gated_grouped_matmul.gated_ffn`: on a Hopper GPU with
    ``backend`` None/``"auto"`` a fused gate/up kernel where it applies, the same grouped matmuls
    and product otherwise. That kernel has neither a bias epilogue nor the clamped activation, so
    biases and ``"swiglu_clamped"`` always take the unfused form: the grouped matmuls on
    ``backend`` (any backend, FP8 included), the biases and activation in ``jnp`` between them.

    Args:
      buffer: ``[R, H]`` rows sorted expert-major.
      group_sizes: ``[E_local]`` rows per expert block.
      weights: ``{"w_gate": [E_local, H, F] (gated), "w_up": [E_local, H, F],
        "w_down": [E_local, F, H]}``, with expert biases also ``"b_gate": [E_local, F]`` (gated),
        ``"b_up": [E_local, F]``, ``"b_down": [E_local, H]``.
      activation: a ``MoEConfig.activation`` name.
      backend: grouped matmul backend (see ``grouped_matmul``).
      block_rows: when every expert has a block of exactly this many rows (capacity mode,
        ``R = E_local * block_rows``), the experts run as one batched matmul instead: the same
        result without ragged bookkeeping (``backend`` is then unused).
      fp8_recipe: ``None`` (matmuls in ``buffer``'s dtype) or an FP8 recipe
        (``MoEConfig.fp8_recipe``): every expert matmul is then
        :func:`jaxmoe.ops.fp8.fp8_grouped_matmul` on ``backend``, capacity blocks included
        (``block_rows`` is then unused). The buffer's cast comes from ``buffer_fp8`` where the
        caller made it (the layer: each token once, before the permutation), else the op's.
      fp8_weights: with ``fp8_recipe``, ``None`` or ``{name: Fp8Weights}`` for some of
        ``weights`` (:func:`jaxmoe.quantize_expert_weights`, made from ``weights`` cast to
        ``buffer``'s dtype): those matmuls read their FP8 weights from it instead of quantizing.
      buffer_fp8: with ``fp8_recipe``, ``None`` or ``buffer`` already quantized for it
        (``quantize(buffer, recipe.lhs_blocks, recipe.dtype)``, e.g. the permutation of the
        quantized tokens): the gate and up matmuls read it instead of quantizing ``buffer``.
      swiglu_alpha, swiglu_limit: the constants of ``"swiglu_clamped"`` (required by it).

    Returns:
      ``[R, H]``.
    """
    dtype = buffer.dtype
    if fp8_recipe is not None:  # capacity blocks too: there group_sizes are the full blocks
        blocks = buffer
        cached = fp8_weights or {}

        def matmul(lhs, name):
            return fp8_grouped_matmul(
                lhs,
                weights[name].astype(dtype),
                group_sizes,
                recipe=fp8_recipe,
                backend=backend,
                rhs_fp8=cached.get(name),
                lhs_fp8=buffer_fp8 if lhs is blocks else None,
            )
    elif block_rows is not None:
        num_experts = weights["w_up"].shape[0]
        blocks = buffer.reshape(num_experts, block_rows, buffer.shape[-1])

        def matmul(lhs, name):
            return jnp.einsum(
                "ecm,emn->ecn", lhs, weights[name].astype(dtype), preferred_element_type=jnp.float32
            ).astype(dtype)
    else:
        blocks = buffer

        def matmul(lhs, name):
            return grouped_matmul(lhs, weights[name].astype(dtype), group_sizes, backend=backend)

        if activation in GATE_ACTIVATIONS and "b_up" not in weights:
            # One op, fused into kernels where they apply (no biases, an activation they have).
            return gated_ffn(
                blocks,
                *(weights[name].astype(dtype) for name in ("w_gate", "w_up", "w_down")),
                group_sizes,
                activation=activation,
                backend=backend,
            )

    def project(lhs, name):
        out = matmul(lhs, name)
        bias = weights.get(PROJECTION_BIASES[name])
        if bias is None:
            return out
        if out.ndim == 3:  # capacity blocks [E_local, block_rows, N]
            return out + bias.astype(dtype)[:, None, :]
        return _add_row_bias(out, bias.astype(dtype), group_sizes)

    up = project(blocks, "w_up")
    if _gated(activation):
        gate = project(blocks, "w_gate")
        hidden = gated_hidden(gate, up, activation, swiglu_alpha, swiglu_limit)
    else:
        hidden = activation_fn(activation)(up)
    return project(hidden, "w_down").reshape(buffer.shape)


def shared_expert(
    x: jax.Array,
    weights: dict,
    activation: str,
    swiglu_alpha: float | None = None,
    swiglu_limit: float | None = None,
) -> jax.Array:
    """The dense FFN every token goes through: ``[T, H] -> [T, H]``.

    With ``weights["output_gate"]`` (``[H, 1]``, ``MoEConfig.shared_expert_gate``; Qwen2-MoE)
    the output is scaled per token by ``sigmoid(x @ output_gate)``, computed in ``x``'s dtype.
    """
    dtype = x.dtype
    up = jnp.dot(x, weights["w_up"].astype(dtype))
    if _gated(activation):
        gate = jnp.dot(x, weights["w_gate"].astype(dtype))
        hidden = gated_hidden(gate, up, activation, swiglu_alpha, swiglu_limit)
    else:
        hidden = activation_fn(activation)(up)
    out = jnp.dot(hidden, weights["w_down"].astype(dtype))
    if "output_gate" in weights:
        out = out * jax.nn.sigmoid(jnp.dot(x, weights["output_gate"].astype(dtype)))
    return out
