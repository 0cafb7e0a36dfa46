r"""Expert parallelism, the exchange-level API: :func:`ep_dispatch`, :func:`ep_combine` and
:func:`ep_apply_experts` (both around an expert function, with the dropless fast path).

Experts are split over the mesh axis ``axis_name`` (``ep`` ranks, ``E_l = E / ep`` experts each,
rank ``d`` owns experts ``[d*E_l, (d+1)*E_l)``). Each rank routes its own ``T`` tokens, then::

    x[T, H] --permute--> send[ep, P, H] --exchange--> recv[ep, P, H] --sort--> buffer[R, H]
       (slot d: my copies for rank d,      (slot s: rank s's copies       (expert-major blocks
        expert-major, token order)          for my experts)                 for grouped_matmul)

:func:`ep_combine` runs the same path backwards (gathers and the reverse exchange) and sums each
token's K weighted outputs. Every step is a gather or a permutation, and every exchange's VJP is
the reverse exchange, so gradients are deterministic (no scatter-add).

Counts stay on the device: each rank's ``[E]`` counts are all-gathered over the ep axis (a tiny
``[ep, E]`` int32 collective), and every rank derives the whole layout from them.

**Order and drops.** Within an expert's block, copies come sender by sender in rank order, and
in token order within a sender: the token order of the ep group, as on one device. Two bounds
can drop copies, each counted in ``dropped`` (never silent):

1. capacity ``C`` (per expert, over the ep group's tokens): an expert keeps the first ``C``
   copies in the claim order of the drop policy over the ep group's tokens
   (:func:`jaxmoe.parallel.layout.capacity_keep`; ``"position"`` over one sequence: that
   token order);
2. the slot bound ``P``: the rows one sender can put in one receiver's slot. Within a slot the
   copies are ordered by expert then token; copies past the first ``P`` are dropped (the last
   experts' last tokens of that sender) -- unless :func:`ep_apply_experts` sends them in later
   windows of ``P`` (its dropless mode; :func:`ep_dispatch`'s ``window``).

**Memory (receive buffer).** ``ep * P`` rows of ``H`` per rank (and as many to send), with

* dropless through :func:`ep_apply_experts` (the layer's default): ``P = ceil(f*T*K / ep)``,
  ``f = fast_slot_factor`` (1.125), about ``f*T*K`` rows; overflow windows reuse that size;
* dropless with ``fast_slot_factor=None``: ``P = T*K``, so ``ep * T * K`` rows: the worst case,
  all copies of all ranks to one rank;
* ``receive_factor=f``: ``P = min(T*K, ceil(ceil(f*T*K) / ep))``, about ``f*T*K`` rows (e.g.
  ``f = 1.25`` leaves 25% headroom over perfect balance);
* capacity ``C``: ``P = min(T*K, E_l * min(T, C))`` (no extra drops), then the ``f`` bound if set.

The expert-major ``buffer`` has ``R = ep*P + E_l*(alignment-1)`` rows rounded up to
``alignment`` (dropless), or ``E_l * round_up(C, alignment)`` (capacity); past its blocks it holds
zeros (NaN under ``JAXMOE_POISON``).

**Token dispatch.** ``ep_apply_experts(dispatch="tokens")`` (``MoEConfig.ep_dispatch``)
sends one row per (token, destination rank) pair instead of one per copy, with the token's local
expert ids and weights; the receiver expands pairs into this module's expert-major buffer and
sums each pair's weighted outputs before the return exchange. Slots hold
``P_pairs = min(T, ceil(f * T * (1 - C(E-E_l, K) / C(E, K))))`` pairs and at most
``Q = ceil(f*T*K/ep)`` copies per window (``T`` vs ``2.25 T`` rows for K=8 of E=32 at ep=4);
later windows reuse the overflow loop below. Layout and proofs:
:mod:`jaxmoe.parallel.token_dispatch`.

References: Lepikhin et al. 2020 (GShard); Fedus et al. 2021 (Switch); DeepSeek-AI 2024
(DeepSeek-V3); NVIDIA TransformerEngine ``ep_dispatch``/``ep_combine`` for the API shape.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxmoe import compat, debug, permutation
from jaxmoe.capacity import check_drop_policy
from jaxmoe.ops.fp8 import Fp8Recipe, resolve_recipe
from jaxmoe.option_names import EP_DISPATCHES, check_registry
from jaxmoe.parallel import fp8_wire, layout
from jaxmoe.parallel.exchange import Exchange, exchange_rows, resolve_exchange
from jaxmoe.parallel.exchange.all_to_all_chunked import (
    ChunkedAllToAllExchange,
    default_chunk_rows,
)

#: ``ep_apply_experts(dispatch=...)``: one row per (token, expert) copy on the wire, or one per
#: (token, destination rank) pair (:mod:`jaxmoe.parallel.token_dispatch`).
DISPATCH_NAMES = ("auto", "copies", "tokens")
check_registry("EP_DISPATCHES", EP_DISPATCHES, DISPATCH_NAMES)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=[
        "send_plan",
        "receive_index",
        "receive_inverse",
        "send_sizes",
        "recv_sizes",
        "tokens_per_expert",
        "dropped",
    ],
    meta_fields=["exchange", "axis_name", "slot_rows"],
)
@dataclasses.dataclass(frozen=True)
class EPHandle:
    """What :func:`ep_combine` needs from :func:`ep_dispatch` (a pytree; int32 arrays).

    Attributes:
      send_plan: the :class:`~jaxmoe.permutation.DispatchPlan` of the send buffer
        (``ep * P`` rows).
      receive_index: ``[R]`` the receive row of each expert-buffer row (``ep*P`` = none).
      receive_inverse: ``[ep*P]`` the expert-buffer row of each receive row (``R`` = none).
      send_sizes: ``[ep]`` real rows this rank sends to each rank.
      recv_sizes: ``[ep]`` real rows this rank receives from each rank.
      tokens_per_expert: ``[E]`` this rank's copies per (global) expert, before any drop.
      dropped: this rank's copies dropped by the capacity or the slot bound.
      exchange, axis_name, slot_rows: static.
    """

    send_plan: permutation.DispatchPlan
    receive_index: jax.Array
    receive_inverse: jax.Array
    send_sizes: jax.Array
    recv_sizes: jax.Array
    tokens_per_expert: jax.Array
    dropped: jax.Array
    exchange: Exchange
    axis_name: object
    slot_rows: int


def ep_dispatch(
    x: jax.Array,
    routing_experts: jax.Array,
    *,
    num_experts: int,
    axis_name,
    exchange: str | Exchange | None = None,
    capacity: int | None = None,
    receive_factor: float | None = None,
    alignment: int = 1,
    all_counts: jax.Array | None = None,
    window=0,
    drop_policy: str = "position",
    sequence_length: int | None = None,
    routing_weights: jax.Array | None = None,
    fp8_recipe: str | Fp8Recipe | None = None,
) -> tuple[jax.Array, jax.Array, EPHandle]:
    r"""Sends each token copy to the rank owning its expert; returns my experts' rows.

    Call inside ``jax.shard_map`` (or any SPMD context) where ``axis_name`` is the
    expert-parallel axis; rank ``d`` owns experts ``[d*E_l, (d+1)*E_l)``, ``E_l = E / ep``.
    Equivalent to gathering every rank's tokens and running
    :func:`jaxmoe.permutation.dispatch` for my experts only, in the token order of the ep group
    (rank-major). Drops and buffer sizes are described in the module docstring; the receive
    buffer holds ``ep * P`` rows, ``P = T*K`` when dropless.

    Differentiable in ``x``: the VJP gathers the cotangent back through the reverse exchange and
    sums each token's K copies (equal to :func:`ep_combine` with unit weights).

    Args:
      x: ``[T, H]`` this rank's tokens.
      routing_experts: ``[T, K]`` int32 global expert ids (distinct within a row).
      num_experts: E, divisible by the size of ``axis_name``.
      axis_name: the expert-parallel mesh axis.
      exchange: ``None`` (platform default), ``"all_to_all"``, ``"all_to_all_chunked"``,
        ``"all_gather"``, ``"ragged_all_to_all"`` or an
        :class:`~jaxmoe.parallel.exchange.Exchange`.
      capacity: per-expert capacity ``C`` over the ep group's ``ep*T`` tokens (``None`` =
        dropless); blocks then have ``round_up(C, alignment)`` rows each.
      receive_factor: bound on the receive buffer, about ``receive_factor * T * K`` rows.
      alignment: pad each expert block to a multiple of this many rows.
      all_counts: ``[ep, E]`` int32, every rank's copies per expert, if the caller already
        gathered them with :func:`all_expert_counts` (saves that small collective).
      window: which ``P`` positions of each slot travel: ``[window*P, (window+1)*P)`` of the
        slot's copies (ordered by expert, then token). 0 (default) is the bounded path; the
        dropless overflow of :func:`ep_apply_experts` sends the later windows. May be traced.
      drop_policy, sequence_length, routing_weights: with a capacity, which copies claim an
        expert's ``C`` rows first, over the ep group's tokens in rank order
        (:func:`jaxmoe.capacity.claim_ranks`): ``"position"`` (default) with
        ``sequence_length`` S (``None``: the group's tokens are one sequence, so token order),
        or ``"probs"`` (the largest of ``routing_weights [T, K]`` first).
      fp8_recipe: ``None``, or an FP8 recipe (a name or an :class:`~jaxmoe.ops.fp8.Fp8Recipe`):
        the rows cross the wire as FP8 with their float32 scales, each token quantized once
        with the recipe's activation blocks before the exchange
        (:mod:`jaxmoe.parallel.fp8_wire`).

    Returns:
      ``(buffer [R, H], group_sizes [E_l] int32, handle)``: ``buffer`` is ready for
      ``grouped_matmul(buffer, w_local, group_sizes)``; pass ``handle`` to :func:`ep_combine`.
      With ``fp8_recipe``, ``(buffer, group_sizes, handle, buffer_fp8)``: ``buffer_fp8 = (q
      [R, H], scale)`` is ``quantize(buffer_before_the_wire, recipe.lhs_blocks)`` bit for bit
      (pass it as ``fp8_grouped_matmul(..., lhs_fp8=buffer_fp8)``); ``buffer`` is its
      dequantized rows in ``x``'s dtype, whose gradient flows back to ``x`` through the reverse
      exchange in ``x``'s dtype.

    Example::

      def body(x, experts, weights, w_local):  # inside shard_map over "ep"
          buffer, sizes, handle = ep_dispatch(x, experts, num_experts=E, axis_name="ep")
          y = grouped_matmul(buffer, w_local, sizes)
          return ep_combine(y, weights, handle, "ep")
    """
    impl = resolve_exchange(exchange)
    num_tokens, top_k = routing_experts.shape
    if capacity is not None:
        check_drop_policy("ep_dispatch", drop_policy, routing_weights)
    ep = jax.lax.axis_size(axis_name)
    if num_experts % ep:
        raise ValueError(
            f"ep_dispatch: `num_experts` ({num_experts}) must be divisible by the size of "
            f"axis {axis_name!r} ({ep})."
        )
    if x.ndim != 2 or x.shape[0] != num_tokens:
        raise ValueError(
            f"ep_dispatch: `x` must be [T, H] with T = routing_experts.shape[0] ({num_tokens}); "
            f"got {x.shape}."
        )
    num_local = num_experts // ep
    rows = layout.slot_rows(
        num_tokens, top_k, ep, num_local, capacity=capacity, receive_factor=receive_factor
    )
    if isinstance(impl, ChunkedAllToAllExchange) and impl.chunk_rows is None:
        impl = ChunkedAllToAllExchange(default_chunk_rows(num_tokens * top_k, ep, rows))
    block_rows = permutation.capacity_block_rows(capacity, alignment)
    me = jax.lax.axis_index(axis_name)

    flat_experts = routing_experts.reshape(-1).astype(jnp.int32)
    if all_counts is None:
        all_counts = layout.all_expert_counts(routing_experts, num_experts, axis_name)
    counts = jax.lax.dynamic_index_in_dim(all_counts, me, axis=0, keepdims=False)
    keep, send_counts = None, all_counts
    if capacity is not None:
        keep, send_counts = layout.capacity_keep(
            routing_experts,
            num_experts,
            capacity,
            axis_name,
            drop_policy=drop_policy,
            sequence_length=sequence_length,
            routing_weights=routing_weights,
        )
    kept, offset, skip = layout.slot_layout(send_counts, num_local, rows, window)
    kept_mine = jax.lax.dynamic_index_in_dim(kept, me, axis=0, keepdims=False)  # [ep (d), E_l]
    offset_mine = jax.lax.dynamic_index_in_dim(offset, me, axis=0, keepdims=False)
    kept_here = jax.lax.dynamic_index_in_dim(kept, me, axis=1, keepdims=False)  # [ep (s), E_l]
    offset_here = jax.lax.dynamic_index_in_dim(offset, me, axis=1, keepdims=False)
    send_sizes = jnp.sum(kept_mine, axis=1)
    recv_sizes = jnp.sum(kept_here, axis=1)

    skip_mine = jax.lax.dynamic_index_in_dim(skip, me, axis=0, keepdims=False)
    send_plan = layout.send_plan(
        flat_experts, counts, kept_mine, offset_mine, skip_mine, rows, top_k, keep
    )
    receive_index, receive_inverse, group_sizes = layout.receive_plan(
        kept_here, offset_here, rows, alignment, block_rows
    )

    def move(rows_to_send):  # my rows [T, W] -> my experts' rows [R, W]
        send = permutation.dispatch(rows_to_send, send_plan).reshape(ep, rows, -1)
        recv = exchange_rows(impl, send, send_sizes, recv_sizes, axis_name)
        recv = debug.poison_rows(recv, recv_sizes)
        return permutation.permute_rows(recv.reshape(ep * rows, -1), receive_index, receive_inverse)

    live_rows = jnp.sum(group_sizes)
    handle = EPHandle(
        send_plan=send_plan,
        receive_index=receive_index,
        receive_inverse=receive_inverse,
        send_sizes=send_sizes,
        recv_sizes=recv_sizes,
        tokens_per_expert=counts,
        dropped=send_plan.dropped,
        exchange=impl,
        axis_name=axis_name,
        slot_rows=rows,
    )
    if fp8_recipe is None:
        return debug.poison_rows(move(x), live_rows), group_sizes, handle
    recipe = resolve_recipe(fp8_recipe, "ep_dispatch")
    buffer_fp8 = fp8_wire.unpack_rows(
        move(fp8_wire.pack_rows(x, recipe)), x.shape[1], recipe, live_rows
    )
    received = debug.poison_rows(fp8_wire.dequantized(*buffer_fp8, recipe, x.dtype), live_rows)
    buffer = fp8_wire.with_gradient_of(x, received, _dispatch_transpose, handle)
    return buffer, group_sizes, handle, buffer_fp8


def _dispatch_transpose(grad_buffer, handle):
    """The VJP of :func:`ep_dispatch`'s rows in ``x``: the combine's path with unit weights
    (float32 sums of each token's copies, as the dispatch's own VJP adds them)."""
    unit = compat.zeros_like_typed(handle.send_plan.assignment_row).astype(jnp.float32) + 1
    return ep_combine(grad_buffer, unit, handle)


def ep_combine(
    expert_out: jax.Array, weights: jax.Array, handle: EPHandle, axis_name=None
) -> jax.Array:
    r"""Returns each token's weighted expert outputs: ``y[t] = sum_j w[t,j] * out(copy t,j)``.

    The inverse path of :func:`ep_dispatch` (sort back, reverse exchange, gather and sum the K
    copies in float32). Dropped copies contribute zero. Differentiable in ``expert_out`` (VJP:
    the weighted dispatch of the cotangent) and ``weights``.

    Args:
      expert_out: ``[R, H]`` expert outputs in the layout of ``ep_dispatch``'s buffer.
      weights: ``[T, K]`` combine weights.
      handle: from :func:`ep_dispatch`.
      axis_name: optional; must match the dispatch's axis.

    Returns:
      ``[T, H]`` float32.
    """
    if axis_name is not None and axis_name != handle.axis_name:
        raise ValueError(
            f"ep_combine: `axis_name` {axis_name!r} differs from the dispatch's "
            f"{handle.axis_name!r}."
        )
    ep, rows = handle.send_sizes.shape[0], handle.slot_rows
    recv = permutation.permute_rows(expert_out, handle.receive_inverse, handle.receive_index)
    recv = recv.reshape(ep, rows, expert_out.shape[-1])
    back = exchange_rows(
        handle.exchange, recv, handle.recv_sizes, handle.send_sizes, handle.axis_name
    )
    back = debug.poison_rows(back, handle.send_sizes)
    return permutation.combine(back.reshape(ep * rows, -1), weights, handle.send_plan)
