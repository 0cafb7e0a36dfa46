"""``jaxmoe.nn.MoELinen``: the layer as a ``flax.linen.Module`` for Linen codebases."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxmoe.config import MoEConfig
from jaxmoe.layer import MoEStats, moe
from jaxmoe.params import init_params, param_logical_axes


class MoELinen(nn.Module):
    """Mixture-of-Experts FFN layer (see :func:`jaxmoe.moe`).

    The ``params`` collection holds the ``init_params`` tree minus ``expert_bias``, each leaf
    boxed with its logical axis names (``nn.LogicallyPartitioned``), so
    ``nn.get_partition_spec`` and ``nn.logical_to_mesh_sharding`` work on it. ``expert_bias``
    (with ``use_expert_bias``) lives in the non-trained ``"moe_state"`` collection.

    Example::

      layer = MoELinen(cfg)
      variables = layer.init(jax.random.key(0), x)
      (y, stats) = layer.apply(variables, x)

    FP8 weights quantized once per step (``cfg.fp8_recipe`` set; see :func:`jaxmoe.moe`), reused
    by every micro-batch: a call argument, made from the unboxed parameters::

      fp8 = jaxmoe.quantize_expert_weights(nn.unbox(variables["params"]), cfg)
      (y, stats) = layer.apply(variables, x, fp8)

    Scanning layers with ``nn.scan``: the boxed parameters gain a leading layer axis, and
    ``nn.scan`` must be told its logical name through ``metadata_params`` (without it flax raises
    ``PartitioningUnspecifiedError``); map that name in your logical axis rules (e.g. to
    ``None``)::

      Stack = nn.scan(
          Block,  # a module whose __call__(h, _) -> (h + y, stats.aux_loss) uses MoELinen
          variable_axes={"params": 0},  # with use_expert_bias, also {"moe_state": 0}
          split_rngs={"params": True},
          length=num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"},
      )
    """

    cfg: MoEConfig
    mesh: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, fp8_weights=None) -> tuple[jax.Array, MoEStats]:
        cfg = self.cfg
        axes = param_logical_axes(cfg)

        def make(name):
            def init(key):
                values = init_params(key, cfg)[name]
                return jax.tree.map(
                    lambda v, a: nn.LogicallyPartitioned(v, a),
                    values,
                    axes[name],
                    is_leaf=lambda node: isinstance(node, tuple),
                )

            return init

        params = {
            "router": self.param("router", make("router")),
            "experts": self.param("experts", make("experts")),
        }
        if cfg.num_shared_experts:
            params["shared"] = self.param("shared", make("shared"))
        if cfg.use_expert_bias:
            bias = self.variable(
                "moe_state", "expert_bias", jnp.zeros, (cfg.num_experts,), cfg.param_dtype
            )
            params["expert_bias"] = bias.value
        return moe(params, x, cfg, mesh=self.mesh, fp8_weights=fp8_weights)
