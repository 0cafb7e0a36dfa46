"""Layer weak scaling: ``jaxmoe.moe`` forward+backward on ``ep`` devices at fixed tokens per GPU,
tokens/s per GPU, on DeepSeek-V3-like and Mixtral-like layers (bf16), optionally with
forced-balanced routing (Megatron-Core's per-layer proxies)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmoe
from jaxmoe.bench.harness import first_devices_mesh
from jaxmoe.bench.timing import time_jax
from jaxmoe.layer_body import route_tokens
from jaxmoe.parallel import (
    all_expert_counts,
    batch_partition_spec,
    fullest_slot,
    param_partition_specs,
)


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
    # The layer's MoEConfig.ep_dispatch ("tokens": one row per token and destination rank).
    ep_dispatch: str = "copies"

    def experts(self, ep: int) -> int:
        return self.num_experts if self.num_experts is not None else self.experts_per_gpu * ep

    def config(self, ep: int, **overrides):
        """The case's ``MoEConfig`` at expert-parallel size ``ep`` (``overrides`` on top)."""

        return jaxmoe.MoEConfig(
            num_experts=self.experts(ep),
            top_k=self.top_k,
            hidden_size=self.hidden_size,
            ffn_size=self.ffn_size,
            score=self.score,
            num_groups=self.num_groups,
            group_top_k=self.group_top_k,
            use_expert_bias=self.use_expert_bias,
            ep_dispatch=self.ep_dispatch,
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


def _with_variants(cases: dict) -> dict:
    """``cases`` plus, for dsv3 and mixtral, ``<name>-balanced`` (forced-balanced routing; the
    plain ones keep the router's own routing) and ``<name>-tokens`` (token dispatch)."""
    variants = {
        f"{name}-{suffix}": dataclasses.replace(
            cases[name], name=f"{cases[name].name}-{suffix}", **change
        )
        for name in ("dsv3", "mixtral")
        for suffix, change in (
            ("balanced", {"balanced": True}),
            ("tokens", {"ep_dispatch": "tokens"}),
        )
    }
    return {**cases, **variants}


LAYER_CASES = _with_variants(LAYER_CASES)
TINY_LAYER_CASES = _with_variants(TINY_LAYER_CASES)


def balanced_inputs(x, router_kernel, num_experts: int, top_k: int, scale: float = 30.0):
    """Makes the real router pick experts ``(t*K + j) mod E`` for token t: exact balance.

    The first E features of each token become a one-hot-like code of its K experts (larger for
    earlier choices) and the router kernel's first E rows an identity, so the logits rank those
    K experts first. With group-limited routing the K experts of a token must lie in at most
    ``group_top_k`` groups: consecutive experts do when ``K <= (E / G) * group_top_k``.
    """

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


def _fullest_slot(params, x, cfg, mesh) -> int:
    """The fullest (sender, receiver) slot of the layer's own routing, computed as the layer
    does (``route_tokens`` per shard, then ``all_expert_counts`` and ``fullest_slot``): at most
    ``ceil(fast_slot_factor * T*K / ep)`` means the dropless fast path ran."""

    ep = mesh.shape["ep"]

    def body(params, x):
        routing, _ = route_tokens(params, x.reshape(-1, cfg.hidden_size), cfg, 1)
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


def _device_peak_gb(mesh) -> float | None:
    stats = [device.memory_stats() for device in mesh.devices.flat]
    if any(stat is None or "peak_bytes_in_use" not in stat for stat in stats):
        return None
    return max(stat["peak_bytes_in_use"] for stat in stats) / 1e9


def layer_config(
    case: EPLayerCase,
    ep: int,
    *,
    exchange: str | None = None,
    receive_factor: float | None = 1.25,
    fast_slot_factor: float | None = 1.125,
    chunks: int = 1,
    backend: str | None = None,
) -> jaxmoe.MoEConfig:
    """The ``MoEConfig`` :func:`bench_layer` runs ``case`` with at ``ep`` (``ValueError`` from
    its rules before any work: the command line checks its flags with it)."""
    return case.config(
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

    cfg = layer_config(
        case,
        ep,
        exchange=exchange,
        receive_factor=receive_factor,
        fast_slot_factor=fast_slot_factor,
        chunks=chunks,
        backend=backend,
    )
    mesh = first_devices_mesh(ep)
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
        return loss, (stats.dropped_tokens, stats.overflow_tokens, stats.tokens_per_expert)

    step = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))
    memory = step.lower(params, x).compile().memory_analysis()
    _, (dropped, overflow, tokens_per_expert) = step(params, x)
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
        "overflow_tokens": int(overflow),
        # XLA's plan for one device's temporaries, and the allocator's peak so far in this
        # process (cumulative over the cases run before; None where the platform has none).
        "compiled_temp_gb": None if memory is None else memory.temp_size_in_bytes / 1e9,
        "device_peak_gb": _device_peak_gb(mesh),
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
