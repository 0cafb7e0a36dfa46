"""Mesh checks, partition specs and Flax-style logical axis rules for expert parallelism.

Layout of the expert-parallel layer on a mesh with ``cfg.ep_axis`` and ``cfg.data_axes``:

* batch (leading dim of ``x``): sharded over ``(*data_axes, ep_axis)`` (ep minor, so one data
  shard's tokens are its ep ranks' tokens in rank order);
* expert weights ``[E, ...]`` (their biases ``b_gate``/``b_up``/``b_down`` too): ``E`` over
  ``ep_axis``; with ``fsdp_expert_weights`` also ``H`` over ``data_axes`` (gathered just in time
  inside the layer);
* router kernel and bias, expert bias, shared expert (its ``output_gate`` too): replicated.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import PartitionSpec

from jaxmoe.config import MoEConfig
from jaxmoe.params import BATCH, EMBED, EXPERT, MLP, ROUTER, SEQUENCE, param_logical_axes


def _mesh_axis_sizes(mesh) -> dict:
    return dict(zip(mesh.axis_names, np.shape(mesh.devices), strict=True))


def batch_axes(cfg: MoEConfig) -> tuple[str, ...]:
    """The mesh axes of the batch dim: ``(*cfg.data_axes, cfg.ep_axis)``."""
    return (*cfg.data_axes, cfg.ep_axis)


def check_mesh(cfg: MoEConfig, mesh, x_shape: tuple[int, ...] | None = None) -> None:
    """Raises ValueError, naming the field, when ``cfg`` cannot be laid out on ``mesh``."""
    sizes = _mesh_axis_sizes(mesh)
    if cfg.ep_axis is None:
        raise ValueError(
            "MoEConfig.ep_axis: must name a mesh axis to shard experts over when a `mesh` is "
            f"given; got None. Set ep_axis to one of {tuple(sizes)}."
        )
    if cfg.ep_axis not in sizes:
        raise ValueError(
            f"MoEConfig.ep_axis: {cfg.ep_axis!r} is not an axis of the mesh (axes "
            f"{tuple(sizes)}). Name an existing axis or build the mesh with it."
        )
    for axis in cfg.data_axes:
        if axis not in sizes:
            raise ValueError(
                f"MoEConfig.data_axes: {axis!r} is not an axis of the mesh (axes "
                f"{tuple(sizes)}); got data_axes={cfg.data_axes!r}. Drop it or add it to the mesh."
            )
    ep = sizes[cfg.ep_axis]
    if cfg.num_experts % ep:
        raise ValueError(
            f"MoEConfig.num_experts: must be divisible by the size of ep_axis "
            f"{cfg.ep_axis!r} ({ep}); got {cfg.num_experts}. Change num_experts or the mesh."
        )
    data = math.prod(sizes[a] for a in cfg.data_axes)
    if cfg.fsdp_expert_weights and cfg.hidden_size % data:
        raise ValueError(
            f"MoEConfig.hidden_size: fsdp_expert_weights shards H over data_axes "
            f"{cfg.data_axes!r} (size {data}); got hidden_size={cfg.hidden_size}, not divisible. "
            "Change the mesh or set fsdp_expert_weights=False."
        )
    if x_shape is not None:
        shards = data * ep
        if len(x_shape) < 2 or x_shape[0] % shards:
            raise ValueError(
                f"moe: the batch (leading dim of `x`, shape {tuple(x_shape)}) must be divisible "
                f"by the product of its sharding axes {batch_axes(cfg)!r} ({shards}). Pad the "
                "batch or change the mesh."
            )


def mesh_axis_size(mesh, axes) -> int:
    """Product of the sizes of ``axes`` (a name or a tuple of names) in ``mesh``."""
    sizes = _mesh_axis_sizes(mesh)
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(sizes[a] for a in axes)


def logical_axis_rules(cfg: MoEConfig) -> tuple[tuple[str, object], ...]:
    """Flax-style ``(logical name, mesh axes)`` rules for the layer's params and activations.

    Use with ``flax.linen.logical_to_mesh_sharding`` / ``nnx.get_partition_spec`` +
    ``nn.logical_axis_rules``. ``embed`` maps to ``data_axes`` only with ``fsdp_expert_weights``
    (then the router and shared weights are FSDP-sharded too, and gathered before the layer).
    """
    data = tuple(cfg.data_axes) or None
    return (
        (BATCH, batch_axes(cfg)),
        (SEQUENCE, None),
        (EXPERT, cfg.ep_axis),
        (EMBED, data if cfg.fsdp_expert_weights else None),
        (MLP, None),
        (ROUTER, None),
    )


def _expert_spec(cfg: MoEConfig, logical: tuple[str, ...]) -> PartitionSpec:
    fsdp = tuple(cfg.data_axes) if (cfg.fsdp_expert_weights and cfg.data_axes) else None
    dims = []
    for name in logical:
        if name == EXPERT:
            dims.append(cfg.ep_axis)
        elif name == EMBED and fsdp:
            dims.append(fsdp)
        else:
            dims.append(None)
    return PartitionSpec(*dims)


def param_partition_specs(cfg: MoEConfig) -> dict:
    """``PartitionSpec`` of every parameter, in the tree of ``jaxmoe.init_params``.

    Expert weights: ``E`` over ``ep_axis`` (and ``H`` over ``data_axes`` with
    ``fsdp_expert_weights``); everything else replicated.
    """
    axes = param_logical_axes(cfg)
    specs = {}
    for key, value in axes.items():
        if key == "experts":
            specs[key] = {name: _expert_spec(cfg, logical) for name, logical in value.items()}
        elif isinstance(value, dict):
            specs[key] = {name: PartitionSpec() for name in value}
        else:
            specs[key] = PartitionSpec()
    return specs


def fp8_weights_partition_specs(cfg: MoEConfig, fp8_weights) -> dict:
    """``PartitionSpec`` of every array of ``fp8_weights`` (:func:`jaxmoe.quantize_expert_weights`):
    the leading ``E`` over ``ep_axis``, the rest replicated. Not FSDP-sharded even with
    ``fsdp_expert_weights``: a rowwise scale spans the whole ``H`` of its expert."""
    return jax.tree.map(lambda _: PartitionSpec(cfg.ep_axis), fp8_weights)


def batch_partition_spec(cfg: MoEConfig, ndim: int) -> PartitionSpec:
    """``PartitionSpec`` of ``x`` (``ndim`` dims): the leading dim over the batch axes."""
    return PartitionSpec(batch_axes(cfg), *([None] * (ndim - 1)))


__all__ = [
    "batch_axes",
    "batch_partition_spec",
    "check_mesh",
    "fp8_weights_partition_specs",
    "logical_axis_rules",
    "mesh_axis_size",
    "param_partition_specs",
]
