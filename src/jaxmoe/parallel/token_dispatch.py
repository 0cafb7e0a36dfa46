r"""The token dispatch (``MoEConfig.ep_dispatch="tokens"``), deduplicated: a token crosses
the wire once per rank holding any of its experts, not once per expert.

The copies path (:mod:`jaxmoe.parallel.dispatch`) sends one row per (token, expert) copy. With
K=8 of E=32 at ep=4 a token's 8 experts sit on only ~3.7 of the 4 ranks, so over half of those
rows repeat a row already sent to the same rank. Here the unit on the wire is a *pair*
(token, destination rank), carrying the token's row, its ``K_l = min(K, E_l)`` local expert ids
and combine weights (-1 / 0 padded)::

    x[T, H] --pairs--> send[ep, P_pairs, H] --exchange--> recv[ep, P_pairs, H]
    (slot d: my tokens with an expert on d,             (slot s: rank s's tokens for me,
     token order; + ids, weights [ep, P_pairs, K_l])     + their local ids and weights)
      --expand--> buffer[R, H] --experts--> out[R, H] --reduce--> pair_out[ep, P_pairs, H]
      (copies, expert-major,                            (sum_j w_j * out_j in float32, one
       sender, token order)                              row per pair)
      --exchange back--> back[ep, P_pairs, H] --sum over destinations--> y[T, H]

Every step is a gather with an inverse index map, so every VJP is a gather too (no scatter-add;
gradients bitwise deterministic): the pair dispatch's transpose gathers a token's ``<= ep`` pair
rows and sums them; the expand's transpose gathers each pair's ``K_l`` copy rows and sums them;
the weights travel through :func:`~jaxmoe.permutation.permute_rows` (an injective gather with
its inverse). The expanded buffer and the reduce are :func:`~jaxmoe.permutation.dispatch` and
:func:`~jaxmoe.permutation.combine` with the received pairs as "tokens" and ``K_l`` choices.

**Static sizes and windows.** Two bounds per (sender, receiver) slot and window: at most
``P_pairs`` pairs (the wire and receive buffer) and at most ``Q`` copies (the expert buffer,
``ep * Q`` copies). Within a slot pairs are in token order; a window is the longest run of
pairs from where the previous one ended that keeps *both* prefix bounds -- two searchsorted
calls on the per-destination prefix counts of pairs and copies, vectorised over destinations
(:func:`window_end`). Window 0 is always sent (every chunk's, with ``ep_chunks > 1``, before
any overflow); later windows run in the copies path's overflow loop
(:mod:`jaxmoe.parallel.overflow`: the same schedule, ``while_loop`` and transpose, one loop for
all chunks), as many times as the chunk and rank of the ep group that need the most windows
(a ``pmax`` of one int32). Once a destination's pairs are all covered its windows start and end
at ``T``: a window past a chunk's last one sends nothing and adds zeros. Sizes
(:mod:`jaxmoe.parallel.layout`)::

    P_pairs = min(T, ceil(f * T * (1 - C(E - E_l, K) / C(E, K))))   # f x expected pairs per rank
    Q       = min(T*K_l, max(K_l, ceil(f * T * K / ep)))           # as the copies path's P

``f = ep_fast_slot_factor``; with ``f = None`` (worst case) ``P_pairs = T``, ``Q = T*K_l`` and
one window always suffices. Capacity and ``ep_receive_factor`` (bounded, dropping paths) stay on
the copies path (``MoEConfig`` refuses the combination). Per rank and window the wire carries
``(ep-1) * P_pairs * (H*b + 8*K_l)`` bytes out (rows, float32 weights and ids) and
``(ep-1) * P_pairs * H*b`` back, against ``(ep-1) * P * H*b`` each way on the copies path:
K=8 of E=32 at ep=4, ``P_pairs = T`` (``f * 0.930 T`` capped at T) against ``P = 2.25 T``;
at ep=8, ``0.79 T`` against ``1.125 T``; K=2 of E=8 at ep=4, ``0.52 T`` against ``0.56 T``.
The expert buffer is the copies path's size (``ep * Q = ep * P`` copies).

**Rounding.** The expert rank sums a pair's ``<= K_l`` weighted outputs in float32 and sends
the sum back in the expert output's dtype; the source adds its ``<= ep`` pair sums in float32.
In float32 that is one device's result up to the order of the additions; in bfloat16 each pair
sum is rounded once more than on the copies path.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxmoe import compat, debug, permutation
from jaxmoe.argument_checks import round_up
from jaxmoe.ops.fp8 import Fp8Recipe, resolve_recipe
from jaxmoe.parallel import fp8_wire, layout
from jaxmoe.parallel.exchange import Exchange, exchange_rows, resolve_exchange
from jaxmoe.parallel.exchange.all_to_all_chunked import (
    ChunkedAllToAllExchange,
    default_chunk_rows,
)
from jaxmoe.parallel.overflow import chunked, overflow_windows
from jaxmoe.ranks import scatter_inverse, stable_ranks
from jaxmoe.sorted_search import search_right


@dataclasses.dataclass(frozen=True)
class PairSlots:
    """The static sizes of the deduplicated slots (see the module docstring)."""

    pair_rows: int  # P_pairs: pairs per (sender, receiver) slot and window
    copy_rows: int  # Q: copies those pairs may hold
    local_slots: int  # K_l = min(K, E_l): expert ids (and weights) carried per pair
    num_local_experts: int  # E_l

    @classmethod
    def for_layer(cls, num_tokens, top_k, num_experts, ep, factor) -> PairSlots:
        num_local = num_experts // ep
        return cls(
            pair_rows=layout.pair_slot_rows(num_tokens, top_k, num_experts, ep, factor),
            copy_rows=layout.pair_copy_rows(num_tokens, top_k, num_experts, ep, factor),
            local_slots=min(top_k, num_local),
            num_local_experts=num_local,
        )

    def may_overflow(self, num_tokens: int) -> bool:
        """Whether some routing needs more than one window (else the overflow loop is left out)."""
        return self.pair_rows < num_tokens or self.copy_rows < num_tokens * self.local_slots


# ------------------------------------------------------------------------- the sender's layout


def pair_prefix_counts(routing_experts: jax.Array, num_local_experts: int, ep: int) -> jax.Array:
    """``[2, T+1, ep]`` int32: for each destination, the pairs (row 0) and copies (row 1) of the
    tokens before ``t`` -- the prefix sums every window bound is searched in."""
    dest = routing_experts.astype(jnp.int32) // num_local_experts  # [T, K]
    ranks = jnp.arange(ep, dtype=jnp.int32)[None, None, :]
    copies = jnp.sum(dest[:, :, None] == ranks, axis=1, dtype=jnp.int32)
    counts = jnp.stack([(copies > 0).astype(jnp.int32), copies])  # [2, T, ep]
    zero = jnp.zeros((2, 1, ep), jnp.int32)
    return jnp.concatenate([zero, jnp.cumsum(counts, axis=1, dtype=jnp.int32)], axis=1)


def _search_columns(prefix: jax.Array, values: jax.Array) -> jax.Array:
    """``searchsorted(prefix[:, d], values[d, ...], side="right")`` for every column ``d``."""
    return jax.vmap(search_right, (1, 0))(prefix, values)


def _at_tokens(prefix: jax.Array, tokens: jax.Array) -> jax.Array:
    """``prefix[tokens[d], d]`` for every destination ``d``."""
    return jnp.take_along_axis(prefix, tokens[None, :], axis=0)[0]


def window_end(prefix: jax.Array, start: jax.Array, slots: PairSlots) -> jax.Array:
    """``[ep]`` token index where each destination's window from token ``start[d]`` ends: the
    longest run with at most ``P_pairs`` pairs and at most ``Q`` copies (both prefix bounds, so
    the last token index ``t`` with both ``prefix[t] - prefix[start] <= bound``). Where the
    rest of a destination's pairs fit, that is ``T``; from ``start = T`` it stays ``T``."""
    pairs, copies = prefix[0], prefix[1]
    by_pairs = _search_columns(pairs, _at_tokens(pairs, start) + slots.pair_rows) - 1
    by_copies = _search_columns(copies, _at_tokens(copies, start) + slots.copy_rows) - 1
    return jnp.minimum(by_pairs, by_copies)


