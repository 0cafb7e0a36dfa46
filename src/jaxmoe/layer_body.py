r"""The layer's body, shared by one device and expert parallelism.

Both paths run the same stages on their tokens; only the experts step differs::

    x[..., H] -> tokens[T, H] --route--> (routing, loss terms)
                             --experts_step--> out[T, H]      (one device: dispatch -> experts ->
                                                               combine; expert parallelism: the
                                                               same with the exchange in between)
                             --+ shared expert, stats--> (y, MoEStats)

:func:`moe_body` is that outline; ``jaxmoe.layer`` (one device) and ``jaxmoe.parallel.sharded``
(inside ``shard_map``) call it with their experts step and, for the sharded path, a reduction
of the loss terms and counts over the mesh.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxmoe import losses
from jaxmoe.config import MoEConfig
from jaxmoe.experts import shared_expert
from jaxmoe.ops.grouped_matmul import preferred_alignment
from jaxmoe.router import Routing, route, router_logits


class MoEStats(NamedTuple):
    """What a layer reports besides its output (a pytree; every field a scalar but two).

    Attributes:
      aux_loss: ``aux_loss_coef * load_balancing_loss + seq_aux_loss_coef * seq_aux_loss
        + z_loss_coef * z_loss``: add it to the training loss.
      load_balancing_loss: unweighted, float32 (1.0 at perfect balance).
      seq_aux_loss: unweighted, float32.
      z_loss: unweighted, float32.
      tokens_per_expert: ``[E]`` int32 assignments routed to each expert over the whole batch,
        before any drop (feed it to ``update_expert_bias``).
      dropped_tokens: int32, assignments dropped by a capacity or a receive-buffer bound.
      overflow_tokens: int32, assignments that did not fit the expert-parallel fast slots and
        travelled in the dropless overflow windows (0 on one device; see
        ``jaxmoe.parallel.ep_apply_experts``). A count that stays high says routing is far from
        balance: raise ``MoEConfig.ep_fast_slot_factor``.
      dropped_tokens_per_sequence: ``[B]`` int32, ``dropped_tokens`` of each sequence of ``x``
        (``[*B, S, H]``, leading dims flattened; a 2-D ``x`` is one sequence); sums to
        ``dropped_tokens``. Which sequences lose copies is the capacity's drop policy
        (``MoEConfig.capacity_drop_policy``).
    """

    aux_loss: jax.Array
    load_balancing_loss: jax.Array
    seq_aux_loss: jax.Array
    z_loss: jax.Array
    tokens_per_expert: jax.Array
    dropped_tokens: jax.Array
    overflow_tokens: jax.Array
    dropped_tokens_per_sequence: jax.Array


class ExpertsResult(NamedTuple):
    """What an experts step returns for its ``[T, H]`` tokens."""

    out: jax.Array  # [T, H] float32: sum_j w[t, j] * FFN_{e[t, j]}(x_t)
    tokens_per_expert: jax.Array  # [E] int32 copies routed to each expert, before any drop
    dropped: jax.Array  # int32 copies dropped by a capacity or buffer bound
    overflow: jax.Array  # int32 copies sent past the fast slots (expert parallelism)
    dropped_per_token: jax.Array  # [T] int32 each token's dropped copies (sums to `dropped`)


#: ``experts_step(tokens [T, H] in cfg.dtype, routing) -> ExpertsResult``.
ExpertsStep = Callable[[jax.Array, Routing], ExpertsResult]
#: ``reduce_stats(tree) -> tree``: sums a pytree of loss terms and counts over the mesh.
StatsReduction = Callable[[tuple], tuple]


def num_sequences(shape: tuple[int, ...]) -> int:
    """B for ``x`` of shape ``[*B, S, H]``; a 2-D (or 1-D) ``x`` is one sequence."""
    return math.prod(shape[:-2]) if len(shape) >= 3 else 1


def sequence_length(shape: tuple[int, ...], group_tokens: int) -> int:
    """S for ``x`` of shape ``[*B, S, H]``; for a 2-D (or 1-D) ``x``, whose tokens are one
    sequence, ``group_tokens``: all the tokens that one capacity counts (those of one device,
    or of an expert-parallel group)."""
    return shape[-2] if len(shape) >= 3 else group_tokens


def per_sequence(per_token: jax.Array, sequences: int) -> jax.Array:
    """``[T] -> [B]``: the sums over each sequence of ``[B, S]`` tokens laid out in order."""
    if sequences == 0:
        return jnp.zeros((0,), per_token.dtype)
    return jnp.sum(per_token.reshape(sequences, -1 if per_token.size else 0), axis=1)


def resolve_alignment(cfg: MoEConfig) -> int:
    """``cfg.alignment``; else what the experts' grouped matmul prefers for its backend and
    operands (:func:`jaxmoe.ops.grouped_matmul.preferred_alignment`: 1 off a GPU; on a GPU 64
    rows where the bf16 experts run the Mosaic kernels, 128 otherwise)."""
    if cfg.alignment is not None:
        return cfg.alignment
    operand_dtype = jnp.float8_e4m3fn if cfg.fp8_recipe is not None else cfg.dtype
    return preferred_alignment(cfg.grouped_matmul_backend, operand_dtype)


def route_tokens(params, tokens: jax.Array, cfg: MoEConfig, sequences: int):
    """Router logits, routing and loss partial sums for ``tokens[T, H]`` (T = sequences * S)."""
    logits = router_logits(tokens, params["router"]["kernel"], params["router"].get("bias"))
    routing = route(logits, cfg, params.get("expert_bias"))
    terms = losses.loss_terms(logits, routing.scores, routing.experts, sequences)
    return routing, terms


def finish_stats(
    cfg: MoEConfig,
    terms: losses.LossTerms,
    tokens_per_expert,
    dropped,
    overflow,
    dropped_per_sequence,
) -> MoEStats:
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
        overflow_tokens=jnp.asarray(overflow, jnp.int32),
        dropped_tokens_per_sequence=jnp.asarray(dropped_per_sequence, jnp.int32),
    )


def moe_body(
    params,
    x: jax.Array,
    cfg: MoEConfig,
    experts_step: ExpertsStep,
    reduce_stats: StatsReduction | None = None,
) -> tuple[jax.Array, MoEStats]:
    """Routes ``x``'s tokens, runs ``experts_step`` and the shared expert, and reports stats.

    Args:
      params: the layer's parameters (the router's and shared expert's are read here; the
        experts step reads the routed experts' itself).
      x: ``[..., H]`` the tokens of this device (all of them on one device).
      cfg: the layer's config.
      experts_step: see :data:`ExpertsStep`.
      reduce_stats: sums the loss terms and counts over the devices of a mesh; ``None`` on one
        device. ``dropped_tokens_per_sequence`` of a ``[..., S, H]`` ``x`` stays this device's
        (each device holds whole sequences: the caller lays it out over the batch axes); for a
        2-D ``x``, one sequence over the devices, it is summed.

    Returns:
      ``(y, stats)`` as :func:`jaxmoe.moe`.
    """
    with jax.named_scope("jaxmoe"):
        tokens = x.reshape(-1, cfg.hidden_size)
        with jax.named_scope("router"):
            routing, terms = route_tokens(params, tokens, cfg, num_sequences(x.shape))
        compute = tokens.astype(cfg.dtype)
        out, *counts, dropped_per_token = experts_step(compute, routing)
        dropped_per_sequence = per_sequence(dropped_per_token, num_sequences(x.shape))
        if cfg.num_shared_experts:
            with jax.named_scope("shared_expert"):
                out = out + shared_expert(
                    compute, params["shared"], cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit
                )
        with jax.named_scope("stats"):
            if reduce_stats is not None:
                terms, counts = reduce_stats((terms, counts))
                if x.ndim < 3:
                    dropped_per_sequence = reduce_stats(dropped_per_sequence)
                    # A 2-D x is one sequence spread over the devices: its sequence loss is
                    # the global balancing loss, not the sum of the shards' own.
                    load_balancing = losses.finish_losses(terms, cfg.num_experts, cfg.top_k)[0]
                    terms = terms._replace(
                        seq_loss_sum=load_balancing, num_sequences=jnp.ones((), jnp.float32)
                    )
            stats = finish_stats(cfg, terms, *counts, dropped_per_sequence)
    return out.astype(x.dtype).reshape(x.shape), stats
