"""Exchange bandwidth: ``ep_dispatch`` + ``ep_combine`` (forward, and forward+backward) of every
exchange against a bare ``jax.lax.all_to_all`` of the same payload in equal chunks and a bare
``jax.lax.ragged_all_to_all``.

Two bandwidths per row, both per rank and against the bare dense all-to-all's:

* ``gbps_per_rank`` (payload): the token copies each rank sends to other ranks, per second.
  Padding and local permutation passes count as overhead, so this is what a user gets.
* ``sent_gbps_per_rank`` (wire): the bytes the exchange actually puts on the wire (whole
  ``P``-row slots to every other rank, once per window, see ``jaxmoe.parallel.ep_apply_experts``)
  per second. Its ratio to the bare all-to-all says how well the exchange uses the wire for
  the bytes it chose to send; the payload ratio adds what padding costs.

``dispatch="tokens"`` rows (the token dispatch, :mod:`jaxmoe.parallel.token_dispatch`) send
``P_pairs``-row slots of (token, destination rank) pairs plus their ids and weights
(``8 * K_l`` bytes per row, forward only); their payload stays the copies of the same layer,
so a higher payload GB/s means the same result sooner. ``sent_bytes_per_roundtrip`` is what one
dispatch + combine (forward) puts on the wire to other ranks, per rank.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmoe.bench.harness import first_devices_mesh
from jaxmoe.bench.timing import time_jax
from jaxmoe.parallel import ep_apply_experts, layout, slot_rows, token_dispatch

EXCHANGE_SHAPE = {"tokens": 4096, "hidden": 7168, "top_k": 8, "experts_per_gpu": 8}
TINY_EXCHANGE_SHAPE = {"tokens": 64, "hidden": 32, "top_k": 4, "experts_per_gpu": 2}


def _random_routing(key, num_tokens: int, num_experts: int, top_k: int):

    scores = jax.random.uniform(key, (num_tokens, num_experts))
    return jnp.argsort(scores, axis=1)[:, :top_k].astype(jnp.int32)


def _off_rank_rows(experts: np.ndarray, ep: int, experts_per_rank: int) -> float:
    """Mean over ranks of the copies each sends to another rank (the real payload)."""
    tokens = experts.shape[0] // ep
    dest = experts // experts_per_rank
    owner = np.arange(experts.shape[0])[:, None] // tokens
    return float(np.sum(dest != owner)) / ep


def _sent_rows(experts, ep, experts_per_rank, top_k, factor, fast, chunks) -> float:
    """Rows each rank puts on the wire to other ranks in one exchange: per chunk, whole slots
    of ``P`` rows to every other rank, once per window the fullest slot of the chunk needs
    (the library's own slot and window rules, :mod:`jaxmoe.parallel.layout`)."""
    per_chunk = experts.shape[0] // ep // chunks
    fast_rows = None
    if factor is None:
        fast_rows = layout.fast_slot_rows(per_chunk, top_k, ep, experts_per_rank, fast)
    rows = fast_rows or slot_rows(per_chunk, top_k, ep, experts_per_rank, receive_factor=factor)
    num_experts = ep * experts_per_rank
    sent = 0
    for chunk in experts.reshape(ep, chunks, -1).swapaxes(0, 1):  # [ep, per_chunk * K]
        windows = 1
        if fast_rows is not None:
            counts = np.stack([np.bincount(rank, minlength=num_experts) for rank in chunk])
            windows = int(layout.windows_needed(jnp.asarray(counts, jnp.int32), rows))
        sent += windows * (ep - 1) * rows
    return float(sent)


def _sent_pair_bytes(experts, ep, experts_per_rank, top_k, fast, chunks, row_bytes) -> float:
    """Bytes each rank puts on the wire to other ranks in one dispatch + combine with
    ``dispatch="tokens"``: per chunk and window, whole ``P_pairs``-row slots both ways plus the
    ids and weights of the forward's pairs (the library's own sizes and window rule)."""
    per_chunk = experts.shape[0] // ep // chunks
    num_experts = ep * experts_per_rank
    slots = token_dispatch.PairSlots.for_layer(per_chunk, top_k, num_experts, ep, fast)
    meta_bytes = 2 * slots.local_slots * 4  # float32 weights and ids
    sent = 0.0
    for chunk in experts.reshape(ep, chunks, per_chunk, top_k).swapaxes(0, 1):
        windows = 1
        if slots.may_overflow(per_chunk):
            windows = max(
                int(
                    token_dispatch.windows_needed_here(
                        token_dispatch.pair_prefix_counts(rank, slots.num_local_experts, ep), slots
                    )
                )
                for rank in jnp.asarray(chunk)
            )
        sent += windows * (ep - 1) * slots.pair_rows * (2 * row_bytes + meta_bytes)
    return sent


def bench_exchange(
    ep: int,
    *,
    impls: Sequence[tuple],
    tiny: bool = False,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Times dispatch + combine (:func:`jaxmoe.parallel.ep_apply_experts` with identity experts)
    per ``(exchange, receive_factor[, fast_slot_factor[, chunks[, dispatch]]])``
    (fast_slot_factor defaults to the library default, 1.125, and acts only when dropless;
    chunks to 1; dispatch to ``"copies"``, or ``"tokens"``, dropless only), and the bare
    baselines."""

    shape = TINY_EXCHANGE_SHAPE if tiny else EXCHANGE_SHAPE
    tokens, hidden, top_k = shape["tokens"], shape["hidden"], shape["top_k"]
    num_local = shape["experts_per_gpu"]
    num_experts = num_local * ep
    mesh = first_devices_mesh(ep)
    dtype = jnp.bfloat16
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    batch = NamedSharding(mesh, P("ep"))
    x = jax.device_put(jax.random.normal(k1, (ep * tokens, hidden), dtype), batch)
    experts = jax.device_put(_random_routing(k2, ep * tokens, num_experts, top_k), batch)
    weights = jax.device_put(jax.random.uniform(k3, (ep * tokens, top_k), jnp.float32), batch)
    cotangent = jax.device_put(jax.random.normal(k4, (ep * tokens, hidden), dtype), batch)
    payload_rows = _off_rank_rows(np.asarray(experts), ep, num_local)
    row_bytes = hidden * jnp.dtype(dtype).itemsize
    rows_out = []

    def emit(row):
        # Every row names its shape: the tiny one is a CPU smoke test, never a measurement.
        row = {**row, "tokens_per_rank": tokens, "hidden": hidden, "top_k": top_k, "tiny": tiny}
        rows_out.append(row)
        log(json.dumps(row))

    # Bare dense all-to-all of the same payload (T*K rows) in equal chunks.
    chunk = tokens * top_k // ep
    slab = jax.device_put(
        jax.random.normal(k1, (ep * ep, chunk, hidden), dtype), NamedSharding(mesh, P("ep"))
    )
    dense = jax.jit(
        jax.shard_map(
            lambda b: jax.lax.all_to_all(b, "ep", 0, 0, tiled=True),
            mesh=mesh,
            in_specs=P("ep"),
            out_specs=P("ep"),
        )
    )
    dense_bytes = (ep - 1) * chunk * row_bytes
    timing = time_jax(dense, slab)
    dense_gbps = dense_bytes / timing.median_ms / 1e6
    emit(
        {
            "case": "exchange_bare",
            "ep": ep,
            "impl": "jax.lax.all_to_all (equal chunks)",
            "ms": timing.median_ms,
            "gbps_per_rank": dense_gbps,
            "ratio_vs_dense_a2a": 1.0,
        }
    )

    if jax.default_backend() != "cpu":

        def ragged(b):
            me = jax.lax.axis_index("ep").astype(jnp.int32)
            flat = b.reshape(ep * chunk, hidden)
            sizes = jnp.full((ep,), chunk, jnp.int32)
            return jax.lax.ragged_all_to_all(
                flat,
                jnp.zeros_like(flat),
                jnp.arange(ep, dtype=jnp.int32) * chunk,
                sizes,
                jnp.full((ep,), me * chunk, jnp.int32),
                sizes,
                axis_name="ep",
            ).reshape(b.shape)

        try:
            fn = jax.jit(jax.shard_map(ragged, mesh=mesh, in_specs=P("ep"), out_specs=P("ep")))
            timing = time_jax(fn, slab, repeats=5)
            gbps = dense_bytes / timing.median_ms / 1e6
            emit(
                {
                    "case": "exchange_bare",
                    "ep": ep,
                    "impl": "jax.lax.ragged_all_to_all (equal chunks)",
                    "ms": timing.median_ms,
                    "gbps_per_rank": gbps,
                    "ratio_vs_dense_a2a": gbps / dense_gbps,
                }
            )
        except Exception as error:  # noqa: BLE001 - record and go on
            emit(
                {
                    "case": "exchange_bare",
                    "ep": ep,
                    "impl": "ragged_all_to_all",
                    "error": str(error)[:300],
                }
            )

    for spec in impls:
        impl, factor = spec[0], spec[1]
        fast = spec[2] if len(spec) > 2 else 1.125
        chunks = spec[3] if len(spec) > 3 else 1
        dispatch = spec[4] if len(spec) > 4 else "copies"

        def roundtrip(
            x,
            experts,
            weights,
            impl=impl,
            factor=factor,
            fast=fast,
            chunks=chunks,
            dispatch=dispatch,
        ):
            y, _, dropped, *_ = ep_apply_experts(
                x,
                experts,
                weights,
                lambda buffer, sizes, params: buffer,
                None,
                num_experts=num_experts,
                axis_name="ep",
                exchange=impl,
                receive_factor=factor,
                fast_slot_factor=fast,
                num_chunks=chunks,
                dispatch=dispatch,
            )
            return y.astype(x.dtype), dropped[None]

        fwd = jax.jit(
            jax.shard_map(
                roundtrip, mesh=mesh, in_specs=(P("ep"),) * 3, out_specs=(P("ep"), P("ep"))
            )
        )

        def loss(x, weights, experts, cotangent, fwd=fwd):
            y, _ = fwd(x, experts, weights)
            return jnp.sum(y.astype(jnp.float32) * cotangent.astype(jnp.float32))

        fwd_bwd = jax.jit(jax.grad(loss, argnums=(0, 1)))
        if factor is not None:
            label = f"{impl} (receive_factor={factor})"
        elif fast is not None:
            label = f"{impl} (dropless, fast slots {fast}x)"
        else:
            label = f"{impl} (dropless, worst-case slots)"
        if chunks > 1:
            label = label[:-1] + f", {chunks} chunks)"
        routing = np.asarray(experts)
        if dispatch == "tokens":
            label = label[:-1] + ", tokens dispatch)"
            sent_bytes = _sent_pair_bytes(routing, ep, num_local, top_k, fast, chunks, row_bytes)
            sent_rows = sent_bytes / (2 * row_bytes)  # row-equivalents per exchange
        else:
            sent_rows = _sent_rows(routing, ep, num_local, top_k, factor, fast, chunks)
            sent_bytes = 2 * sent_rows * row_bytes
        try:
            dropped = int(np.sum(np.asarray(fwd(x, experts, weights)[1])))
            for case, fn, args, exchanges in (
                ("exchange_fwd", fwd, (x, experts, weights), 2),
                ("exchange_fwd_bwd", fwd_bwd, (x, weights, experts, cotangent), 4),
            ):
                timing = time_jax(fn, *args, repeats=5 if impl == "ragged_all_to_all" else 10)
                gbps = exchanges * payload_rows * row_bytes / timing.median_ms / 1e6
                sent_gbps = exchanges / 2 * sent_bytes / timing.median_ms / 1e6
                emit(
                    {
                        "case": case,
                        "ep": ep,
                        "impl": label,
                        "ms": timing.median_ms,
                        "gbps_per_rank": gbps,
                        "ratio_vs_dense_a2a": gbps / dense_gbps,
                        "sent_gbps_per_rank": sent_gbps,
                        "sent_ratio_vs_dense_a2a": sent_gbps / dense_gbps,
                        "sent_rows_per_exchange": sent_rows,
                        "sent_bytes_per_roundtrip": sent_bytes,
                        "payload_rows_per_exchange": payload_rows,
                        "dropped": dropped,
                    }
                )
        except Exception as error:  # noqa: BLE001 - record and go on
            emit({"case": "exchange", "ep": ep, "impl": label, "error": str(error)[:300]})
    return rows_out