def window_start(prefix: jax.Array, window, slots: PairSlots) -> jax.Array:
    """``[ep]`` token index where window ``window`` (may be traced) starts, per destination."""
    # Typed like the prefix (varying over the mesh), as a loop carry must be.
    start = compat.zeros_like_typed(prefix[0, 0])
    if isinstance(window, int) and window == 0:
        return start
    return jax.lax.fori_loop(0, window, lambda _, s: window_end(prefix, s, slots), start)


def windows_needed_here(prefix: jax.Array, slots: PairSlots) -> jax.Array:
    """Windows this rank's fullest slot needs (int32 >= 1): the window ends walked until every
    destination's pairs are covered (each window takes at least one pair: ``Q >= K_l``)."""
    total = prefix[0, -1]

    def more(carry):
        return jnp.any(_at_tokens(prefix[0], carry[1]) < total)

    def step(carry):
        return carry[0] + 1, window_end(prefix, carry[1], slots)

    start = (compat.zeros_like_typed(prefix[0, 0, 0]), compat.zeros_like_typed(prefix[0, 0]))
    return jnp.maximum(jax.lax.while_loop(more, step, start)[0], 1)


def windows_needed(prefixes: jax.Array, slots: PairSlots, axis_name) -> jax.Array:
    """Windows the fullest slot of any chunk on the ep group needs (int32 >= 1, the same on
    every rank: a ``pmax`` of one int32, so every rank enters the same exchanges).
    ``prefixes`` is ``[chunks, 2, T_c + 1, ep]``, the chunks' :func:`pair_prefix_counts`."""
    here = jnp.max(jnp.stack([windows_needed_here(prefix, slots) for prefix in prefixes]))
    return jax.lax.pmax(here, axis_name)


