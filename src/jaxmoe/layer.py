"""``moe``: the functional MoE layer (router -> permutation -> experts -> combine), and its stats.

The single-device path lives here; with a ``mesh`` the same steps run per shard inside
``shard_map`` (``jaxmoe.parallel``), with an exchange between permutation and experts.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe import losses, permutation
from jaxmoe.config import MoEConfig
from jaxmoe.experts import routed_experts, shared_expert
from jaxmoe.params import check_params
from jaxmoe.router import Routing, route, router_logits


class MoEStats(NamedTuple):
    """What a layer reports besides its output (a pytree; every field a scalar but one).

    Attributes:
      aux_loss: ``aux_loss_coef * load_balancing_loss + seq_aux_loss_coef * seq_aux_loss
        + z_loss_coef * z_loss``: add it to the training loss.
      load_balancing_loss: unweighted, float32 (1.0 at perfect balance).
      seq_aux_loss: unweighted, float32.
      z_loss: unweighted, float32.
      tokens_per_expert: ``[E]`` int32 assignments routed to each expert over the whole batch,
        before any drop (feed it to ``update_expert_bias``).
      dropped_tokens: int32, assignments dropped by a capacity or a receive-buffer bound.
    """

    aux_loss: jax.Array
    load_balancing_loss: jax.Array
    seq_aux_loss: jax.Array
    z_loss: jax.Array
    tokens_per_expert: jax.Array
    dropped_tokens: jax.Array


def check_inputs(params, x, cfg: MoEConfig) -> None:
    """Raises ValueError (naming the argument) for anything ``moe`` cannot take."""
    if not isinstance(cfg, MoEConfig):
        raise ValueError(f"moe: `cfg` must be a jaxmoe.MoEConfig; got {type(cfg).__name__}.")
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


def num_sequences(shape: tuple[int, ...]) -> int:
    """B for ``x`` of shape ``[*B, S, H]``; a 2-D (or 1-D) ``x`` is one sequence."""
    return math.prod(shape[:-2]) if len(shape) >= 3 else 1


def resolve_alignment(cfg: MoEConfig) -> int:
    """``cfg.alignment``, or 128 on GPU (the grouped matmul's row tile) and 1 elsewhere."""
    if cfg.alignment is not None:
        return cfg.alignment
    return 128 if jax.default_backend() == "gpu" else 1


def route_tokens(params, tokens: jax.Array, cfg: MoEConfig, sequences: int):
    """Router logits, routing and loss partial sums for ``tokens[T, H]`` (T = sequences * S)."""
    logits = router_logits(tokens, params["router"]["kernel"])
    routing = route(logits, cfg, params.get("expert_bias"))
    terms = losses.loss_terms(logits, routing.scores, routing.experts, sequences)
    return routing, terms


def finish_stats(terms: losses.LossTerms, tokens_per_expert, dropped, cfg: MoEConfig) -> MoEStats:
    """Turns (globally summed) loss terms and counts into :class:`MoEStats`."""
    load_balancing, seq_aux, z_loss = losses.finish_losses(terms, cfg.num_experts, cfg.top_k)
    aux = (
        cfg.aux_loss_coef * load_balancing
        + cfg.seq_aux_loss_coef * seq_aux
        + cfg.z_loss_coef * z_loss
    )
    return MoEStats(
        aux_loss=aux.astype(jnp.float32),
        load_balancing_loss=load_balancing.astype(jnp.float32),
        seq_aux_loss=seq_aux.astype(jnp.float32),
        z_loss=z_loss.astype(jnp.float32),
        tokens_per_expert=tokens_per_expert.astype(jnp.int32),
        dropped_tokens=jnp.asarray(dropped, jnp.int32),
    )


def moe_local(params, x: jax.Array, cfg: MoEConfig) -> tuple[jax.Array, MoEStats]:
    """The layer on one device (or one data shard): no collectives. See :func:`moe`."""
    with jax.named_scope("jaxmoe"):
        tokens = x.reshape(-1, cfg.hidden_size)
        with jax.named_scope("router"):
            routing, terms = route_tokens(params, tokens, cfg, num_sequences(x.shape))
        compute = tokens.astype(cfg.dtype)
        with jax.named_scope("permute"):
            alignment = resolve_alignment(cfg)
            capacity = cfg.capacity(tokens.shape[0])
            plan = permutation.plan_dispatch(
                routing.experts, cfg.num_experts, alignment=alignment, capacity=capacity
            )
            buffer = permutation.dispatch(compute, plan)
        with jax.named_scope("experts"):
            expert_out = routed_experts(
                buffer,
                plan.group_sizes,
                params["experts"],
                cfg.activation,
                cfg.grouped_matmul_backend,
                block_rows=permutation.capacity_block_rows(capacity, alignment),
            )
        with jax.named_scope("combine"):
            out = permutation.combine(expert_out, routing.weights, plan)
        if cfg.num_shared_experts:
            with jax.named_scope("shared_expert"):
                out = out + shared_expert(compute, params["shared"], cfg.activation)
        stats = finish_stats(terms, plan.tokens_per_expert, plan.dropped, cfg)
    return out.astype(x.dtype).reshape(x.shape), stats


def moe(params, x: jax.Array, cfg: MoEConfig, *, mesh=None) -> tuple[jax.Array, MoEStats]:
    r"""A Mixture-of-Experts feed-forward layer.

    .. math::
        y_t = \sum_{j<K} w_{t,j}\, \mathrm{FFN}_{e_{t,j}}(x_t) + \mathrm{shared}(x_t)

    where ``(w, e) = route(x @ router_kernel)``. Tokens are permuted expert-major
    (:mod:`jaxmoe.permutation`), each expert runs on its block through grouped matmuls, and the
    K outputs of each token are summed back. Dropless unless ``cfg.capacity_factor`` is set.

    Args:
      params: from :func:`jaxmoe.init_params` (shapes checked against ``cfg``).
      x: ``[..., H]`` tokens; a 3-D ``[B, S, H]`` input defines the sequences of
        ``seq_aux_loss``.
      cfg: the layer's :class:`MoEConfig` (static under ``jit``).
      mesh: a ``jax.sharding.Mesh`` for expert parallelism over ``cfg.ep_axis`` (experts) and
        ``(*cfg.data_axes, cfg.ep_axis)`` (batch); ``None`` runs on one device.

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
    check_inputs(params, x, cfg)
    if mesh is not None:
        from jaxmoe.parallel import moe_sharded  # imported lazily: single-device users skip it

        return moe_sharded(params, x, cfg, mesh)
    if cfg.ep_axis is not None:
        raise ValueError(
            f"moe: cfg.ep_axis={cfg.ep_axis!r} needs a `mesh`; pass mesh=... or set ep_axis=None."
        )
    return moe_local(params, x, cfg)


__all__ = ["MoEStats", "Routing", "moe", "moe_local"]
