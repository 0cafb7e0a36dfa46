r"""Expert-parallel layout maths: slot sizes and the send/receive orders of every copy.

Every rank derives the whole layout from the all-gathered ``[ep, E]`` counts
(:func:`all_expert_counts`), so all ranks agree on it without another collective. The layout
itself is described in :mod:`jaxmoe.parallel.dispatch`; this module holds its arithmetic:

* :func:`slot_rows` / :func:`fast_slot_rows`: ``P``, the static rows per (sender, receiver) slot;
* :func:`pair_slot_rows` / :func:`pair_copy_rows`: the static sizes of the deduplicated
  (``ep_dispatch="tokens"``) slots, ``P_pairs`` rows and ``Q`` copies per slot and window;
* :func:`capacity_keep`: which copies a capacity keeps, by the ep group's drop policy;
* :func:`slot_layout`: the copies kept in each slot and where they start;
* :func:`send_plan`: my send buffer ``[ep*P]`` as a :class:`~jaxmoe.permutation.DispatchPlan`;
* :func:`receive_plan`: the sort of my receive buffer into expert-major blocks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxmoe import permutation
from jaxmoe.argument_checks import round_up
from jaxmoe.capacity import claim_ranks
from jaxmoe.field_rules import ceil_scaled
from jaxmoe.ranks import scatter_inverse, stable_ranks
from jaxmoe.sorted_search import search_right


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
        rows = min(rows, -(-ceil_scaled(receive_factor, num_tokens * top_k) // ep))
    return max(rows, 1)


def fast_slot_rows(
    num_tokens: int, top_k: int, ep: int, num_local_experts: int, factor: float | None
) -> int | None:
    """Slot rows of the dropless fast path (``ceil(factor * T*K / ep)``), or None where that
    saves nothing (it would hold ``T*K`` rows, the worst case, anyway) or ``factor`` is None."""
    if factor is None:
        return None
    rows = slot_rows(num_tokens, top_k, ep, num_local_experts, receive_factor=factor)
    return rows if rows < num_tokens * top_k else None


def expected_pair_fraction(top_k: int, num_experts: int, num_local_experts: int) -> float:
    """The chance that a token routed uniformly at random (``K`` distinct of ``E`` experts) has
    at least one expert on a given rank of ``E_l`` experts: ``1 - C(E-E_l, K) / C(E, K)``."""
    miss = math.comb(num_experts - num_local_experts, top_k) / math.comb(num_experts, top_k)
    return 1.0 - miss


def copies_per_pair(top_k: int, num_experts: int, ep: int) -> float:
    """Expected (token, expert) copies per (token, destination rank) pair under uniform routing:
    ``K / (ep * (1 - C(E - E_l, K) / C(E, K)))`` (1 where a pair can only be one copy)."""
    num_local = num_experts // ep
    if ep == 1 or min(top_k, num_local) == 1:
        return 1.0
    return top_k / (ep * expected_pair_fraction(top_k, num_experts, num_local))


# The token dispatch's local work beyond the copies path's (the pair bookkeeping, the expand,
# the pair sums and their float32 round trip), in rows of ``H`` in the layer's dtype per token:
# fitted to the two 2-GPU measurements (docs/expert-parallelism.md, "How "auto" chooses").
TOKEN_DISPATCH_LOCAL_ROWS = 5.4
# Metadata bytes per pair of the token dispatch: K_l float32 weights and K_l ids (as float32).
_PAIR_META_BYTES = 8


def exchange_bytes(
    dispatch: str,
    num_tokens: int,
    top_k: int,
    num_experts: int,
    ep: int,
    *,
    row_bytes: int,
    return_row_bytes: int | None = None,
    fast_slot_factor: float | None = 1.125,
) -> int:
    """Bytes one rank puts on the wire in the forward's exchanges of a dropless window 0: the
    operands of the dispatch's and the combine's collectives (each a whole ``[ep, slot, W]``
    send buffer, own slot included, as the HLO counts them; the ``[ep, E]`` count all-gather
    outside them is left out).

    ``"copies"``: ``ep * P * (row + return_row)``, ``P`` the fast slot (:func:`fast_slot_rows`;
    ``T*K`` without one). ``"tokens"``: ``ep * P_pairs * (row + 8 K_l + return_row) + 4 ep``
    (:func:`pair_slot_rows`; the pairs' ids and weights, and the all-gather of the send sizes);
    where a pair can only be one copy (``ep == 1`` or ``K_l == 1``) it runs the copies path.
    ``row_bytes``: one dispatched row (``H`` times the itemsize; FP8 rows with their scales:
    :func:`jaxmoe.parallel.fp8_wire.row_bytes`); ``return_row_bytes``: one combined row
    (default ``row_bytes``).
    """
    return_row_bytes = row_bytes if return_row_bytes is None else return_row_bytes
    num_local = num_experts // ep
    local_slots = min(top_k, num_local)
    if dispatch == "tokens" and ep > 1 and local_slots > 1:
        pairs = pair_slot_rows(num_tokens, top_k, num_experts, ep, fast_slot_factor)
        per_pair = row_bytes + _PAIR_META_BYTES * local_slots + return_row_bytes
        return ep * pairs * per_pair + 4 * ep
    rows = fast_slot_rows(num_tokens, top_k, ep, num_local, fast_slot_factor)
    rows = num_tokens * top_k if rows is None else rows
    return ep * rows * (row_bytes + return_row_bytes)


def dispatch_cost(
    dispatch: str,
    num_tokens: int,
    top_k: int,
    num_experts: int,
    ep: int,
    *,
    hidden_size: int,
    itemsize: int,
    fast_slot_factor: float | None = 1.125,
    row_bytes: int | None = None,
) -> float:
    """The modelled cost of one dispatch in bytes: :func:`exchange_bytes` plus, for the token
    dispatch (where it runs as such), its extra local work, :data:`TOKEN_DISPATCH_LOCAL_ROWS`
    rows of ``hidden_size * itemsize`` bytes per token. ``row_bytes``: a dispatched row
    (default ``hidden_size * itemsize``; FP8 rows are smaller); the combine's rows are
    ``hidden_size * itemsize``."""
    dense_row = hidden_size * itemsize
    cost = exchange_bytes(
        dispatch,
        num_tokens,
        top_k,
        num_experts,
        ep,
        row_bytes=dense_row if row_bytes is None else row_bytes,
        return_row_bytes=dense_row,
        fast_slot_factor=fast_slot_factor,
    )
    if dispatch == "tokens" and ep > 1 and min(top_k, num_experts // ep) > 1:
        cost += TOKEN_DISPATCH_LOCAL_ROWS * num_tokens * dense_row
    return cost


def auto_dispatch(
    top_k: int,
    num_experts: int,
    ep: int,
    dropless: bool,
    *,
    num_tokens: int = 4096,
    hidden_size: int = 4096,
    itemsize: int = 2,
    fast_slot_factor: float | None = 1.125,
    row_bytes: int | None = None,
) -> str:
    """What ``ep_dispatch="auto"`` runs: ``"tokens"`` where the layer is dropless and the
    token dispatch's :func:`dispatch_cost` is below the copies path's, else ``"copies"``.
    The defaults (4096 tokens of H = 4096 in bf16) stand for a layer whose slot rounding and
    pair metadata are negligible: the choice then depends on K, E and ep only."""
    if not dropless:
        return "copies"
    costs = {
        dispatch: dispatch_cost(
            dispatch,
            num_tokens,
            top_k,
            num_experts,
            ep,
            hidden_size=hidden_size,
            itemsize=itemsize,
            fast_slot_factor=fast_slot_factor,
            row_bytes=row_bytes,
        )
        for dispatch in ("copies", "tokens")
    }
    return "tokens" if costs["tokens"] < costs["copies"] else "copies"


def pair_slot_rows(
    num_tokens: int, top_k: int, num_experts: int, ep: int, factor: float | None
) -> int:
    """``P_pairs``: rows per (sender, receiver) slot of the token dispatch (one row per
    token with any expert on the receiver), ``min(T, ceil(f * T * expected_pair_fraction))``;
    ``T`` when ``factor`` is None (the worst case: every token has an expert on the receiver).

    E.g. K=8 of E=32 at ep=4: a uniformly routed token reaches a given rank with probability
    0.930, so ``f * 0.930 T = 1.046 T`` is capped at ``P_pairs = T`` rows (no pair window can
    overflow; only the copy bound ``Q`` can) where the copies path sends ``P = 2.25 T``. K=2 of
    E=8 at ep=4: ``0.464 f T`` pairs against ``P = 0.5 f T`` copies.
    """
    if factor is None:
        return max(num_tokens, 1)
    fraction = expected_pair_fraction(top_k, num_experts, num_experts // ep)
    return max(1, min(num_tokens, math.ceil(factor * num_tokens * fraction)))


def pair_copy_rows(
    num_tokens: int, top_k: int, num_experts: int, ep: int, factor: float | None
) -> int:
    """``Q``: the most copies one slot's pairs of one window may expand to on the receiver,
    ``min(T*K_l, max(K_l, ceil(f*T*K / ep)))`` with ``K_l = min(K, E_l)`` the most copies one
    pair holds (at least ``K_l``, so that every window takes at least one pair); ``T*K_l`` when
    ``factor`` is None. The receiver's expert buffer holds ``ep * Q`` copies (plus alignment).
    """
    num_local = num_experts // ep
    local_slots = min(top_k, num_local)
    if factor is None:
        return max(num_tokens * local_slots, 1)
    balanced = -(-ceil_scaled(factor, num_tokens * top_k) // ep)
    return max(1, min(num_tokens * local_slots, max(local_slots, balanced)))


def capacity_keep(
    routing_experts: jax.Array,
    num_experts: int,
    capacity: int,
    axis_name,
    *,
    drop_policy: str = "position",
    sequence_length: int | None = None,
    routing_weights: jax.Array | None = None,
):
    """Which of my copies a capacity ``C`` over the ep group's tokens keeps, and every rank's
    kept copies per expert.

    The capacity counts the ep group's ``ep * T`` tokens in rank order (as one device would
    for the group's tokens, concatenated): each rank gathers the group's expert ids (and, for
    ``"probs"``, routing weights; ``[T, K]`` each, small beside the tokens) and ranks them
    with :func:`jaxmoe.capacity.claim_ranks`, so every rank derives the same decision.

    Returns:
      ``(keep [T, K] bool, kept_counts [ep, E] int32)``: my copies kept, and rank ``s``'s
      kept copies of each expert.
    """
    num_tokens, top_k = routing_experts.shape
    ep = jax.lax.axis_size(axis_name)
    group_experts = jax.lax.all_gather(routing_experts.astype(jnp.int32), axis_name, tiled=True)
    group_weights = None
    if drop_policy == "probs":
        weights = jax.lax.stop_gradient(routing_weights).astype(jnp.float32)
        group_weights = jax.lax.all_gather(weights, axis_name, tiled=True)
    ranks = claim_ranks(
        group_experts,
        num_experts,
        drop_policy=drop_policy,
        sequence_length=sequence_length,
        weights=group_weights,
    )
    group_keep = ranks < capacity  # [ep*T, K]
    sender = jnp.arange(ep * num_tokens, dtype=jnp.int32)[:, None] // max(num_tokens, 1)
    kept_counts = (
        jnp.zeros((ep, num_experts), jnp.int32)
        .at[jnp.broadcast_to(sender, group_experts.shape), group_experts]
        .add(group_keep.astype(jnp.int32))
    )
    me = jax.lax.axis_index(axis_name)
    keep = jax.lax.dynamic_slice_in_dim(group_keep, me * num_tokens, num_tokens, axis=0)
    return keep, kept_counts


def slot_layout(all_counts, num_local_experts: int, rows: int, window=0):
    """Copies sent in one window of each slot, for every (sender s, receiver d, local expert e).

    ``all_counts`` ``[ep, E]``: each sender's copies of each expert to send (after any
    capacity, :func:`capacity_keep`).
    Within slot ``(s, d)`` sender ``s``'s copies for rank ``d`` are ordered by local expert,
    then token; their positions ``[window * P, (window + 1) * P)`` travel in this exchange
    (window 0: the first ``P``, all a bounded path sends). ``window`` may be traced; a window
    past a slot's copies keeps none of them (``kept`` 0: nothing sent, received or combined).

    Returns ``(kept, offset, skip)``, each ``[ep, ep, E_l]`` int32: sender ``s``'s copies of
    expert ``d*E_l + e`` in the window, where they start in the window, and how many of that
    expert's copies earlier windows hold.
    """
    ep = all_counts.shape[0]
    per_slot = all_counts.reshape(ep, ep, num_local_experts)
    slot_offset = jnp.cumsum(per_slot, axis=-1) - per_slot
    window_start = window * rows
    start = jnp.clip(slot_offset, window_start, window_start + rows)
    end = jnp.clip(slot_offset + per_slot, window_start, window_start + rows)
    return (
        (end - start).astype(jnp.int32),
        (start - window_start).astype(jnp.int32),
        (start - slot_offset).astype(jnp.int32),
    )


def windows_needed(all_counts: jax.Array, rows: int) -> jax.Array:
    """How many windows of ``rows`` the fullest slot of ``all_counts`` fills (int32, >= 1)."""
    ep = all_counts.shape[-2]
    return jnp.maximum((fullest_slot(all_counts, ep) + rows - 1) // rows, 1).astype(jnp.int32)


def send_plan(
    flat_experts, counts, kept_mine, offset_mine, skip_mine, rows: int, top_k: int, keep=None
):
    """The :class:`DispatchPlan` of my send buffer ``[ep*P]`` (slot-major, expert, token).

    ``kept_mine``, ``offset_mine``, ``skip_mine`` (``[ep (d), E_l]``) are my rows of
    :func:`slot_layout`: copy ``i`` of expert ``e`` (in token order, among the copies that
    ``keep`` ``[T, K]`` keeps, all if None) is sent when ``skip <= i < skip + kept``, to
    position ``offset + i - skip`` of its slot.
    """
    ep, num_local = kept_mine.shape
    num_experts = ep * num_local
    num_assignments = flat_experts.shape[0]
    kept_flat, offset_flat = kept_mine.reshape(-1), offset_mine.reshape(-1)
    skip_flat = skip_mine.reshape(-1)
    # Copy i of expert e (its rank among e's copies, in token order) goes out when skip <= i <
    # skip + kept; the send row -> assignment map is the inverse of assignment -> send row.
    # Copies a capacity drops are ranked under an extra key, apart from every expert's.
    kept_copy = True if keep is None else keep.reshape(-1)
    keys = flat_experts if keep is None else jnp.where(kept_copy, flat_experts, num_experts)
    rank = stable_ranks(keys, num_experts + (keep is not None)) - skip_flat[flat_experts]
    assignment_row = jnp.where(
        kept_copy & (rank >= 0) & (rank < kept_flat[flat_experts]),
        (flat_experts // num_local) * rows + offset_flat[flat_experts] + rank,
        ep * rows,
    ).astype(jnp.int32)
    row_assignment = scatter_inverse(assignment_row, ep * rows, sentinel=num_assignments)
    return permutation.DispatchPlan(
        row_assignment=row_assignment,
        assignment_row=assignment_row.reshape(-1, top_k),
        group_sizes=jnp.full((ep,), rows, jnp.int32),
        tokens_per_expert=counts,
        dropped=(num_assignments - jnp.sum(kept_mine)).astype(jnp.int32),
    )


def receive_plan(kept_here, offset_here, rows: int, alignment: int, block_rows: int | None):
    """Sorting of the receive buffer ``[ep*P]`` into expert-major blocks.

    ``kept_here``/``offset_here`` are ``[ep (sender), E_l]``. Returns ``(receive_index [R],
    receive_inverse [ep*P], group_sizes [E_l])``.
    """
    ep, num_local = kept_here.shape
    block_sizes = jnp.sum(kept_here, axis=0)  # [E_l] copies per local expert
    if block_rows is not None:
        group_sizes = jnp.full((num_local,), block_rows, jnp.int32)
    else:
        group_sizes = round_up(block_sizes, alignment).astype(jnp.int32)
    # The same static bound as on one device, for ep*P received rows (block_rows is aligned).
    num_rows = permutation.buffer_rows(ep * rows, num_local, alignment, block_rows)
    block_ends = jnp.cumsum(group_sizes)
    block_starts = block_ends - group_sizes
    sender_ends = jnp.cumsum(kept_here, axis=0)  # [ep, E_l]
    sender_starts = sender_ends - kept_here  # where sender s's copies start inside block e

    # Expert row -> receive row.
    expert_rows = jnp.arange(num_rows, dtype=jnp.int32)
    expert = jnp.minimum(search_right(block_ends, expert_rows), num_local - 1).astype(jnp.int32)
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
