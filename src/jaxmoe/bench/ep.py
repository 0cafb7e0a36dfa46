"""Expert-parallel benchmark: correctness of every exchange, exchange bandwidth, layer weak scaling.

Three parts, each over the EP sizes asked for (any sizes the devices allow):

* ``correctness``: the sharded layer (every exchange the platform runs) against the one-device
  layer, float32: output, every gradient and the stats.
* ``exchange``: ``ep_dispatch`` + ``ep_combine`` (forward, and forward+backward), against a bare
  ``jax.lax.all_to_all`` of the same payload in equal chunks and a bare
  ``jax.lax.ragged_all_to_all``. Bandwidth = bytes each rank sends to other ranks per second
  (real rows only: padding a dense exchange sends is overhead, not payload), so an exchange that
  sends padding or permutes locally shows a lower number than the bare all-to-all.
* ``layer``: ``jaxmoe.moe`` forward+backward at fixed tokens per GPU (weak scaling), tokens/s
  per GPU, on a DeepSeek-V3-like and a Mixtral-like layer (bf16).

Use::

    rows = run_ep_benchmark([1, 2, 4])
    write_results(rows, benchmark_header("python benchmarks/ep.py --ep 1,2,4"), "out", "ep-h200")
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxmoe.bench.timing import time_jax


@dataclasses.dataclass(frozen=True)
class EPLayerCase:
    """A layer for weak scaling: ``experts_per_gpu`` set means E grows with EP, else E fixed."""

    name: str
    hidden_size: int
    ffn_size: int
    top_k: int
    tokens_per_gpu: int
    num_experts: int | None = None
    experts_per_gpu: int | None = None
    score: str = "softmax"
    num_groups: int = 1
    group_top_k: int | None = None
    use_expert_bias: bool = False
    # Forced-balanced routing (Megatron-Core's MoE baseline): inputs and router built so that the
    # real router sends token t to experts (t*K + j) mod E, every expert getting T*K/E copies.
    balanced: bool = False

    def experts(self, ep: int) -> int:
        return self.num_experts if self.num_experts is not None else self.experts_per_gpu * ep

    def config(self, ep: int, **overrides):
        """The case's ``MoEConfig`` at expert-parallel size ``ep`` (``overrides`` on top)."""
        import jaxmoe

        return jaxmoe.MoEConfig(
            num_experts=self.experts(ep),
            top_k=self.top_k,
            hidden_size=self.hidden_size,
            ffn_size=self.ffn_size,
            score=self.score,
            num_groups=self.num_groups,
            group_top_k=self.group_top_k,
            use_expert_bias=self.use_expert_bias,
            **overrides,
        )


LAYER_CASES = {
    "dsv3": EPLayerCase("dsv3", 7168, 2048, 8, 4096, experts_per_gpu=8),
    "mixtral": EPLayerCase("mixtral", 4096, 14336, 2, 4096, num_experts=8),
    # Megatron-Core's published per-layer proxies (8xH100, EP8, 4096 tokens per GPU).
    "megatron-mixtral": EPLayerCase(
        "megatron-mixtral", 4096, 14336, 2, 4096, num_experts=8, balanced=True
    ),
    "megatron-dsv3": EPLayerCase(
        "megatron-dsv3",
        7168,
        2048,
        8,
        4096,
        num_experts=256,
        score="sigmoid",
        num_groups=8,
        group_top_k=4,
        use_expert_bias=True,
        balanced=True,
    ),
}
TINY_LAYER_CASES = {
    "dsv3": EPLayerCase("dsv3-tiny", 64, 32, 4, 64, experts_per_gpu=4),
    "mixtral": EPLayerCase("mixtral-tiny", 32, 64, 2, 64, num_experts=8),
    "megatron-mixtral": EPLayerCase(
        "megatron-mixtral-tiny", 32, 64, 2, 64, num_experts=8, balanced=True
    ),
    "megatron-dsv3": EPLayerCase(
        "megatron-dsv3-tiny",
        64,
        32,
        8,
        64,
        num_experts=32,
        score="sigmoid",
        num_groups=8,
        group_top_k=4,
        use_expert_bias=True,
        balanced=True,
    ),
}


