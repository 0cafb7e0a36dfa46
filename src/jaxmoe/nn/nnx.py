"""``jaxmoe.nn.MoE``: the layer as a ``flax.nnx.Module`` holding the ``init_params`` tree."""

from __future__ import annotations

import jax
from flax import nnx

from jaxmoe.argument_checks import check_mesh_type, describe
from jaxmoe.config import MoEConfig
from jaxmoe.layer import MoEStats, moe
from jaxmoe.parallel import check_mesh
from jaxmoe.params import check_config, init_params, param_logical_axes


class ExpertBias(nnx.Variable):
    """The aux-loss-free selection bias: state, not a trained parameter (gets no gradient).

    Optimizers built on ``nnx.Param`` skip it; update it with ``jaxmoe.update_expert_bias``.
    """


def _param(value, axes, variable_type):
    # Logical names as metadata only (no mesh needed at creation); map them to mesh axes with
    # jaxmoe.parallel.logical_axis_rules and nnx.get_partition_spec.
    try:
        return variable_type(value, out_sharding=axes, eager_sharding=False)
    except TypeError:  # older flax: no eager_sharding / out_sharding keywords
        return variable_type(value, sharding_names=axes)


class MoE(nnx.Module):
    """Mixture-of-Experts FFN layer (see :func:`jaxmoe.moe` for the math).

    Attributes mirror ``init_params``: ``router`` (``{"kernel"}``, ``"bias"`` with
    ``router_bias``), ``experts`` (``w_gate``/``w_up``/``w_down``, ``b_gate``/``b_up``/``b_down``
    with ``expert_ffn_bias``), ``expert_bias`` (an :class:`ExpertBias`, with
    ``use_expert_bias``) and ``shared`` (with shared experts; ``output_gate`` with
    ``shared_expert_gate``): every one but ``expert_bias`` an ``nnx.Param``. Parameters carry
    logical axis names (``embed``, ``mlp``, ``expert``, ``router``) as sharding metadata.

    Example::

      layer = jaxmoe.nn.MoE(cfg, rngs=nnx.Rngs(0))
      y, stats = layer(x)                    # x: [B, S, H]
      layer.update_expert_bias(stats.tokens_per_expert, rate=1e-3)  # with use_expert_bias
    """

    def __init__(self, cfg: MoEConfig, *, rngs: nnx.Rngs, mesh: jax.sharding.Mesh | None = None):
        """Checks the arguments, then draws the parameters from ``rngs.params()``.

        Raises:
          TypeError: ``cfg`` is not a ``MoEConfig``, ``rngs`` not an ``nnx.Rngs`` (e.g. an int
            seed: pass ``nnx.Rngs(0)``) or ``mesh`` not a ``jax.sharding.Mesh``.
          ValueError: ``cfg`` cannot be laid out on ``mesh`` (``check_mesh``).
        """
        check_config(cfg, "jaxmoe.nn.MoE")
        check_mesh_type(mesh, "jaxmoe.nn.MoE")
        if mesh is not None:
            check_mesh(cfg, mesh)
        if not isinstance(rngs, nnx.Rngs):
            raise TypeError(
                f"jaxmoe.nn.MoE: `rngs` must be a flax.nnx.Rngs; got {describe(rngs)}. Pass "
                "rngs=nnx.Rngs(0) (a seed or a key goes inside: nnx.Rngs(key))."
            )
        self.cfg = cfg
        self.mesh = mesh
        values = init_params(rngs.params(), cfg)
        axes = param_logical_axes(cfg)
        self.experts = _container(values["experts"], axes["experts"])
        self.router = _container(values["router"], axes["router"])
        if cfg.use_expert_bias:
            self.expert_bias = _param(values["expert_bias"], axes["expert_bias"], ExpertBias)
        if cfg.num_shared_experts:
            self.shared = _container(values["shared"], axes["shared"])

    def params_tree(self) -> dict:
        """The current values as the plain ``init_params`` tree."""
        tree = {
            "router": {k: v[...] for k, v in self.router.items()},
            "experts": {k: v[...] for k, v in self.experts.items()},
        }
        if self.cfg.use_expert_bias:
            tree["expert_bias"] = self.expert_bias[...]
        if self.cfg.num_shared_experts:
            tree["shared"] = {k: v[...] for k, v in self.shared.items()}
        return tree

    def __call__(self, x: jax.Array, fp8_weights=None) -> tuple[jax.Array, MoEStats]:
        """``moe(params, x, cfg, mesh=mesh, fp8_weights=fp8_weights)`` on the current values;
        ``fp8_weights``: ``jaxmoe.quantize_expert_weights(layer.params_tree(), cfg)``, made once
        per optimizer step (see :func:`jaxmoe.moe`)."""
        return moe(self.params_tree(), x, self.cfg, mesh=self.mesh, fp8_weights=fp8_weights)

    def update_expert_bias(self, tokens_per_expert: jax.Array, rate: float) -> None:
        """Applies ``jaxmoe.update_expert_bias`` in place (call after an optimizer step)."""
        from jaxmoe.router import update_expert_bias

        if not self.cfg.use_expert_bias:
            raise ValueError(
                "MoE.update_expert_bias: the layer has no bias; build it with "
                "MoEConfig(use_expert_bias=True, score='sigmoid')."
            )
        self.expert_bias[...] = update_expert_bias(self.expert_bias[...], tokens_per_expert, rate)


def _container(values: dict, axes: dict):
    # nnx.Dict makes a dict of Variables a pytree node of the module graph.
    return nnx.Dict({k: _param(v, axes[k], nnx.Param) for k, v in values.items()})
