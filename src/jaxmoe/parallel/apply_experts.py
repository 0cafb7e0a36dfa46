"""Expert parallelism around an expert function: :func:`ep_apply_experts` dispatches each rank's
token copies (:func:`jaxmoe.parallel.dispatch.ep_dispatch`), runs the experts on the received
expert-major buffer and combines the outputs back (:func:`~jaxmoe.parallel.dispatch.ep_combine`),
dropless through a fast slot plus overflow windows, or with the copies or token dispatch
(module docstring of :mod:`jaxmoe.parallel.dispatch` for the layout, sizes and drops)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxmoe.ops.fp8 import Fp8Recipe, resolve_recipe
from jaxmoe.parallel import fp8_wire, layout, token_dispatch

#: ``ep_apply_experts(dispatch=...)``: one row per (token, expert) copy on the wire, or one per
#: (token, destination rank) pair (:mod:`jaxmoe.parallel.token_dispatch`).
from jaxmoe.parallel.dispatch import DISPATCH_NAMES, ep_combine, ep_dispatch
from jaxmoe.parallel.exchange import Exchange
from jaxmoe.parallel.overflow import chunked, overflow_windows


class EPExpertsResult(NamedTuple):
    """What :func:`ep_apply_experts` returns (this rank's view)."""

    out: jax.Array  # [T, H'] float32: each token's weighted expert outputs
    tokens_per_expert: jax.Array  # [E] int32 this rank's copies per (global) expert
    dropped: jax.Array  # int32 this rank's copies dropped by a capacity or a receive bound
    overflow: jax.Array  # int32 this rank's copies past the fast slots (sent in later windows)
    dropped_per_token: jax.Array  # [T] int32 each token's dropped copies (sums to `dropped`)


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
    dispatch: str = "copies",
    drop_policy: str = "position",
    sequence_length: int | None = None,
    fp8_dispatch: str | Fp8Recipe | None = None,
) -> EPExpertsResult:
    r""":func:`ep_dispatch`, ``expert_fn``, :func:`ep_combine`: dropless at the cost of balance.

    Dropless (``capacity`` and ``receive_factor`` None) slots would have to hold ``T*K`` rows
    for the worst case, all copies to one rank: ``ep`` times the balanced share, on the wire
    and in every buffer. With ``fast_slot_factor=f`` every slot has ``P = ceil(f*T*K/ep)``
    rows and the copies of a slot travel in windows of ``P`` (ordered by expert, then token)::

        y = path(window 0)                                   # always: the fast path
          + sum_{w = 1}^{W-1} path(window w),  W = ceil(max_{s,d} copies(s -> d) / P)

    Window 0 carries everything when routing is within ``f`` of balance; the later windows
    (the overflow) run in a ``lax.while_loop`` whose trip count ``W - 1`` every rank computes
    from the same all-gathered counts, so all ranks enter the same collectives. The common
    step has no conditional on its data path, and the overflow loop holds one window's
    buffers at a time. Its transpose is a second loop that recomputes each window's path and pulls
    the cotangent back through it (nothing of the overflow is kept for backward).
    Both are exact and drop nothing; each copy travels in exactly one window, so the result
    equals one device up to the float32 order of adding a token's windows.

    With a bound (``capacity`` or ``receive_factor``), or ``fast_slot_factor=None``
    (worst-case slots, ``P = T*K``), there is one window, which drops and counts what overflows.

    Args:
      x, routing_experts: as for :func:`ep_dispatch`.
      routing_weights: ``[T, K]`` combine weights, as for :func:`ep_combine`.
      expert_fn: ``expert_fn(buffer [R, H], group_sizes [E_l], expert_params) -> [R, H']``.
      expert_params: a pytree passed to ``expert_fn`` (e.g. the local expert weights).
      fast_slot_factor: ``f`` above (None: always the worst-case slots).
      num_chunks: split the ``T`` tokens into this many equal chunks, each its own dispatch,
        experts and combine (slots sized per chunk), so that the scheduler may overlap one
        chunk's exchange with another's matmuls. Every chunk's window 0 runs first, then one
        overflow loop runs window ``w`` of every chunk per step, ``W`` the most any chunk
        needs (a chunk past its own windows adds zeros; :mod:`jaxmoe.parallel.overflow`).
        Needs ``capacity=None``.
      dispatch: ``"copies"`` (one row per (token, expert) copy on the wire), ``"tokens"``
        (deduplicated: one row per (token, destination rank) pair, see
        :mod:`jaxmoe.parallel.token_dispatch`; dropless only: needs ``capacity`` and
        ``receive_factor`` None) or ``"auto"`` (:func:`jaxmoe.parallel.layout.auto_dispatch`:
        ``"tokens"`` where dropless and its modelled bytes, wire plus local work, are fewer).
        Where a pair can only be one copy (``ep == 1``, or ``min(K, E_l) == 1``) ``"tokens"``
        runs the copies path, which sends the same rows.
      drop_policy, sequence_length: with a capacity, as for :func:`ep_dispatch` (``"probs"``
        ranks by ``routing_weights``).
      fp8_dispatch: ``None``, or an FP8 recipe: the dispatch's rows cross the wire in FP8 with
        their scales, quantized once before the exchange (either ``dispatch``;
        :mod:`jaxmoe.parallel.fp8_wire`), and ``expert_fn`` is called as ``expert_fn(buffer,
        group_sizes, expert_params, buffer_fp8)`` with ``buffer_fp8 = (q, scale)`` the rows'
        FP8 operand (``fp8_grouped_matmul(buffer, ..., lhs_fp8=buffer_fp8)``) and ``buffer``
        their dequantized values, which carry the gradient back in ``x``'s dtype. The combine
        stays in the expert outputs' dtype.
      Others: as for :func:`ep_dispatch`.

    Returns:
      An :class:`EPExpertsResult` ``(out, tokens_per_expert, dropped, overflow,
      dropped_per_token)``.
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
    if dispatch not in DISPATCH_NAMES:
        raise ValueError(
            f"ep_apply_experts: `dispatch` must be one of {DISPATCH_NAMES}; got {dispatch!r}."
        )
    chunk_tokens = num_tokens // num_chunks
    if dispatch == "auto":
        dropless = capacity is None and receive_factor is None
        wire_row = None
        if fp8_dispatch is not None:
            wire_row = fp8_wire.row_bytes(x.shape[1], resolve_recipe(fp8_dispatch, "ep_dispatch"))
        dispatch = layout.auto_dispatch(
            top_k,
            num_experts,
            ep,
            dropless,
            num_tokens=chunk_tokens,
            hidden_size=x.shape[1],
            itemsize=jnp.dtype(x.dtype).itemsize,
            fast_slot_factor=fast_slot_factor,
            row_bytes=wire_row,
        )
    # With one rank, or one local expert per token and rank (K_l = 1), a pair is a copy: the
    # copies path sends the same rows without the ids and weights beside them.
    if dispatch == "tokens" and (ep == 1 or min(top_k, num_experts // ep) == 1):
        dispatch = "copies"
    if dispatch == "tokens":  # dropless only (it refuses a bound): nothing is dropped
        return EPExpertsResult(
            *token_dispatch.apply_experts(
                x,
                routing_experts,
                routing_weights,
                expert_fn,
                expert_params,
                num_experts=num_experts,
                axis_name=axis_name,
                exchange=exchange,
                capacity=capacity,
                receive_factor=receive_factor,
                fast_slot_factor=fast_slot_factor,
                alignment=alignment,
                num_chunks=num_chunks,
                fp8_recipe=fp8_dispatch,
            ),
            dropped_per_token=jnp.zeros((num_tokens,), jnp.int32),
        )
    # [chunks, ep, E]: each chunk's counts on every rank (one all-gather for all chunks).
    all_counts = layout.all_expert_counts(routing_experts, num_experts, axis_name, num_chunks)
    all_counts = all_counts.reshape(num_chunks, ep, num_experts)
    fast_rows = None
    if capacity is None and receive_factor is None and num_experts % ep == 0:
        fast_rows = layout.fast_slot_rows(
            chunk_tokens, top_k, ep, num_experts // ep, fast_slot_factor
        )
    factor = receive_factor if fast_rows is None else fast_slot_factor

    def window_path(window, x, weights, params, experts, counts):
        with jax.named_scope("ep_dispatch"):
            buffer, group_sizes, handle, *buffer_fp8 = ep_dispatch(
                x,
                experts,
                num_experts=num_experts,
                axis_name=axis_name,
                exchange=exchange,
                capacity=capacity,
                receive_factor=factor,
                alignment=alignment,
                all_counts=counts,
                window=window,
                drop_policy=drop_policy,
                sequence_length=sequence_length,
                routing_weights=weights,
                fp8_recipe=fp8_dispatch,
            )
        with jax.named_scope("experts"):
            expert_out = expert_fn(buffer, group_sizes, params, *buffer_fp8)
        with jax.named_scope("ep_combine"):
            return ep_combine(expert_out, weights, handle), handle

    # Chunks are independent exchanges and matmuls: XLA's latency-hiding scheduler
    # (--xla_gpu_enable_latency_hiding_scheduler=true) can run one chunk's all-to-all under
    # another chunk's expert matmuls. Every chunk's fast window comes first, then one overflow
    # loop for all chunks (:mod:`jaxmoe.parallel.overflow`).
    path = chunked(window_path, num_chunks)
    operands = (x, routing_weights, expert_params, routing_experts, all_counts)
    y, handles = path(0, *operands)
    tokens_per_expert = sum(handle.tokens_per_expert for handle in handles)
    left_out = sum(handle.dropped for handle in handles)
    dropped, overflow = 0, 0
    dropped_per_token = jnp.zeros((num_tokens,), jnp.int32)
    if fast_rows is None:
        dropped = left_out
        dropped_per_token = jnp.concatenate(
            [handle.send_plan.dropped_per_token for handle in handles]
        )
    else:
        # The fast windows leave out exactly this rank's overflow copies; they go through as
        # many later windows as the fullest slot of any chunk needs (P_fast < T*K: some may).
        overflow = left_out
        needed = layout.windows_needed(all_counts, fast_rows)
        y = y + overflow_windows(path, needed, y, *operands)
    return EPExpertsResult(
        out=y,
        tokens_per_expert=tokens_per_expert,
        dropped=jnp.asarray(dropped, jnp.int32),
        overflow=jnp.asarray(overflow, jnp.int32),
        dropped_per_token=dropped_per_token,
    )