def balanced_inputs(x, router_kernel, num_experts: int, top_k: int, scale: float = 30.0):
    """Makes the real router pick experts ``(t*K + j) mod E`` for token t: exact balance.

    The first E features of each token become a one-hot-like code of its K experts (larger for
    earlier choices) and the router kernel's first E rows an identity, so the logits rank those
    K experts first. With group-limited routing the K experts of a token must lie in at most
    ``group_top_k`` groups: consecutive experts do when ``K <= (E / G) * group_top_k``.
    """
    import jax.numpy as jnp

    tokens = x.shape[0] * x.shape[1] if x.ndim == 3 else x.shape[0]
    choice = (jnp.arange(tokens)[:, None] * top_k + jnp.arange(top_k)[None, :]) % num_experts
    code = jnp.zeros((tokens, num_experts), jnp.float32)
    code = code.at[jnp.arange(tokens)[:, None], choice].set(
        scale * (1.0 + 0.01 * (top_k - jnp.arange(top_k, dtype=jnp.float32)))[None, :]
    )
    flat = x.reshape(tokens, x.shape[-1]).astype(jnp.float32)
    flat = flat.at[:, :num_experts].set(code)
    kernel = (
        router_kernel.astype(jnp.float32)
        .at[:num_experts]
        .set(jnp.eye(num_experts, dtype=jnp.float32))
    )
    return flat.reshape(x.shape).astype(x.dtype), kernel.astype(router_kernel.dtype)


EXCHANGE_SHAPE = {"tokens": 4096, "hidden": 7168, "top_k": 8, "experts_per_gpu": 8}
TINY_EXCHANGE_SHAPE = {"tokens": 64, "hidden": 32, "top_k": 4, "experts_per_gpu": 2}


def _jax():
    import jax

    return jax


def _mesh(ep: int):
    jax = _jax()
    devices = jax.devices()
    if ep > len(devices):
        raise ValueError(f"EP={ep} needs {ep} devices; {len(devices)} available.")
    return jax.sharding.Mesh(np.array(devices[:ep]), ("ep",))


