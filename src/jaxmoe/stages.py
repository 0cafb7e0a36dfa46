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
from jaxmoe.ops.grouped_matmul import pallas_mosaic_tiles
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
      overflow_tokens: int32, assignments that did not fit the expert-parallel fast slots and
        travelled in the dropless overflow windows (0 on one device; see
        ``jaxmoe.parallel.ep_apply_experts``). A count that stays high says routing is far from
        balance: raise ``MoEConfig.ep_fast_slot_factor``.
    """

    aux_loss: jax.Array
    load_balancing_loss: jax.Array
    seq_aux_loss: jax.Array
    z_loss: jax.Array
    tokens_per_expert: jax.Array
    dropped_tokens: jax.Array
    overflow_tokens: jax.Array


class ExpertsResult(NamedTuple):
    """What an experts step returns for its ``[T, H]`` tokens."""

    out: jax.Array  # [T, H] float32: sum_j w[t, j] * FFN_{e[t, j]}(x_t)
    tokens_per_expert: jax.Array  # [E] int32 copies routed to each expert, before any drop
    dropped: jax.Array  # int32 copies dropped by a capacity or buffer bound
    overflow: jax.Array  # int32 copies sent past the fast slots (expert parallelism)


#: ``experts_step(tokens [T, H] in cfg.dtype, routing) -> ExpertsResult``.
ExpertsStep = Callable[[jax.Array, Routing], ExpertsResult]
#: ``reduce_stats(tree) -> tree``: sums a pytree of loss terms and counts over the mesh.
StatsReduction = Callable[[tuple], tuple]


def num_sequences(shape: tuple[int, ...]) -> int:
    """B for ``x`` of shape ``[*B, S, H]``; a 2-D (or 1-D) ``x`` is one sequence."""
    return math.prod(shape[:-2]) if len(shape) >= 3 else 1


# Rows each expert's block is padded to where the bf16 experts run the Mosaic kernels (a Hopper
# GPU, backend None, "auto" or "pallas"). Measured on an H100 (session 13, benchmarks/results/
# raw/h100-run14/call5 and call6, interleaved with 128): the layer's fwd+bwd 1.01-1.02x faster on
# the three presets, the forward within 1%. The forward and dgrad tiles (128 rows) cut by a group
# boundary then run once per group, but the wgrad, whose contraction blocks are 64 rows, drops
# half the padding: Mixtral's routing pads 8192 rows to 8448 instead of 8832.
MOSAIC_ALIGNMENT = 64


def resolve_alignment(cfg: MoEConfig) -> int:
    """``cfg.alignment``; else on a GPU 64 rows where the bf16 experts run the Mosaic kernels
    (``MOSAIC_ALIGNMENT``) and 128 otherwise (the grouped matmuls' row tile); 1 elsewhere."""
    if cfg.alignment is not None:
        return cfg.alignment
    if jax.default_backend() != "gpu":
        return 1
    mosaic = (
        cfg.grouped_matmul_backend in (None, "auto", "pallas")
        and cfg.fp8_recipe is None
        and pallas_mosaic_tiles.hopper_gpu()
    )
    return MOSAIC_ALIGNMENT if mosaic else 128


def route_tokens(params, tokens: jax.Array, cfg: MoEConfig, sequences: int):
    """Router logits, routing and loss partial sums for ``tokens[T, H]`` (T = sequences * S)."""
    logits = router_logits(tokens, params["router"]["kernel"], params["router"].get("bias"))
    routing = route(logits, cfg, params.get("expert_bias"))
    terms = losses.loss_terms(logits, routing.scores, routing.experts, sequences)
    return routing, terms


def finish_stats(
    cfg: MoEConfig, terms: losses.LossTerms, tokens_per_expert, dropped, overflow
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
        device.

    Returns:
      ``(y, stats)`` as :func:`jaxmoe.moe`.
    """
    with jax.named_scope("jaxmoe"):
        tokens = x.reshape(-1, cfg.hidden_size)
        with jax.named_scope("router"):
            routing, terms = route_tokens(params, tokens, cfg, num_sequences(x.shape))
        compute = tokens.astype(cfg.dtype)
        out, *counts = experts_step(compute, routing)
        if cfg.num_shared_experts:
            with jax.named_scope("shared_expert"):
                out = out + shared_expert(
                    compute, params["shared"], cfg.activation, cfg.swiglu_alpha, cfg.swiglu_limit
                )
        with jax.named_scope("stats"):
            if reduce_stats is not None:
                terms, counts = reduce_stats((terms, counts))
                if x.ndim < 3:
                    # A 2-D x is one sequence spread over the devices: its sequence loss is
                    # the global balancing loss, not the sum of the shards' own.
                    load_balancing = losses.finish_losses(terms, cfg.num_experts, cfg.top_k)[0]
                    terms = terms._replace(
                        seq_loss_sum=load_balancing, num_sequences=jnp.ones((), jnp.float32)
                    )
            stats = finish_stats(cfg, terms, *counts)
    return out.astype(x.dtype).reshape(x.shape), stats