def _choice_ranks(dest: jax.Array) -> jax.Array:
    """``[T, K]``: how many of a token's earlier choices go to the same rank (its pair slot)."""
    top_k = dest.shape[1]
    earlier = jnp.arange(top_k)[None, :] < jnp.arange(top_k)[:, None]  # [j, j'] j' < j
    same = dest[:, :, None] == dest[:, None, :]
    return jnp.sum(same & earlier[None], axis=2, dtype=jnp.int32)


@dataclasses.dataclass(frozen=True)
class PairSend:
    """One window of my send side."""

    plan: permutation.DispatchPlan  # x -> send rows [ep*P_pairs] (token t, dest d = t*ep + d)
    local_ids: jax.Array  # [ep*P_pairs, K_l] int32 local expert ids (-1: none)
    copy_assignment: jax.Array  # [ep*P_pairs*K_l] the copy t*K + j in each id slot (T*K: none)
    copy_position: jax.Array  # [T*K] the id slot of each copy (ep*P_pairs*K_l: not this window)
    send_sizes: jax.Array  # [ep] pairs to each rank
    copies_sent: jax.Array  # int32 copies in this window


def pair_send(routing_experts, prefix, window, slots: PairSlots) -> PairSend:
    """My send buffer for one window: which token and which of its copies fill each row."""
    num_tokens, top_k = routing_experts.shape
    ep = prefix.shape[-1]
    rows, local_slots = slots.pair_rows, slots.local_slots
    experts = routing_experts.astype(jnp.int32)
    dest = experts // slots.num_local_experts
    local_expert = experts % slots.num_local_experts
    start = window_start(prefix, window, slots)
    end = window_end(prefix, start, slots)
    pairs, copies = prefix[0], prefix[1]
    first_pair = _at_tokens(pairs, start)  # [ep] pair index where the window starts
    send_sizes = _at_tokens(pairs, end) - first_pair
    copies_sent = jnp.sum(_at_tokens(copies, end) - _at_tokens(copies, start))

    # Token -> its row in each destination's slot (pairs before it in the window).
    tokens = jnp.arange(num_tokens, dtype=jnp.int32)[:, None]
    in_window = (pairs[1:] > pairs[:-1]) & (tokens >= start[None]) & (tokens < end[None])
    slot_base = jnp.arange(ep, dtype=jnp.int32) * rows
    assignment_row = jnp.where(in_window, (slot_base - first_pair)[None] + pairs[:-1], ep * rows)
    # Row -> token: the token whose inclusive pair count first exceeds the pair index.
    pair_index = first_pair[:, None] + jnp.arange(rows, dtype=jnp.int32)[None, :]  # [ep, P]
    row_token = _search_columns(pairs[1:], pair_index)
    real = jnp.arange(rows)[None, :] < send_sizes[:, None]
    row_token = jnp.where(real, row_token, num_tokens).reshape(-1)  # T: padding
    row_dest = jnp.repeat(jnp.arange(ep, dtype=jnp.int32), rows)
    row_assignment = jnp.where(row_token < num_tokens, row_token * ep + row_dest, num_tokens * ep)
    plan = permutation.DispatchPlan(
        row_assignment=row_assignment.astype(jnp.int32),
        assignment_row=assignment_row.astype(jnp.int32),
        group_sizes=jnp.full((ep,), rows, jnp.int32),
        tokens_per_expert=jnp.zeros((ep,), jnp.int32),  # unused: pairs are not expert copies
        dropped=jnp.zeros((), jnp.int32),
    )

    # Copy (t, j) fills id slot rank_j of its pair's row; the inverse map finds, for each id
    # slot of a row, the choice of that token with that destination and rank.
    ranks = _choice_ranks(dest)
    pair_row = jnp.take_along_axis(assignment_row, dest, axis=1)  # [T, K]
    copy_position = jnp.where(
        pair_row < ep * rows, pair_row * local_slots + ranks, ep * rows * local_slots
    ).reshape(-1)
    token_dest = jnp.take(dest, row_token, axis=0, mode="fill", fill_value=-1)  # [ep*P, K]
    token_rank = jnp.take(ranks, row_token, axis=0, mode="fill", fill_value=-1)
    match = (token_dest == row_dest[:, None])[:, None, :] & (
        token_rank[:, None, :] == jnp.arange(local_slots)[None, :, None]
    )  # [ep*P, K_l, K]
    found = jnp.any(match, axis=2)
    choice = jnp.sum(jnp.where(match, jnp.arange(top_k)[None, None, :], 0), axis=2)
    copy_assignment = jnp.where(found, row_token[:, None] * top_k + choice, num_tokens * top_k)
    row_local = jnp.take(local_expert, row_token, axis=0, mode="fill", fill_value=0)
    local_ids = jnp.where(found, jnp.take_along_axis(row_local, choice, axis=1), -1)
    return PairSend(
        plan=plan,
        local_ids=local_ids.astype(jnp.int32),
        copy_assignment=copy_assignment.reshape(-1).astype(jnp.int32),
        copy_position=copy_position.astype(jnp.int32),
        send_sizes=send_sizes.astype(jnp.int32),
        copies_sent=copies_sent.astype(jnp.int32),
    )


