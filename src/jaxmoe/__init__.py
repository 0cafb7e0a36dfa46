"""jaxmoe: Mixture-of-Experts layers for JAX.

The public API: configuration, parameters, routing, the layer, the grouped matmul op (and its
FP8 form; quantization and recipes in :mod:`jaxmoe.ops.fp8`).
Flax modules live in :mod:`jaxmoe.nn`, expert parallelism in :mod:`jaxmoe.parallel`.
"""

from jaxmoe.config import MoEConfig
from jaxmoe.fp8_experts import quantize_expert_weights
from jaxmoe.layer import MoEStats, moe
from jaxmoe.ops.fp8 import fp8_grouped_matmul
from jaxmoe.ops.grouped_matmul import grouped_matmul
from jaxmoe.params import init_params, param_logical_axes
from jaxmoe.permutation import DispatchPlan, combine, dispatch, plan_dispatch
from jaxmoe.router import Routing, route, update_expert_bias

__version__ = "0.1.0"

__all__ = [
    "DispatchPlan",
    "MoEConfig",
    "MoEStats",
    "Routing",
    "combine",
    "dispatch",
    "fp8_grouped_matmul",
    "grouped_matmul",
    "init_params",
    "moe",
    "param_logical_axes",
    "plan_dispatch",
    "quantize_expert_weights",
    "route",
    "update_expert_bias",
]
