r"""Expert parallelism: the exchange-level API (:func:`ep_dispatch`, :func:`ep_combine`) and the
sharded layer (:func:`moe_sharded`).

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

1. capacity ``C`` (per expert, over the ep group's tokens): an expert keeps its first ``C``
   copies in that order;
2. the slot bound ``P``: the rows one sender can put in one receiver's slot. Within a slot the
   copies are ordered by expert then token; copies past the first ``P`` are dropped (the last
   experts' last tokens of that sender).

**Memory (receive buffer).** ``ep * P`` rows of ``H`` per rank (and as many to send), with

* dropless (default): ``P = T*K``, so ``ep * T * K`` rows: the worst case, all copies of all
  ranks to one rank;
* ``receive_factor=f``: ``P = min(T*K, ceil(ceil(f*T*K) / ep))``, about ``f*T*K`` rows (e.g.
  ``f = 1.25`` leaves 25% headroom over perfect balance);
* capacity ``C``: ``P = min(T*K, E_l * min(T, C))`` (no extra drops), then the ``f`` bound if set.

The expert-major ``buffer`` has ``R = ep*P + E_l*(alignment-1)`` rows rounded up to
``alignment`` (dropless), or ``E_l * round_up(C, alignment)`` (capacity); past its blocks it holds
zeros (NaN under ``JAXMOE_POISON``).

References: Lepikhin et al. 2020 (GShard); Fedus et al. 2021 (Switch); DeepSeek-AI 2024
(DeepSeek-V3); NVIDIA TransformerEngine ``ep_dispatch``/``ep_combine`` for the API shape.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jaxmoe import debug, permutation
from jaxmoe.config import MoEConfig
from jaxmoe.experts import routed_experts, shared_expert
from jaxmoe.parallel import sharding
from jaxmoe.parallel.exchange import Exchange, exchange_rows, resolve_exchange
from jaxmoe.parallel.exchange.all_to_all_chunked import (
    ChunkedAllToAllExchange,
    default_chunk_rows,
)
from jaxmoe.parallel.exchange.base import vary


def _round_up(value, multiple):
    return (value + multiple - 1) // multiple * multiple


def slot_rows(
    num_tokens: int,
    top_k: int,
    ep: int,
    num_local_experts: int,
    *,
    capacity: int | None = None,
    receive_factor: float | None = None,
) -> int:
    """``P``, the static rows per (sender, receiver) slot (see the module docstring)."""
    rows = num_tokens * top_k
    if capacity is not None:
        rows = min(rows, num_local_experts * min(num_tokens, capacity))
    if receive_factor is not None:
        rows = min(rows, math.ceil(math.ceil(receive_factor * num_tokens * top_k) / ep))
    return max(rows, 1)


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


# ---------------------------------------------------------------------------------------------
# Layout: derived on every rank from the all-gathered counts.


def _slot_layout(all_counts, num_local_experts: int, capacity: int | None, rows: int):
    """Kept copies and their positions, for every (sender s, receiver d, local expert e).

    Returns ``(kept, slot_offset)``, both ``[ep, ep, E_l]`` int32: sender ``s``'s copies of
    expert ``d*E_l + e`` that survive both bounds, and where they start in slot ``(s, d)``.
    """
    ep = all_counts.shape[0]
    if capacity is not None:
        # Copies of earlier ranks come first (token order of the ep group).
        before = jnp.cumsum(all_counts, axis=0) - all_counts
        all_counts = jnp.clip(capacity - before, 0, all_counts)
    per_slot = all_counts.reshape(ep, ep, num_local_experts)
    slot_offset = jnp.cumsum(per_slot, axis=-1) - per_slot
    kept = jnp.clip(rows - slot_offset, 0, per_slot)
    return kept.astype(jnp.int32), slot_offset.astype(jnp.int32)


def _send_plan(flat_experts, counts, kept_mine, offset_mine, rows: int, top_k: int):
    """The :class:`DispatchPlan` of my send buffer ``[ep*P]`` (slot-major, expert, token)."""
    ep, num_local = kept_mine.shape
    num_assignments = flat_experts.shape[0]
    kept_flat, offset_flat = kept_mine.reshape(-1), offset_mine.reshape(-1)
    order = jnp.argsort(flat_experts, stable=True).astype(jnp.int32)  # sorted slot -> assignment
    starts = jnp.cumsum(counts) - counts
    sorted_experts = flat_experts[order]
    rank = jnp.arange(num_assignments, dtype=jnp.int32) - starts[sorted_experts]
    sorted_row = jnp.where(
        rank < kept_flat[sorted_experts],
        (sorted_experts // num_local) * rows + offset_flat[sorted_experts] + rank,
        ep * rows,
    )
    assignment_row = (
        jnp.zeros((num_assignments,), jnp.int32).at[order].set(sorted_row, unique_indices=True)
    )
    # Send row -> assignment: find the expert block of the slot position, then its copy.
    send_rows = jnp.arange(ep * rows, dtype=jnp.int32)
    dest, position = send_rows // rows, send_rows % rows
    ends = (offset_mine + kept_mine)[dest]  # [ep*P, E_l]
    local = jnp.minimum(jnp.sum(ends <= position[:, None], axis=1), num_local - 1)
    expert = dest * num_local + local
    real = position < jnp.sum(kept_mine, axis=1)[dest]
    slot = jnp.clip(starts[expert] + position - offset_flat[expert], 0, num_assignments - 1)
    row_assignment = jnp.where(real, order[slot], num_assignments).astype(jnp.int32)
    return permutation.DispatchPlan(
        row_assignment=row_assignment,
        assignment_row=assignment_row.reshape(-1, top_k),
        group_sizes=jnp.full((ep,), rows, jnp.int32),
        tokens_per_expert=counts,
        dropped=(num_assignments - jnp.sum(kept_mine)).astype(jnp.int32),
    )


def _receive_plan(kept_here, offset_here, rows: int, alignment: int, block_rows: int | None):
    """Sorting of the receive buffer ``[ep*P]`` into expert-major blocks.

    ``kept_here``/``offset_here`` are ``[ep (sender), E_l]``. Returns ``(receive_index [R],
    receive_inverse [ep*P], group_sizes [E_l])``.
    """
    ep, num_local = kept_here.shape
    block_sizes = jnp.sum(kept_here, axis=0)  # [E_l] copies per local expert
    if block_rows is not None:
        group_sizes = jnp.full((num_local,), block_rows, jnp.int32)
    else:
        group_sizes = _round_up(block_sizes, alignment).astype(jnp.int32)
    # The same static bound as on one device, for ep*P received rows (block_rows is aligned).
    num_rows = permutation.buffer_rows(ep * rows, num_local, alignment, block_rows)
    block_ends = jnp.cumsum(group_sizes)
    block_starts = block_ends - group_sizes
    sender_ends = jnp.cumsum(kept_here, axis=0)  # [ep, E_l]
    sender_starts = sender_ends - kept_here  # where sender s's copies start inside block e

    # Expert row -> receive row.
    expert_rows = jnp.arange(num_rows, dtype=jnp.int32)
    expert = jnp.minimum(
        jnp.searchsorted(block_ends, expert_rows, side="right"), num_local - 1
    ).astype(jnp.int32)
    in_block = expert_rows - block_starts[expert]
    real = (in_block < block_sizes[expert]) & (expert_rows < block_ends[-1])
    sender = jnp.minimum(
        jnp.sum(sender_ends.T[expert] <= in_block[:, None], axis=1), ep - 1
    ).astype(jnp.int32)
    source = sender * rows + offset_here[sender, expert] + in_block - sender_starts[sender, expert]
    receive_index = jnp.where(real, source, ep * rows).astype(jnp.int32)

    # Receive row -> expert row (the inverse permutation).
    recv_rows = jnp.arange(ep * rows, dtype=jnp.int32)
    sender, position = recv_rows // rows, recv_rows % rows
    local = jnp.minimum(
        jnp.sum((offset_here + kept_here)[sender] <= position[:, None], axis=1), num_local - 1
    ).astype(jnp.int32)
    real = position < jnp.sum(kept_here, axis=1)[sender]
    dest = (
        block_starts[local] + sender_starts[sender, local] + position - offset_here[sender, local]
    )
    receive_inverse = jnp.where(real, dest, num_rows).astype(jnp.int32)
    return receive_index, receive_inverse, group_sizes


def all_expert_counts(
    routing_experts: jax.Array, num_experts: int, axis_name, num_chunks: int = 1
) -> jax.Array:
    """``[ep, E]`` int32: row ``s`` = rank ``s``'s copies per expert (one small all-gather).

    With ``num_chunks > 1`` the rows of ``routing_experts`` are cut into that many equal
    chunks and the result is ``[num_chunks, ep, E]``, one count matrix per chunk.
    """
    per_chunk = routing_experts.reshape(num_chunks, -1).astype(jnp.int32)
    counts = jnp.sum(
        per_chunk[:, :, None] == jnp.arange(num_experts, dtype=jnp.int32)[None, None, :],
        axis=1,
        dtype=jnp.int32,
    )  # [chunks, E]
    gathered = jnp.swapaxes(jax.lax.all_gather(counts, axis_name), 0, 1)  # [chunks, ep, E]
    return gathered[0] if num_chunks == 1 else gathered


def fullest_slot(all_counts: jax.Array, ep: int) -> jax.Array:
    """The most copies any rank sends any rank (int32; the same value on every rank).

    ``all_counts`` is ``[..., ep, E]`` (leading dims, e.g. chunks, are maxed over too).
    """
    return jnp.max(jnp.sum(all_counts.reshape(-1, ep, ep, all_counts.shape[-1] // ep), axis=-1))


# ---------------------------------------------------------------------------------------------
# Row permutations whose VJP is the inverse permutation (a gather both ways).


@jax.custom_vjp
def _permute_rows(values, index, inverse):
    """``out[i] = values[index[i]]`` (zeros for out-of-range ``index``); ``index`` injective."""
    return jnp.take(values, index, axis=0, mode="fill", fill_value=0)


def _permute_rows_fwd(values, index, inverse):
    return _permute_rows(values, index, inverse), (index, inverse)


def _permute_rows_bwd(residuals, grad_out):
    index, inverse = residuals
    return jnp.take(grad_out, inverse, axis=0, mode="fill", fill_value=0), None, None


_permute_rows.defvjp(_permute_rows_fwd, _permute_rows_bwd)


def _poison_slots(buffer, sizes):
    """Rows of slot ``s`` at or past ``sizes[s]`` become NaN under ``JAXMOE_POISON``."""
    if not debug.poison_enabled():
        return buffer
    real = jnp.arange(buffer.shape[1])[None, :] < sizes[:, None]
    return jnp.where(real[:, :, None], buffer, jnp.asarray(jnp.nan, buffer.dtype))


# ---------------------------------------------------------------------------------------------
# Public exchange-level API (inside a shard_map over axis_name).


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

    Returns:
      ``(buffer [R, H], group_sizes [E_l] int32, handle)``: ``buffer`` is ready for
      ``grouped_matmul(buffer, w_local, group_sizes)``; pass ``handle`` to :func:`ep_combine`.

    Example::

      def body(x, experts, weights, w_local):  # inside shard_map over "ep"
          buffer, sizes, handle = ep_dispatch(x, experts, num_experts=E, axis_name="ep")
          y = grouped_matmul(buffer, w_local, sizes)
          return ep_combine(y, weights, handle, "ep")
    """
    impl = resolve_exchange(exchange)
    num_tokens, top_k = routing_experts.shape
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
    rows = slot_rows(
        num_tokens, top_k, ep, num_local, capacity=capacity, receive_factor=receive_factor
    )
    if isinstance(impl, ChunkedAllToAllExchange) and impl.chunk_rows is None:
        impl = ChunkedAllToAllExchange(default_chunk_rows(num_tokens * top_k, ep, rows))
    block_rows = permutation.capacity_block_rows(capacity, alignment)
    me = jax.lax.axis_index(axis_name)

    flat_experts = routing_experts.reshape(-1).astype(jnp.int32)
    if all_counts is None:
        all_counts = all_expert_counts(routing_experts, num_experts, axis_name)
    counts = jax.lax.dynamic_index_in_dim(all_counts, me, axis=0, keepdims=False)
    kept, offset = _slot_layout(all_counts, num_local, capacity, rows)
    kept_mine = jax.lax.dynamic_index_in_dim(kept, me, axis=0, keepdims=False)  # [ep (d), E_l]
    offset_mine = jax.lax.dynamic_index_in_dim(offset, me, axis=0, keepdims=False)
    kept_here = jax.lax.dynamic_index_in_dim(kept, me, axis=1, keepdims=False)  # [ep (s), E_l]
    offset_here = jax.lax.dynamic_index_in_dim(offset, me, axis=1, keepdims=False)
    send_sizes = jnp.sum(kept_mine, axis=1)
    recv_sizes = jnp.sum(kept_here, axis=1)

    send_plan = _send_plan(flat_experts, counts, kept_mine, offset_mine, rows, top_k)
    send = permutation.dispatch(x, send_plan).reshape(ep, rows, x.shape[1])
    recv = _poison_slots(exchange_rows(impl, send, send_sizes, recv_sizes, axis_name), recv_sizes)
    receive_index, receive_inverse, group_sizes = _receive_plan(
        kept_here, offset_here, rows, alignment, block_rows
    )
    buffer = _permute_rows(recv.reshape(ep * rows, -1), receive_index, receive_inverse)
    buffer = debug.poison_rows(buffer, jnp.sum(group_sizes))
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
    return buffer, group_sizes, handle


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
    recv = _permute_rows(expert_out, handle.receive_inverse, handle.receive_index)
    recv = recv.reshape(ep, rows, expert_out.shape[-1])
    back = exchange_rows(
        handle.exchange, recv, handle.recv_sizes, handle.send_sizes, handle.axis_name
    )
    back = _poison_slots(back, handle.send_sizes)
    return permutation.combine(back.reshape(ep * rows, -1), weights, handle.send_plan)