# ----------------------------------------------------------------------- the receiver's expand


def expand_plan(local_ids: jax.Array, num_local_experts: int, num_rows: int, alignment: int):
    """The expert-major copy buffer of the received pairs: a :class:`DispatchPlan` over
    ``N = ep*P_pairs`` pair rows with ``K_l`` choices each (ids -1 absent).

    As :func:`jaxmoe.permutation.plan_dispatch` (blocks in pair order: sender, then token), but
    with the static ``num_rows`` of ``ep * Q`` copies rather than ``N * K_l``.
    """
    num_pairs, local_slots = local_ids.shape
    num_copies = num_pairs * local_slots
    key = jnp.where(local_ids >= 0, local_ids, num_local_experts).reshape(-1)  # absent: last
    counts = jnp.zeros((num_local_experts + 1,), jnp.int32).at[key].add(1)[:num_local_experts]
    group_sizes = round_up(counts, alignment).astype(jnp.int32)
    offsets = jnp.cumsum(group_sizes) - group_sizes
    # A copy's row: its expert's block, then its rank among that expert's copies (pair order).
    rank = stable_ranks(key, num_local_experts + 1)
    expert = jnp.minimum(key, num_local_experts - 1)
    assignment_row = jnp.where(key < num_local_experts, offsets[expert] + rank, num_rows).astype(
        jnp.int32
    )
    row_assignment = scatter_inverse(assignment_row, num_rows, sentinel=num_copies)
    return permutation.DispatchPlan(
        row_assignment=row_assignment,
        assignment_row=assignment_row.reshape(num_pairs, local_slots),
        group_sizes=group_sizes,
        tokens_per_expert=counts,
        dropped=jnp.zeros((), jnp.int32),
    )


# ----------------------------------------------------------------------------- one window