def _rel(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _platform() -> str:
    return _jax().default_backend()


def available_exchanges(platform: str | None = None) -> list[str]:
    """Exchange names that run on ``platform``."""
    from jaxmoe.parallel.exchange import EXCHANGES

    platform = platform or _platform()
    names = []
    for name, cls in EXCHANGES.items():
        try:
            cls().check_platform(platform)
        except NotImplementedError:
            continue
        names.append(name)
    return names


# ---------------------------------------------------------------------------------------------
# Correctness


def check_correctness(ep: int, impl: str, *, tiny: bool = False, seed: int = 0) -> dict[str, Any]:
    """Relative errors of the sharded layer against one device (float32, highest precision)."""
    jax = _jax()
    import jax.numpy as jnp

    import jaxmoe

    hidden, ffn, tokens = (32, 64, 32) if tiny else (256, 512, 256)
    base = jaxmoe.MoEConfig(
        num_experts=2 * ep,
        top_k=2,
        hidden_size=hidden,
        ffn_size=ffn,
        aux_loss_coef=0.01,
        z_loss_coef=0.001,
        seq_aux_loss_coef=0.01,
    )
    cfg = dataclasses.replace(base, ep_axis="ep", ep_exchange=impl)
    mesh = _mesh(ep)
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    params = jaxmoe.init_params(k1, base)
    x = jax.random.normal(k2, (ep * 2, tokens // 2, hidden), jnp.float32)
    cotangent = jax.random.normal(k3, x.shape, jnp.float32)

    def loss(params, x, sharded):
        y, stats = jaxmoe.moe(params, x, cfg if sharded else base, mesh=mesh if sharded else None)
        return jnp.sum(y * cotangent) + stats.aux_loss, (y, stats)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
    with jax.default_matmul_precision("highest"):
        (g_ref, (y_ref, s_ref)) = grad(params, x, False)
        (g_ep, (y_ep, s_ep)) = grad(params, x, True)
    grad_errs = jax.tree.leaves(jax.tree.map(_rel, g_ep, g_ref))
    stat_errs = [_rel(a, b) for a, b in zip(s_ep, s_ref, strict=True)]
    row = {
        "case": "correctness",
        "ep": ep,
        "impl": impl,
        "rel_err_y": _rel(y_ep, y_ref),
        "max_rel_err_grad": max(grad_errs),
        "max_rel_err_stats": max(stat_errs),
    }
    row["ok"] = max(row["rel_err_y"], row["max_rel_err_grad"], row["max_rel_err_stats"]) < 1e-4
    return row


# ---------------------------------------------------------------------------------------------
# Exchange bandwidth


def _random_routing(key, num_tokens: int, num_experts: int, top_k: int):
    jax = _jax()
    import jax.numpy as jnp

    scores = jax.random.uniform(key, (num_tokens, num_experts))
    return jnp.argsort(scores, axis=1)[:, :top_k].astype(jnp.int32)


def _off_rank_rows(experts: np.ndarray, ep: int, experts_per_rank: int) -> float:
    """Mean over ranks of the copies each sends to another rank (the real payload)."""
    tokens = experts.shape[0] // ep
    dest = experts // experts_per_rank
    owner = np.arange(experts.shape[0])[:, None] // tokens
    return float(np.sum(dest != owner)) / ep


def bench_exchange(
    ep: int,
    *,
    impls: Sequence[tuple],
    tiny: bool = False,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Times dispatch + combine (:func:`jaxmoe.parallel.ep_apply_experts` with identity experts)
    per ``(exchange, receive_factor[, fast_slot_factor[, chunks]])`` (fast_slot_factor defaults
    to the library default, 1.125, and acts only when dropless; chunks to 1), and the bare
    baselines."""
    jax = _jax()
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxmoe.parallel import ep_apply_experts

    shape = TINY_EXCHANGE_SHAPE if tiny else EXCHANGE_SHAPE
    tokens, hidden, top_k = shape["tokens"], shape["hidden"], shape["top_k"]
    num_local = shape["experts_per_gpu"]
    num_experts = num_local * ep
    mesh = _mesh(ep)
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

    if _platform() != "cpu":

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

        def roundtrip(x, experts, weights, impl=impl, factor=factor, fast=fast, chunks=chunks):
            y, _, dropped, _ = ep_apply_experts(
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
        try:
            dropped = int(np.sum(np.asarray(fwd(x, experts, weights)[1])))
            for case, fn, args, exchanges in (
                ("exchange_fwd", fwd, (x, experts, weights), 2),
                ("exchange_fwd_bwd", fwd_bwd, (x, weights, experts, cotangent), 4),
            ):
                timing = time_jax(fn, *args, repeats=5 if impl == "ragged_all_to_all" else 10)
                gbps = exchanges * payload_rows * row_bytes / timing.median_ms / 1e6
                emit(
                    {
                        "case": case,
                        "ep": ep,
                        "impl": label,
                        "ms": timing.median_ms,
                        "gbps_per_rank": gbps,
                        "ratio_vs_dense_a2a": gbps / dense_gbps,
                        "dropped": dropped,
                    }
                )
        except Exception as error:  # noqa: BLE001 - record and go on
            emit({"case": "exchange", "ep": ep, "impl": label, "error": str(error)[:300]})
    return rows_out


# ---------------------------------------------------------------------------------------------
# Layer weak scaling


def _fullest_slot(params, x, cfg, mesh) -> int:
    """The fullest (sender, receiver) slot of the layer's own routing, computed as the layer
    does (``route_tokens`` per shard, then ``all_expert_counts`` and ``fullest_slot``): at most
    ``ceil(fast_slot_factor * T*K / ep)`` means the dropless fast path ran."""
    jax = _jax()
    from jax.sharding import PartitionSpec as P

    from jaxmoe import stages
    from jaxmoe.parallel import (
        all_expert_counts,
        batch_partition_spec,
        fullest_slot,
        param_partition_specs,
    )

    ep = mesh.shape["ep"]

    def body(params, x):
        routing, _ = stages.route_tokens(params, x.reshape(-1, cfg.hidden_size), cfg, 1)
        counts = all_expert_counts(routing.experts, cfg.num_experts, "ep")
        return fullest_slot(counts, ep)[None]

    specs = param_partition_specs(cfg)
    fn = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=({k: specs[k] for k in params}, batch_partition_spec(cfg, x.ndim)),
        out_specs=P("ep"),
        check_vma=False,
    )
    return int(np.max(np.asarray(jax.jit(fn)(params, x))))


def bench_layer(
    case: EPLayerCase,
    ep: int,
    *,
    exchange: str | None = None,
    receive_factor: float | None = 1.25,
    fast_slot_factor: float | None = 1.125,
    chunks: int = 1,
    backend: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """``jaxmoe.moe`` forward+backward on ``ep`` devices, ``case.tokens_per_gpu`` tokens each."""
    jax = _jax()
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    import jaxmoe
    from jaxmoe.parallel import batch_partition_spec, param_partition_specs

    cfg = case.config(
        ep,
        dtype=jnp.bfloat16,
        param_dtype=jnp.bfloat16,
        aux_loss_coef=0.01,
        ep_axis="ep",
        ep_exchange=exchange,
        ep_receive_factor=receive_factor,
        ep_fast_slot_factor=fast_slot_factor,
        ep_chunks=chunks if ep > 1 else 1,
        grouped_matmul_backend=backend,
    )
    mesh = _mesh(ep)
    k1, k2 = jax.random.split(jax.random.key(seed))
    params = jaxmoe.init_params(k1, cfg)
    seq = min(case.tokens_per_gpu, 1024)
    x = jax.random.normal(
        k2, (ep * case.tokens_per_gpu // seq, seq, case.hidden_size), jnp.bfloat16
    )
    if case.balanced:
        x, params["router"]["kernel"] = balanced_inputs(
            x, params["router"]["kernel"], cfg.num_experts, cfg.top_k
        )
    params = jax.tree.map(
        lambda v, s: jax.device_put(v, NamedSharding(mesh, s)),
        params,
        param_partition_specs(cfg),
        is_leaf=lambda v: isinstance(v, jax.sharding.PartitionSpec),
    )
    x = jax.device_put(x, NamedSharding(mesh, batch_partition_spec(cfg, 3)))

    def loss(params, x):
        y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh)
        loss = jnp.mean(jnp.square(y.astype(jnp.float32))) + stats.aux_loss
        return loss, (stats.dropped_tokens, stats.tokens_per_expert)

    step = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))
    _, (dropped, tokens_per_expert) = step(params, x)
    fullest = _fullest_slot(params, x, cfg, mesh)
    share = case.tokens_per_gpu * case.top_k / ep
    load = np.asarray(tokens_per_expert, np.float64)
    timing = time_jax(step, params, x)
    return {
        "case": f"layer_fwd_bwd:{case.name}",
        "ep": ep,
        "impl": exchange or "default",
        "ms": timing.median_ms,
        "tokens_per_s_per_gpu": case.tokens_per_gpu / timing.median_ms * 1e3,
        "ratio_vs_dense_a2a": None,
        "receive_factor": receive_factor,
        "fast_slot_factor": fast_slot_factor,
        "ep_chunks": chunks if ep > 1 else 1,
        "fullest_slot_over_share": fullest / share,
        "dropped_tokens": int(dropped),
        "num_experts": cfg.num_experts,
        "max_over_mean_load": float(load.max() / load.mean()),
        # Expert-matmul FLOPs (3 matmuls, fwd+bwd = 3x fwd) per GPU per second.
        "tflops_per_gpu": 3
        * 3
        * 2
        * case.tokens_per_gpu
        * case.top_k
        * case.hidden_size
        * case.ffn_size
        / timing.median_ms
        / 1e9,
    }


# ---------------------------------------------------------------------------------------------
# Driver


def run_ep_benchmark(
    ep_sizes: Sequence[int],
    *,
    parts: Sequence[str] = ("correctness", "exchange", "layer"),
    cases: Sequence[str] = ("dsv3", "mixtral"),
    tiny: bool = False,
    receive_factor: float | None = 1.25,
    fast_slot_factor: float | None = 1.125,
    chunks: int = 1,
    budget_s: float = 1e9,
    exchange_ep: Sequence[int] | None = None,
    exchanges: Sequence[str] | None = None,
    layer_exchange: str | None = None,
    log: Callable[[str], None] = print,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Runs the parts in order over ``ep_sizes``; stops starting new work past ``budget_s``.

    ``exchanges`` restricts the exchange part to these names (default: all that run here);
    ``layer_exchange`` is the layer part's ``ep_exchange`` (None: the default), with
    ``receive_factor`` as its ``ep_receive_factor`` (None: dropless) and ``fast_slot_factor``
    as its ``ep_fast_slot_factor``.
    """
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def emit(row):
        rows.append(row)
        log(json.dumps(row))
        if on_row is not None:
            on_row(row)

    def out_of_time(what):
        if time.perf_counter() - start > budget_s:
            emit({"case": "skipped", "impl": what, "reason": f"time budget {budget_s}s spent"})
            return True
        return False

    impls_here = available_exchanges()

    def correctness():
        # At the largest EP only (every exchange): the CPU suite covers the other sizes.
        ep = max(ep_sizes)
        if ep < 2:
            return
        for impl in ("all_to_all", "all_gather", "ragged_all_to_all"):
            if out_of_time(f"correctness ep={ep} {impl}"):
                return
            try:
                emit(check_correctness(ep, impl, tiny=tiny))
            except NotImplementedError as error:
                emit({"case": "correctness", "ep": ep, "impl": impl, "unsupported": str(error)})

    def exchange():
        exchange_impls = [
            ("all_to_all", None, fast_slot_factor or 1.125),  # the default
            ("all_to_all", None, fast_slot_factor or 1.125, 2),
            ("all_to_all", None, fast_slot_factor or 1.125, 4),
            ("all_to_all", None, None),
            ("all_to_all", receive_factor or 1.25, None),
            ("all_to_all_chunked", None, None),
            ("all_gather", None, fast_slot_factor or 1.125),
        ]
        if "ragged_all_to_all" in impls_here:
            exchange_impls.append(("ragged_all_to_all", None, fast_slot_factor or 1.125))
        if exchanges:
            exchange_impls = [spec for spec in exchange_impls if spec[0] in exchanges]
        for ep in ep_sizes if exchange_ep is None else exchange_ep:
            if ep < 2 or out_of_time(f"exchange ep={ep}"):
                continue
            for row in bench_exchange(ep, impls=exchange_impls, tiny=tiny, log=lambda _: None):
                emit(row)

    def layer():
        table = TINY_LAYER_CASES if tiny else LAYER_CASES
        backend = None
        for name in cases:
            case = table[name]
            base = None
            for ep in sorted(ep_sizes):
                if case.num_experts is not None and case.num_experts % ep:
                    continue
                if out_of_time(f"layer {name} ep={ep}"):
                    return

                def attempt(backend, case=case, ep=ep):
                    return bench_layer(
                        case,
                        ep,
                        exchange=layer_exchange,
                        receive_factor=receive_factor,
                        fast_slot_factor=fast_slot_factor,
                        chunks=chunks,
                        backend=backend,
                    )

                def error_row(error, case=case, ep=ep):
                    return {
                        "case": f"layer_fwd_bwd:{case.name}",
                        "ep": ep,
                        "error": str(error)[:300],
                    }

                try:
                    row = attempt(backend)
                except Exception as error:  # noqa: BLE001 - the Pallas kernel may not be ready
                    if backend is not None:
                        emit(error_row(error))
                        continue
                    log(f"backend auto failed ({str(error)[:300]}); retrying with backend='xla'")
                    backend = "xla"
                    try:
                        row = attempt(backend)
                    except Exception as error2:  # noqa: BLE001
                        emit(error_row(error2))
                        continue
                row["grouped_matmul_backend"] = backend or "auto"
                if base is None:
                    base = row
                row["weak_scaling_vs_first"] = (
                    row["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
                )
                emit(row)

    for part in parts:
        {"correctness": correctness, "exchange": exchange, "layer": layer}[part]()
    return rows


def benchmark_header(command: str) -> dict[str, Any]:
    """Where and how the numbers were taken."""
    jax = _jax()
    header = {
        "device": jax.devices()[0].device_kind,
        "num_devices": len(jax.devices()),
        "jax": jax.__version__,
        "torch": None,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "bandwidth": "bytes each rank sends to other ranks per second, real rows only "
        "(dispatch+combine fwd = 2 exchanges, fwd+bwd = 4)",
        "timing": "median ms per call after warm-up (jaxmoe.bench.timing.time_jax)",
    }
    try:
        import torch

        header["torch"] = torch.__version__
    except Exception:  # noqa: BLE001
        pass
    return header


def markdown(rows: Sequence[dict[str, Any]], header: dict[str, Any]) -> str:
    """The rows as markdown tables, one per part."""
    lines = [
        f"# Expert-parallel benchmark ({header['device']} x{header.get('num_devices')})",
        "",
        f"jax {header['jax']}; torch {header['torch']}; {header['date']}; `{header['command']}`.",
        "",
    ]
    parts = (
        (
            "Correctness (float32, vs one device)",
            ("correctness",),
            (
                "ep",
                "impl",
                "rel_err_y",
                "max_rel_err_grad",
                "max_rel_err_stats",
                "ok",
                "unsupported",
            ),
        ),
        (
            "Exchange bandwidth (" + header["bandwidth"] + ")",
            ("exchange_bare", "exchange_fwd", "exchange_fwd_bwd", "exchange"),
            ("case", "ep", "impl", "ms", "gbps_per_rank", "ratio_vs_dense_a2a", "dropped", "error"),
        ),
        (
            "Layer forward+backward, weak scaling",
            ("layer_fwd_bwd",),
            (
                "case",
                "ep",
                "ms",
                "tokens_per_s_per_gpu",
                "weak_scaling_vs_first",
                "receive_factor",
                "fast_slot_factor",
                "ep_chunks",
                "fullest_slot_over_share",
                "dropped_tokens",
                "grouped_matmul_backend",
                "error",
            ),
        ),
    )
    for title, prefixes, cols in parts:
        selected = [r for r in rows if str(r.get("case", "")).split(":")[0] in prefixes]
        if not selected:
            continue
        lines += [f"## {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in selected:
            cells = []
            for c in cols:
                v = r.get(c, "")
                cells.append(
                    f"{v:.4g}" if isinstance(v, float) else str(v if v is not None else "")
                )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_results(rows, header, out_dir: str, stem: str) -> tuple[str, str]:
    """Writes ``{stem}.json`` (``{"header", "rows"}``) and ``{stem}.md``."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, f"{stem}.json")
    md_path = os.path.join(out_dir, f"{stem}.md")
    with open(json_path, "w") as f:
        json.dump({"header": header, "rows": list(rows)}, f, indent=1)
    with open(md_path, "w") as f:
        f.write(markdown(rows, header))
    return json_path, md_path


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Command line: ``python benchmarks/ep.py --ep 1,2,4 [--tiny] [--out DIR]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", default="1,2,4", help="comma-separated EP sizes")
    parser.add_argument("--parts", default="correctness,exchange,layer")
    parser.add_argument("--cases", default="dsv3,mixtral")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument(
        "--receive-factor",
        type=lambda v: None if v.lower() == "none" else float(v),
        default=1.25,
        help="layer part's ep_receive_factor ('none' = dropless)",
    )
    parser.add_argument(
        "--fast-slot-factor",
        type=lambda v: None if v.lower() == "none" else float(v),
        default=1.125,
        help="ep_fast_slot_factor of the layer part and of the default exchange row",
    )
    parser.add_argument("--chunks", type=int, default=1, help="layer part's ep_chunks")
    parser.add_argument("--exchanges", default="", help="exchange part: only these names")
    parser.add_argument("--layer-exchange", default=None, help="layer part's ep_exchange")
    parser.add_argument("--budget-s", type=float, default=1e9)
    parser.add_argument("--exchange-ep", default="", help="EP sizes of the exchange part")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    parser.add_argument("--stem", default="ep")
    args = parser.parse_args(argv)
    ep_sizes = [int(v) for v in args.ep.split(",") if v]
    header = benchmark_header("python benchmarks/ep.py " + " ".join(argv or []))
    rows: list[dict[str, Any]] = []

    def save(row):
        rows.append(row)
        write_results(rows, header, args.out, args.stem)  # after every row: partial runs count

    run_ep_benchmark(
        ep_sizes,
        parts=args.parts.split(","),
        cases=args.cases.split(","),
        tiny=args.tiny,
        receive_factor=args.receive_factor,
        fast_slot_factor=args.fast_slot_factor,
        chunks=args.chunks,
        budget_s=args.budget_s,
        exchange_ep=[int(v) for v in args.exchange_ep.split(",") if v] or None,
        exchanges=[v for v in args.exchanges.split(",") if v] or None,
        layer_exchange=args.layer_exchange,
        on_row=save,
    )
    write_results(rows, header, args.out, args.stem)
    print(markdown(rows, header))
    return rows


__all__ = [
    "LAYER_CASES",
    "EPLayerCase",
    "available_exchanges",
    "bench_exchange",
    "bench_layer",
    "benchmark_header",
    "check_correctness",
    "main",
    "markdown",
    "run_ep_benchmark",
    "write_results",
]

if __name__ == "__main__":  # pragma: no cover
    main()