def fast_slot_rows(
    num_tokens: int, top_k: int, ep: int, num_local_experts: int, factor: float | None
) -> int | None:
    """Slot rows of the dropless fast path (``ceil(factor * T*K / ep)``), or None where that
    saves nothing (it would hold ``T*K`` rows, the worst case, anyway) or ``factor`` is None."""
    if factor is None:
        return None
    rows = slot_rows(num_tokens, top_k, ep, num_local_experts, receive_factor=factor)
    return rows if rows < num_tokens * top_k else None


def ep_apply_experts(
    x: jax.Array,
    routing_experts: jax.Array,
    routing_weights: jax.Array,
    expert_fn,
    expert_params,
    *,
    num_experts: int,
    axis_name,
    exchange: str | Exchange | None = None,
    capacity: int | None = None,
    receive_factor: float | None = None,
    fast_slot_factor: float | None = 1.125,
    alignment: int = 1,
    num_chunks: int = 1,
):
    r""":func:`ep_dispatch`, ``expert_fn``, :func:`ep_combine`: dropless at bounded cost.

    Dropless (``capacity`` and ``receive_factor`` None) slots must hold ``T*K`` rows for the
    worst case, all copies to one rank: ``ep`` times the balanced share, on the wire and in
    every buffer. With ``fast_slot_factor=f`` the whole dispatch-experts-combine runs on slots
    of ``P_fast = ceil(f*T*K/ep)`` rows whenever the fullest (sender, receiver) slot of the ep
    group fits them, and on worst-case slots otherwise::

        fits = max_{s,d} copies(s -> d) <= P_fast      (from the all-gathered [ep, E] counts)
        y = lax.cond(fits, path(P_fast), checkpoint(path(T*K)))

    Every rank computes ``fits`` from the same counts, so all ranks take the same branch and
    enter the same collectives; no host sync. Both branches are exact and drop nothing. The
    worst-case branch is rematerialized in backward, so its activations are not kept (``lax.cond``
    keeps the residuals of both branches). With a bound (``capacity`` or ``receive_factor``)
    there is one path, which drops and counts what overflows.

    Args:
      x, routing_experts: as for :func:`ep_dispatch`.
      routing_weights: ``[T, K]`` combine weights, as for :func:`ep_combine`.
      expert_fn: ``expert_fn(buffer [R, H], group_sizes [E_l], expert_params) -> [R, H']``.
      expert_params: a pytree passed to ``expert_fn`` (e.g. the local expert weights).
      fast_slot_factor: ``f`` above (None: always the worst-case slots).
      num_chunks: split the ``T`` tokens into this many equal chunks, each its own dispatch,
        experts and combine (slots sized per chunk; the fast path needs every chunk to fit),
        so that the scheduler may overlap one chunk's exchange with another's matmuls.
        Needs ``capacity=None``.
      Others: as for :func:`ep_dispatch`.

    Returns:
      ``(y [T, H'] float32, tokens_per_expert [E] int32 (this rank's copies), dropped int32)``.
    """
    ep = jax.lax.axis_size(axis_name)
    num_tokens, top_k = routing_experts.shape
    if not isinstance(num_chunks, int) or num_chunks < 1 or num_tokens % num_chunks:
        raise ValueError(
            f"ep_apply_experts: `num_chunks` ({num_chunks!r}) must be a positive int dividing "
            f"the tokens per rank ({num_tokens})."
        )
    if num_chunks > 1 and capacity is not None:
        raise ValueError(
            "ep_apply_experts: `num_chunks` > 1 needs capacity=None (a capacity counts the "
            "copies of all tokens, chunks would count each chunk's)."
        )
    chunk_tokens = num_tokens // num_chunks
    # [chunks, ep, E]: each chunk's counts on every rank (one all-gather for all chunks).
    all_counts = all_expert_counts(routing_experts, num_experts, axis_name, num_chunks)
    all_counts = all_counts.reshape(num_chunks, ep, num_experts)

    def path(factor, operands):
        x, routing_experts, routing_weights, expert_params, all_counts = operands
        ys, tokens_per_expert, dropped = [], 0, 0
        # Separate chunks are independent exchanges and matmuls: XLA's latency-hiding scheduler
        # (--xla_gpu_enable_latency_hiding_scheduler=true) can run one chunk's all-to-all
        # under another chunk's expert matmuls.
        for chunk in range(num_chunks):
            rows = slice(chunk * chunk_tokens, (chunk + 1) * chunk_tokens)
            with jax.named_scope("ep_dispatch"):
                buffer, group_sizes, handle = ep_dispatch(
                    x[rows],
                    routing_experts[rows],
                    num_experts=num_experts,
                    axis_name=axis_name,
                    exchange=exchange,
                    capacity=capacity,
                    receive_factor=factor,
                    alignment=alignment,
                    all_counts=all_counts[chunk],
                )
            with jax.named_scope("experts"):
                expert_out = expert_fn(buffer, group_sizes, expert_params)
            with jax.named_scope("ep_combine"):
                ys.append(ep_combine(expert_out, routing_weights[rows], handle))
            tokens_per_expert = tokens_per_expert + handle.tokens_per_expert
            dropped = dropped + handle.dropped
        y = ys[0] if num_chunks == 1 else jnp.concatenate(ys, axis=0)
        return y, tokens_per_expert, dropped

    operands = (x, routing_experts, routing_weights, expert_params, all_counts)
    fast_rows = None
    if capacity is None and receive_factor is None and num_experts % ep == 0:
        fast_rows = fast_slot_rows(chunk_tokens, top_k, ep, num_experts // ep, fast_slot_factor)
    if fast_rows is None:
        return path(receive_factor, operands)
    fits = fullest_slot(all_counts.reshape(num_chunks * ep, num_experts), ep) <= fast_rows
    return jax.lax.cond(
        fits,
        functools.partial(path, fast_slot_factor),
        jax.checkpoint(functools.partial(path, None)),
        operands,
    )


# ---------------------------------------------------------------------------------------------
# The sharded layer.


def _shard_map(f, mesh, in_specs, out_specs, check_vma: bool = True):
    if hasattr(jax, "shard_map"):  # jax >= 0.6 (0.10, 0.11)
        return jax.shard_map(
            f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma
        )
    from jax.experimental.shard_map import shard_map  # pragma: no cover - older jax

    return shard_map(  # pragma: no cover
        f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=check_vma
    )


def _needs_unchecked_shard_map(cfg: MoEConfig, platform: str) -> bool:
    """Pallas kernels inside ``shard_map`` cannot declare how their outputs vary over the mesh
    (jax 0.10/0.11 refuse them under ``check_vma=True``), so the layer then runs unchecked."""
    from jaxmoe.ops.grouped_matmul.api import default_backend_name

    backend = cfg.grouped_matmul_backend
    if backend is None or backend == "auto":
        backend = default_backend_name(platform)
    return (
        isinstance(backend, str)
        and backend.startswith("pallas")
        or (not isinstance(backend, str) and "Pallas" in type(backend).__name__)
    )


def _gather_fsdp(expert_params: dict, specs: dict, axes) -> dict:
    """All-gathers FSDP-sharded expert weights over their data axes (transpose: reduce-scatter)."""
    out = {}
    for name, value in expert_params.items():
        for dim, dim_axes in enumerate(specs[name]):
            if dim > 0 and dim_axes is not None:
                value = jax.lax.all_gather(value, dim_axes, axis=dim, tiled=True)
        out[name] = vary(value, axes)
    return out


def _moe_shard(params, x, *, cfg: MoEConfig, expert_specs: dict, group_tokens: int):
    from jaxmoe import layer, losses  # layer imports us lazily; keep the cycle one-way

    axes = sharding.batch_axes(cfg)
    tokens = x.reshape(-1, cfg.hidden_size)
    with jax.named_scope("jaxmoe"):
        with jax.named_scope("router"):
            routing, terms = layer.route_tokens(params, tokens, cfg, layer.num_sequences(x.shape))
        compute = tokens.astype(cfg.dtype)
        alignment = layer.resolve_alignment(cfg)
        capacity = cfg.capacity(group_tokens)
        with jax.named_scope("experts"):
            weights = _gather_fsdp(params["experts"], expert_specs, axes)

        def experts_fn(buffer, group_sizes, weights):
            return routed_experts(
                buffer, group_sizes, weights, cfg.activation, cfg.grouped_matmul_backend
            )

        out, tokens_per_rank, dropped = ep_apply_experts(
            compute,
            routing.experts,
            routing.weights,
            experts_fn,
            weights,
            num_experts=cfg.num_experts,
            axis_name=cfg.ep_axis,
            exchange=cfg.ep_exchange,
            capacity=capacity,
            receive_factor=cfg.ep_receive_factor,
            fast_slot_factor=cfg.ep_fast_slot_factor,
            alignment=alignment,
            num_chunks=cfg.ep_chunks,
        )
        if cfg.num_shared_experts:
            with jax.named_scope("shared_expert"):
                out = out + shared_expert(compute, params["shared"], cfg.activation)
        with jax.named_scope("stats"):
            terms = jax.tree.map(lambda v: jax.lax.psum(v, axes), terms)
            if x.ndim < 3:
                # A 2-D x is one sequence on one device: its sequence loss is the global one.
                load_balancing = losses.finish_losses(terms, cfg.num_experts, cfg.top_k)[0]
                terms = terms._replace(
                    seq_loss_sum=load_balancing, num_sequences=jnp.ones((), jnp.float32)
                )
            tokens_per_expert = jax.lax.psum(tokens_per_rank, axes)
            dropped = jax.lax.psum(dropped, axes)
            stats = layer.finish_stats(terms, tokens_per_expert, dropped, cfg)
    return out.astype(x.dtype).reshape(x.shape), stats


def _has_explicit_axes(mesh) -> bool:
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    return explicit is not None and any(t == explicit for t in getattr(mesh, "axis_types", ()))


def moe_sharded(params, x: jax.Array, cfg: MoEConfig, mesh) -> tuple[jax.Array, object]:
    """:func:`jaxmoe.moe` with experts over ``cfg.ep_axis`` and the batch over
    ``(*cfg.data_axes, cfg.ep_axis)`` of ``mesh``: the single-device result, sharded.

    Capacity (``cfg.capacity_factor``) counts the tokens of one data shard (the ep group):
    with ``data_axes`` the result equals :func:`jaxmoe.moe` run on each data shard separately.
    Losses and ``tokens_per_expert`` are over the global batch; ``dropped_tokens`` sums the
    capacity and receive-bound drops of every rank. See the module docstring for memory.

    Raises:
      ValueError: the mesh lacks ``cfg.ep_axis`` or a data axis, ``num_experts`` is not
        divisible by the ep size, or the batch not by the product of the sharding axes.
      NotImplementedError: ``cfg.ep_exchange`` cannot run on this platform.
    """
    sharding.check_mesh(cfg, mesh, tuple(x.shape))
    platform = mesh.devices.flat[0].platform
    resolve_exchange(cfg.ep_exchange, platform)  # raise before tracing
    from jaxmoe.layer import MoEStats

    ep = sharding.mesh_axis_size(mesh, cfg.ep_axis)
    shards = sharding.mesh_axis_size(mesh, sharding.batch_axes(cfg))
    local_tokens = math.prod(x.shape[:-1]) // shards
    if cfg.ep_chunks > 1 and local_tokens % cfg.ep_chunks:
        raise ValueError(
            f"MoEConfig.ep_chunks ({cfg.ep_chunks}) must divide the tokens per device "
            f"({local_tokens} = {math.prod(x.shape[:-1])} tokens / {shards} shards). Pick a "
            "divisor, or 1."
        )
    param_specs = sharding.param_partition_specs(cfg)
    param_specs = {key: param_specs[key] for key in params}
    x_spec = sharding.batch_partition_spec(cfg, x.ndim)
    stats_specs = MoEStats(*([jax.sharding.PartitionSpec()] * len(MoEStats._fields)))
    body = functools.partial(
        _moe_shard,
        cfg=cfg,
        expert_specs=param_specs["experts"],
        group_tokens=local_tokens * ep,
    )
    check_vma = not _needs_unchecked_shard_map(cfg, platform)
    if _has_explicit_axes(mesh):
        # An Explicit-axes mesh (jax.make_mesh's default on recent jax) makes shard_map demand
        # inputs already laid out as in_specs: lay them out (a no-op when they already are).
        params, x = jax.tree.map(
            lambda value, spec: jax.device_put(value, jax.sharding.NamedSharding(mesh, spec)),
            (params, x),
            (param_specs, x_spec),
            is_leaf=lambda node: isinstance(node, jax.sharding.PartitionSpec),
        )
    return _shard_map(body, mesh, (param_specs, x_spec), (x_spec, stats_specs), check_vma)(
        params, x
    )