def window_path(
    window,
    x,
    weights,
    params,
    routing_experts,
    prefix,
    *,
    expert_fn,
    slots: PairSlots,
    axis_name,
    exchange: Exchange,
    alignment: int,
    fp8_recipe: Fp8Recipe | None = None,
):
    """``(y [T, H'] float32, copies sent)`` of one window: pairs out, experts, pair sums back
    (with ``fp8_recipe``, the pairs' rows in FP8: :mod:`jaxmoe.parallel.fp8_wire`)."""
    num_tokens, top_k = routing_experts.shape
    ep = prefix.shape[-1]
    rows, local_slots = slots.pair_rows, slots.local_slots
    if isinstance(exchange, ChunkedAllToAllExchange) and exchange.chunk_rows is None:
        exchange = ChunkedAllToAllExchange(default_chunk_rows(ep * rows, ep, rows))
    with jax.named_scope("ep_dispatch"):
        pairs = pair_send(routing_experts, prefix, window, slots)
        # The rows on the wire: x's, or its FP8 rows and scales packed as bytes (fp8_wire).
        wire_rows = x if fp8_recipe is None else fp8_wire.pack_rows(x, fp8_recipe)
        send = permutation.dispatch(wire_rows, pairs.plan).reshape(ep, rows, -1)
        pair_weights = permutation.permute_rows(
            weights.reshape(-1, 1).astype(jnp.float32),
            pairs.copy_assignment,
            pairs.copy_position,
        )
        # Ids ride with the weights (small ints are exact in float32): one small exchange.
        meta = jnp.concatenate(
            [pair_weights.reshape(ep * rows, local_slots), pairs.local_ids.astype(jnp.float32)],
            axis=1,
        ).reshape(ep, rows, 2 * local_slots)
        all_sizes = jax.lax.all_gather(pairs.send_sizes, axis_name)  # [ep (s), ep (d)]
        recv_sizes = jax.lax.dynamic_index_in_dim(
            all_sizes, jax.lax.axis_index(axis_name), axis=1, keepdims=False
        )
        recv = exchange_rows(exchange, send, pairs.send_sizes, recv_sizes, axis_name)
        recv = debug.poison_rows(recv, recv_sizes)
        recv_meta = exchange_rows(exchange, meta, pairs.send_sizes, recv_sizes, axis_name)
        # Rows past a sender's pairs are unspecified (the exchange contract): mask them.
        real = (jnp.arange(rows)[None, :] < recv_sizes[:, None]).reshape(-1, 1)
        recv_meta = recv_meta.reshape(ep * rows, 2 * local_slots)
        recv_ids = jax.lax.stop_gradient(recv_meta[:, local_slots:])
        recv_ids = jnp.where(real, jnp.round(recv_ids).astype(jnp.int32), -1)
        recv_weights = jnp.where(recv_ids >= 0, recv_meta[:, :local_slots], 0.0)
        num_rows = permutation.buffer_rows(
            ep * slots.copy_rows, slots.num_local_experts, alignment, None
        )
        plan = expand_plan(recv_ids, slots.num_local_experts, num_rows, alignment)
        buffer = permutation.dispatch(recv.reshape(ep * rows, -1), plan)
        buffer_fp8 = ()
        if fp8_recipe is not None:
            live_rows = jnp.sum(plan.group_sizes)
            buffer_fp8 = (fp8_wire.unpack_rows(buffer, x.shape[1], fp8_recipe, live_rows),)
            received = debug.poison_rows(
                fp8_wire.dequantized(*buffer_fp8[0], fp8_recipe, x.dtype), live_rows
            )
            transpose = functools.partial(
                _pair_rows_transpose, exchange=exchange, axis_name=axis_name
            )
            layout_operands = (plan, pairs.plan, pairs.send_sizes, recv_sizes)
            buffer = fp8_wire.with_gradient_of(x, received, transpose, layout_operands)
    with jax.named_scope("experts"):
        expert_out = expert_fn(buffer, plan.group_sizes, params, *buffer_fp8)
    with jax.named_scope("ep_combine"):
        pair_out = permutation.combine(expert_out, recv_weights, plan)  # float32 sums
        pair_out = pair_out.astype(expert_out.dtype).reshape(ep, rows, -1)
        back = exchange_rows(exchange, pair_out, recv_sizes, pairs.send_sizes, axis_name)
        back = debug.poison_rows(back, pairs.send_sizes)
        # Pair sums are already weighted: unit weights (typed like the layout, mesh-varying;
        # their unused gradient is dead code).
        unit = (compat.zeros_like_typed(prefix[0, 1:]) + 1).astype(jnp.float32)
        y = permutation.combine(back.reshape(ep * rows, -1), unit, pairs.plan)
    return y, pairs.copies_sent


