"""``jaxmoe.nn.MoELinen``: the layer as a ``flax.linen.Module`` for Linen codebases."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxmoe.argument_checks import check_mesh_type
from jaxmoe.config import MoEConfig
from jaxmoe.layer import MoEStats, moe
from jaxmoe.parallel import check_mesh
from jaxmoe.params import check_config, check_params, init_params, param_logical_axes


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

    def __post_init__(self):
        # Refuse a wrong cfg or mesh where the module is built, not inside init or apply.
        check_config(self.cfg, "MoELinen")
        check_mesh_type(self.mesh, "MoELinen")
        if self.mesh is not None:
            check_mesh(self.cfg, self.mesh)
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jax.Array, fp8_weights=None) -> tuple[jax.Array, MoEStats]:
        cfg = self.cfg
        axes = param_logical_axes(cfg)
        if not self.is_initializing():
            # The given variables against this config, before flax compares them with the
            # initializers' shapes (its error names neither the leaf nor the config field).
            check_params(self._given_params(), cfg, where="MoELinen.apply")

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

    def _given_params(self) -> dict:
        # The ``init_params`` tree of the variables passed to ``apply`` (unboxed), as far as
        # they exist; ``expert_bias`` comes from the ``"moe_state"`` collection.
        given = {
            name: nn.unbox(self.get_variable("params", name))
            for name in ("router", "experts", "shared")
            if self.has_variable("params", name)
        }
        if self.has_variable("moe_state", "expert_bias"):
            given["expert_bias"] = self.get_variable("moe_state", "expert_bias")
        return given
