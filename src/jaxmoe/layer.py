"""``moe``: the functional MoE layer (router -> permutation -> experts -> combine).

Both the one-device path and the expert-parallel one (``mesh=...``) are thin callers of
:func:`jaxmoe.layer_body.moe_body`; this module adds the one-device experts step and the checks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe import permutation
from jaxmoe.argument_checks import as_array, is_tracer
from jaxmoe.config import MoEConfig
from jaxmoe.experts import routed_experts
from jaxmoe.fp8_experts import check_expert_fp8_weights
from jaxmoe.layer_body import (
    ExpertsResult,
    MoEStats,
    moe_body,
    resolve_alignment,
    sequence_length,
)
from jaxmoe.ops.fp8 import quantize, resolve_recipe
from jaxmoe.parallel.sharded import moe_sharded
from jaxmoe.params import check_params
from jaxmoe.router import Routing

_STATIC_FIX = (
    "it is static, not an array: mark it static, jax.jit(jaxmoe.moe, static_argnames={names}), "
    "or close over it, jax.jit(lambda params, x: jaxmoe.moe(params, x, cfg, mesh=mesh))."
)


def check_static(cfg, mesh) -> None:
    """Raises ValueError when ``cfg`` is not a config or ``mesh`` not a mesh (e.g. a tracer:
    ``jax.jit(jaxmoe.moe)`` traces every argument)."""
    if is_tracer(cfg):
        raise ValueError(
            f"moe: `cfg` was traced ({type(cfg).__name__}); " + _STATIC_FIX.format(names='"cfg"')
        )
    if not isinstance(cfg, MoEConfig):
        raise ValueError(f"moe: `cfg` must be a jaxmoe.MoEConfig; got {type(cfg).__name__}.")
    if is_tracer(mesh):
        raise ValueError(
            f"moe: `mesh` was traced ({type(mesh).__name__}); "
            + _STATIC_FIX.format(names='("cfg", "mesh")')
        )
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise ValueError(
            f"moe: `mesh` must be a jax.sharding.Mesh or None; got {type(mesh).__name__}. "
            "Build one with jax.make_mesh(shape, axis_names)."
        )


def check_inputs(params, x, cfg: MoEConfig) -> None:
    """Raises ValueError (naming the argument) for anything ``moe`` cannot take."""
    shape = np.shape(x)
    if len(shape) == 0 or shape[-1] != cfg.hidden_size:
        raise ValueError(
            f"moe: `x` must have shape [..., hidden_size={cfg.hidden_size}]; got {shape}. "
            "Check MoEConfig.hidden_size against the model width."
        )
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise ValueError(
            f"moe: `x` must be floating point; got dtype {jnp.result_type(x)}. "
            "Cast it, e.g. x.astype(jnp.float32)."
        )
    check_params(params, cfg)


def _dispatch_quantized(tokens, plan, cfg: MoEConfig):
    """With an FP8 recipe, the expert-major buffer's FP8 rows and scales, made by quantizing each
    token once and permuting the FP8 rows (per-row scales commute with copying rows): ``T``
    rows quantized instead of ``T * K``, and one byte per element moved instead of two. The
    same bits as quantizing the buffer (its zero rows give zeros either way)."""
    if cfg.fp8_recipe is None:
        return None
    recipe = resolve_recipe(cfg.fp8_recipe, "moe")
    # No gradient flows here: the matmuls' lhs (the bf16 buffer) takes it.
    q, scale = jax.lax.stop_gradient(quantize(tokens, recipe.lhs_blocks, recipe.dtype))
    return permutation.dispatch(q, plan), permutation.dispatch(scale, plan)


def local_experts_step(params, cfg: MoEConfig, fp8_weights=None, sequence_length=None):
    """The experts step of one device: dispatch -> grouped-matmul experts -> combine.

    ``sequence_length``: S of the tokens' ``[B, S]`` order, for the capacity's drop policy
    (``None``: the tokens are one sequence)."""

    def step(tokens: jax.Array, routing: Routing) -> ExpertsResult:
        with jax.named_scope("permute"):
            alignment = resolve_alignment(cfg)
            capacity = cfg.capacity(tokens.shape[0])
            plan = permutation.plan_dispatch(
                routing.experts,
                cfg.num_experts,
                alignment=alignment,
                capacity=capacity,
                drop_policy=cfg.capacity_drop_policy,
                sequence_length=sequence_length,
                weights=routing.weights,
            )
            buffer = permutation.dispatch(tokens, plan)
            buffer_fp8 = _dispatch_quantized(tokens, plan, cfg)
        with jax.named_scope("experts"):
            expert_out = routed_experts(
                buffer,
                plan.group_sizes,
                params["experts"],
                cfg.activation,
                cfg.grouped_matmul_backend,
                block_rows=permutation.capacity_block_rows(capacity, alignment),
                fp8_recipe=cfg.fp8_recipe,
                fp8_weights=fp8_weights,
                buffer_fp8=buffer_fp8,
                swiglu_alpha=cfg.swiglu_alpha,
                swiglu_limit=cfg.swiglu_limit,
            )
        with jax.named_scope("combine"):
            out = permutation.combine(expert_out, routing.weights, plan)
        return ExpertsResult(
            out,
            plan.tokens_per_expert,
            plan.dropped,
            jnp.zeros((), jnp.int32),
            plan.dropped_per_token,
        )

    return step


def moe_local(params, x: jax.Array, cfg: MoEConfig, fp8_weights=None) -> tuple[jax.Array, MoEStats]:
    """The layer on one device (or one data shard): no collectives. See :func:`moe`."""
    length = sequence_length(x.shape, math.prod(x.shape[:-1]))
    return moe_body(params, x, cfg, local_experts_step(params, cfg, fp8_weights, length))


def moe(
    params, x: jax.Array, cfg: MoEConfig, *, mesh=None, fp8_weights=None
) -> tuple[jax.Array, MoEStats]:
    r"""A Mixture-of-Experts feed-forward layer.

    .. math::
        y_t = \sum_{j<K} w_{t,j}\, \mathrm{FFN}_{e_{t,j}}(x_t) + \mathrm{shared}(x_t)

    where ``(w, e) = route(x @ router_kernel)`` (``+ router_bias`` with ``cfg.router_bias``), and
    ``shared`` is scaled by ``sigmoid(x @ output_gate)`` with ``cfg.shared_expert_gate``. Tokens
    are permuted expert-major (:mod:`jaxmoe.permutation`), each expert runs on its block through
    grouped matmuls, and the K outputs of each token are summed back. Dropless unless
    ``cfg.capacity_factor`` is set.

    Args:
      params: from :func:`jaxmoe.init_params` (shapes checked against ``cfg``).
      x: ``[..., H]`` tokens (an array, or a nested list that ``jnp.asarray`` converts); a 3-D
        ``[B, S, H]`` input defines the sequences of ``seq_aux_loss``. Zero tokens (e.g.
        ``[0, H]`` or ``[0, S, H]``) is valid: ``y`` is empty, every loss and count 0.
      cfg: the layer's :class:`MoEConfig`, static under ``jit``
        (``jax.jit(jaxmoe.moe, static_argnames="cfg")``, or a closure), as is ``mesh``.
      mesh: a ``jax.sharding.Mesh`` for expert parallelism over ``cfg.ep_axis`` (experts) and
        ``(*cfg.data_axes, cfg.ep_axis)`` (batch); ``None`` runs on one device.
      fp8_weights: ``None``, or with ``cfg.fp8_recipe`` the routed experts' weights already in
        FP8, ``jaxmoe.quantize_expert_weights(params, cfg)``: the expert matmuls then read them
        instead of quantizing ``params["experts"]`` on every call, forward and backward. Made
        once per optimizer step and reused by its micro-batches, it gives bit for bit the layer
        without it, gradients of ``params`` included; a stale one (made before the last update)
        silently runs the previous step's weights. With ``mesh``, pass it with ``E`` over
        ``cfg.ep_axis`` (as the expert weights; it is laid out so if not).

    Returns:
      ``(y, stats)``: ``y`` has ``x``'s shape and dtype; ``stats`` is a :class:`MoEStats`.
      Differentiable in ``x`` and every parameter (``expert_bias`` gets a zero gradient).

    Example::

      cfg = jaxmoe.MoEConfig(num_experts=8, top_k=2, hidden_size=64, ffn_size=128)
      params = jaxmoe.init_params(jax.random.key(0), cfg)
      y, stats = jax.jit(jaxmoe.moe, static_argnames="cfg")(params, x, cfg=cfg)
      loss = task_loss(y) + stats.aux_loss

    References: Shazeer et al. 2017; Lepikhin et al. 2020 (GShard); Fedus et al. 2021 (Switch);
    Gale et al. 2022 (MegaBlocks, dropless); DeepSeek-AI 2024 (DeepSeek-V3).
    """
    check_static(cfg, mesh)
    x = as_array(x, "x", "moe")
    check_inputs(params, x, cfg)
    if fp8_weights is not None:
        check_expert_fp8_weights(fp8_weights, params, cfg)
    if mesh is not None:
        return moe_sharded(params, x, cfg, mesh, fp8_weights)
    if cfg.ep_axis is not None:
        raise ValueError(
            f"moe: cfg.ep_axis={cfg.ep_axis!r} needs a `mesh`; pass mesh=... or set ep_axis=None."
        )
    return moe_local(params, x, cfg, fp8_weights)


__all__ = ["MoEStats", "Routing", "moe", "moe_local"]