def _pair_rows_transpose(grad_buffer, layout_operands, *, exchange, axis_name):
    """The VJP of a window's rows in ``x`` (pairs out, then the expand): the expand's and the
    pairs' transposes, each a float32 sum of copies with unit weights, as the dispatches' own
    VJPs add them, and the reverse exchange in between."""
    plan, pair_plan, send_sizes, recv_sizes = layout_operands

    def unit(assignment_row):
        return compat.zeros_like_typed(assignment_row).astype(jnp.float32) + 1

    ep, rows = send_sizes.shape[0], pair_plan.row_assignment.shape[0] // send_sizes.shape[0]
    grad_recv = permutation.combine(grad_buffer, unit(plan.assignment_row), plan)
    grad_recv = grad_recv.astype(grad_buffer.dtype).reshape(ep, rows, -1)
    grad_send = exchange_rows(exchange, grad_recv, recv_sizes, send_sizes, axis_name)
    return permutation.combine(
        grad_send.reshape(ep * rows, -1), unit(pair_plan.assignment_row), pair_plan
    )


# ----------------------------------------------------------------------------- the layer's step


def apply_experts(
    x,
    routing_experts,
    routing_weights,
    expert_fn,
    expert_params,
    *,
    num_experts,
    axis_name,
    exchange,
    capacity,
    receive_factor,
    fast_slot_factor,
    alignment,
    num_chunks,
    fp8_recipe=None,
):
    """:func:`~jaxmoe.parallel.ep_apply_experts` with ``dispatch="tokens"``: returns
    ``(out, tokens_per_expert, dropped, overflow)`` as its ``EPExpertsResult``. Window 0 of
    every chunk always, then one :func:`~jaxmoe.parallel.overflow.overflow_windows` loop over
    all chunks when the slot sizes leave room for an overflow."""
    if capacity is not None or receive_factor is not None:
        raise ValueError(
            "ep_apply_experts: dispatch='tokens' is dropless only: it needs capacity=None and "
            "receive_factor=None (the bounded, dropping paths use dispatch='copies')."
        )
    ep = jax.lax.axis_size(axis_name)
    if num_experts % ep:
        raise ValueError(
            f"ep_apply_experts: `num_experts` ({num_experts}) must be divisible by the size of "
            f"axis {axis_name!r} ({ep})."
        )
    num_tokens, top_k = routing_experts.shape
    chunk_tokens = num_tokens // num_chunks
    slots = PairSlots.for_layer(chunk_tokens, top_k, num_experts, ep, fast_slot_factor)
    path = functools.partial(
        window_path,
        expert_fn=expert_fn,
        slots=slots,
        axis_name=axis_name,
        exchange=resolve_exchange(exchange),
        alignment=alignment,
        fp8_recipe=None if fp8_recipe is None else resolve_recipe(fp8_recipe, "ep_apply_experts"),
    )

    # Every chunk's window 0 first, then one overflow loop over all chunks
    # (:mod:`jaxmoe.parallel.overflow`).
    by_chunk = routing_experts.reshape(num_chunks, chunk_tokens, top_k)
    prefixes = jnp.stack(
        [pair_prefix_counts(experts, slots.num_local_experts, ep) for experts in by_chunk]
    )  # [chunks, 2, T_c + 1, ep]
    chunks_path = chunked(path, num_chunks)
    operands = (x, routing_weights, expert_params, routing_experts, prefixes)
    y, copies_sent = chunks_path(0, *operands)
    overflow = sum(chunk_tokens * top_k - sent for sent in copies_sent)
    if slots.may_overflow(chunk_tokens):
        needed = windows_needed(prefixes, slots, axis_name)
        y = y + overflow_windows(chunks_path, needed, y, *operands)
    flat_experts = routing_experts.reshape(-1).astype(jnp.int32)
    tokens_per_expert = jnp.zeros((num_experts,), jnp.int32).at[flat_experts].add(1)
    return (
        y,
        tokens_per_expert,
        jnp.zeros((), jnp.int32),
        jnp.asarray(overflow, jnp.int32),
    )
