"""The sharded layer: :func:`jaxmoe.moe` with a mesh, as :func:`jaxmoe.layer_body.moe_body` per
shard inside ``jax.shard_map``, its experts step being :func:`~jaxmoe.parallel.ep_apply_experts`.

Experts are split over ``cfg.ep_axis`` and the batch over ``(*cfg.data_axes, cfg.ep_axis)``;
expert weights may also be FSDP-sharded over the data axes (all-gathered here, their gradient
reduce-scattered by the transpose).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jaxmoe import compat
from jaxmoe.config import MoEConfig
from jaxmoe.experts import routed_experts
from jaxmoe.layer_body import (
    ExpertsResult,
    MoEStats,
    moe_body,
    resolve_alignment,
    sequence_length,
)
from jaxmoe.ops.fp8 import resolve_recipe
from jaxmoe.ops.grouped_matmul import resolve_backend
from jaxmoe.parallel import sharding
from jaxmoe.parallel.apply_experts import ep_apply_experts
from jaxmoe.parallel.exchange import resolve_exchange
from jaxmoe.router import Routing


def gather_fsdp(expert_params: dict, specs: dict, axes) -> dict:
    """All-gathers FSDP-sharded expert weights over their data axes (transpose: reduce-scatter)."""
    out = {}
    for name, value in expert_params.items():
        for dim, dim_axes in enumerate(specs[name]):
            if dim > 0 and dim_axes is not None:
                value = jax.lax.all_gather(value, dim_axes, axis=dim, tiled=True)
        out[name] = compat.vary(value, axes)
    return out


def sharded_experts_step(
    params,
    cfg: MoEConfig,
    expert_specs: dict,
    group_tokens: int,
    fp8_weights=None,
    sequence_length=None,
):
    """The experts step of one shard: dispatch -> exchange -> experts -> exchange -> combine.

    ``group_tokens``: the tokens of the ep group (what the capacity counts); ``sequence_length``:
    S of their ``[B, S]`` order, for the capacity's drop policy (``None``: one sequence).

    ``fp8_weights``: this rank's experts' FP8 weights (whole experts, never FSDP-sharded), or
    None. They travel beside the weights as ``expert_fn``'s parameters (a closure would hide
    them from the overflow loop's transpose)."""
    axes = sharding.batch_axes(cfg)
    experts_recipe = cfg.fp8_recipe
    if cfg.ep_fp8_dispatch:  # only the rows' FP8 copies cross the wire: no FP8 wgrad from them
        experts_recipe = dataclasses.replace(resolve_recipe(cfg.fp8_recipe, "moe"), wgrad="high")

    def experts_fn(buffer, group_sizes, weights_and_fp8, buffer_fp8=None):
        # buffer_fp8: the received rows' FP8 operand, with cfg.ep_fp8_dispatch (fp8_wire).
        weights, fp8 = weights_and_fp8
        return routed_experts(
            buffer,
            group_sizes,
            weights,
            cfg.activation,
            cfg.grouped_matmul_backend,
            fp8_recipe=experts_recipe,
            fp8_weights=fp8,
            buffer_fp8=buffer_fp8,
            swiglu_alpha=cfg.swiglu_alpha,
            swiglu_limit=cfg.swiglu_limit,
        )

    def step(tokens: jax.Array, routing: Routing) -> ExpertsResult:
        with jax.named_scope("experts"):
            weights = gather_fsdp(params["experts"], expert_specs, axes)
            fp8 = jax.tree.map(lambda value: compat.vary(value, axes), fp8_weights)
        return ExpertsResult(
            *ep_apply_experts(
                tokens,
                routing.experts,
                routing.weights,
                experts_fn,
                (weights, fp8),
                num_experts=cfg.num_experts,
                axis_name=cfg.ep_axis,
                exchange=cfg.ep_exchange,
                capacity=cfg.capacity(group_tokens),
                receive_factor=cfg.ep_receive_factor,
                fast_slot_factor=cfg.ep_fast_slot_factor,
                alignment=resolve_alignment(cfg),
                num_chunks=cfg.ep_chunks,
                dispatch=cfg.ep_dispatch,
                drop_policy=cfg.capacity_drop_policy,
                sequence_length=sequence_length,
                fp8_dispatch=cfg.fp8_recipe if cfg.ep_fp8_dispatch else None,
            )
        )

    return step


def _has_context_mesh() -> bool:
    return not jax.sharding.get_abstract_mesh().empty


def _auto_axes(mesh):
    auto = (jax.sharding.AxisType.Auto,) * len(mesh.axis_names)
    return jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=auto)


