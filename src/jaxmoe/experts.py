"""Expert feed-forward networks: the routed experts (grouped matmuls) and the shared expert."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.ops.fp8 import fp8_grouped_matmul
from jaxmoe.ops.gated_grouped_matmul import gated_ffn
from jaxmoe.ops.gated_grouped_matmul.base import GATE_ACTIVATIONS
from jaxmoe.ops.grouped_matmul import grouped_matmul


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
    return activation in ("swiglu", "geglu")


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
) -> jax.Array:
    """Applies expert ``e``'s FFN to its block of rows of the expert-major ``buffer``.

    Gated: ``(act(x @ w_gate[e]) * (x @ w_up[e])) @ w_down[e]``; plain:
    ``act(x @ w_up[e]) @ w_down[e]``. Zero rows stay zero (act(0) = 0 for every activation).
    The gated grouped (not capacity-block, not FP8) path is
    :func:`jaxmoe.ops.gated_grouped_matmul.gated_ffn`: on a Hopper GPU with ``backend``
    None/``"auto"`` a fused gate/up kernel where it applies, the same grouped matmuls and product
    otherwise.

    Args:
      buffer: ``[R, H]`` rows sorted expert-major.
      group_sizes: ``[E_local]`` rows per expert block.
      weights: ``{"w_gate": [E_local, H, F] (gated), "w_up": [E_local, H, F],
        "w_down": [E_local, F, H]}``.
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

    Returns:
      ``[R, H]``.
    """
    act = activation_fn(activation)
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

        if _gated(activation):  # one op, fused into kernels where they apply
            return gated_ffn(
                blocks,
                *(weights[name].astype(dtype) for name in ("w_gate", "w_up", "w_down")),
                group_sizes,
                activation=activation,
                backend=backend,
            )

    up = matmul(blocks, "w_up")
    hidden = act(matmul(blocks, "w_gate")) * up if _gated(activation) else act(up)
    return matmul(hidden, "w_down").reshape(buffer.shape)


def shared_expert(x: jax.Array, weights: dict, activation: str) -> jax.Array:
    """The dense FFN every token goes through: ``[T, H] -> [T, H]``."""
    act = activation_fn(activation)
    dtype = x.dtype
    up = jnp.dot(x, weights["w_up"].astype(dtype))
    if _gated(activation):
        hidden = act(jnp.dot(x, weights["w_gate"].astype(dtype))) * up
    else:
        hidden = act(up)
    return jnp.dot(hidden, weights["w_down"].astype(dtype))