def _no_tokens_step(tokens: jax.Array, routing: Routing) -> ExpertsResult:
    """The experts step of an empty batch: nothing to send, nothing routed (zero counts)."""
    num_experts = routing.scores.shape[-1]
    return ExpertsResult(
        jnp.zeros(tokens.shape, jnp.float32),
        jnp.zeros((num_experts,), jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.zeros(tokens.shape[:1], jnp.int32),
    )


def _moe_shard(
    params, x, fp8_weights=None, *, cfg: MoEConfig, expert_specs: dict, group_tokens: int
):
    axes = sharding.batch_axes(cfg)

    def psum_stats(tree):
        return jax.tree.map(lambda value: jax.lax.psum(value, axes), tree)

    length = sequence_length(x.shape, group_tokens)
    step = sharded_experts_step(params, cfg, expert_specs, group_tokens, fp8_weights, length)
    return moe_body(params, x, cfg, step, psum_stats)


def moe_sharded(
    params, x: jax.Array, cfg: MoEConfig, mesh, fp8_weights=None
) -> tuple[jax.Array, MoEStats]:
    """:func:`jaxmoe.moe` with experts over ``cfg.ep_axis`` and the batch over
    ``(*cfg.data_axes, cfg.ep_axis)`` of ``mesh``: the single-device result, sharded.

    Capacity (``cfg.capacity_factor``) counts the tokens of one data shard (the ep group):
    with ``data_axes`` the result equals :func:`jaxmoe.moe` run on each data shard separately.
    Losses and ``tokens_per_expert`` are over the global batch; ``dropped_tokens`` sums the
    capacity and receive-bound drops of every rank (``dropped_tokens_per_sequence``: of each
    sequence; the capacity's drop policy orders the ep group's tokens as one device would). A
    batch of zero tokens gives ``y`` of ``x``'s shape and zero losses and counts, as on one
    device. ``fp8_weights`` (:func:`jaxmoe.quantize_expert_weights`, checked by the caller)
    enters with ``E`` over
    ``cfg.ep_axis``: each rank gets its experts' FP8 weights, the same values it would quantize
    from its own weights (every quantization block lies inside one expert).
    Memory: :mod:`jaxmoe.parallel.dispatch`.

    Raises:
      ValueError: the mesh lacks ``cfg.ep_axis`` or a data axis, ``num_experts`` is not
        divisible by the ep size, or the batch not by the product of the sharding axes.
      NotImplementedError: ``cfg.ep_exchange`` cannot run on this platform.
    """
    sharding.check_mesh(cfg, mesh, tuple(x.shape))
    platform = mesh.devices.flat[0].platform
    resolve_exchange(cfg.ep_exchange, platform)  # raise before tracing
    if math.prod(x.shape[:-1]) == 0:
        # Zero tokens (a valid batch, divisible by any shard count): no shard has work and the
        # exchange has nothing to move, so skip shard_map; y is [0, ..., H], losses and counts 0.
        return moe_body(params, x, cfg, _no_tokens_step)
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
    operands, in_specs = (params, x), (param_specs, x_spec)
    if fp8_weights is not None:  # a third operand only when given (shard_map has no None spec)
        operands += (fp8_weights,)
        in_specs += (sharding.fp8_weights_partition_specs(cfg, fp8_weights),)
    stats_specs = MoEStats(*([jax.sharding.PartitionSpec()] * len(MoEStats._fields)))
    # Each shard holds whole sequences of a [..., S, H] x: their drop counts stay sharded.
    stats_specs = stats_specs._replace(
        dropped_tokens_per_sequence=jax.sharding.PartitionSpec(
            sharding.batch_axes(cfg) if x.ndim >= 3 else None
        )
    )
    body = functools.partial(
        _moe_shard,
        cfg=cfg,
        expert_specs=param_specs["experts"],
        group_tokens=local_tokens * ep,
    )
    # Pallas kernels cannot declare how their outputs vary over the mesh, so a layer using one
    # runs with shard_map's check off.
    backend = resolve_backend(cfg.grouped_matmul_backend, platform)
    if compat.has_explicit_axes(mesh):
        # An Explicit-axes mesh (jax.make_mesh's default on recent jax) makes shard_map demand
        # inputs already laid out as in_specs: lay them out (a no-op when they already are).
        # Outside a jax.set_mesh context, lay them out on the same devices with Auto axes: the
        # outputs then carry no Explicit mesh type, which eager ops after the layer (the seed
        # of an eager jax.grad) could not place without that context.
        mesh = mesh if _has_context_mesh() else _auto_axes(mesh)
        operands = jax.tree.map(
            lambda value, spec: jax.device_put(value, jax.sharding.NamedSharding(mesh, spec)),
            operands,
            in_specs,
            is_leaf=lambda node: isinstance(node, jax.sharding.PartitionSpec),
        )
    sharded = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=(x_spec, stats_specs),
        check_vma=backend.supports_check_vma,
    )
    # Under an outer jit this jit is inlined. Outside one it makes eager use work: an eager
    # jax.grad evaluates shard_map's transpose op by op, and those ops, put on one device, fail
    # with "Length of device assignment 1 is not equal to the size of the mesh".
    return jax.jit(sharded)(*operands)
