"""torchtitan's MoE module as a layer-bench peer (imported only when ``torchtitan`` is benchmarked).

``torchtitan.models.common.moe.MoE`` is the layer a PyTorch user would pick: this module builds it
for one GPU (no expert parallelism) with jaxmoe's parameters, so that its output is checked
against the same float32 reference and timed beside :class:`jaxmoe.bench.torch_layer.TorchMoELayer`.

Configuration, and where its math differs from ``jaxmoe.moe`` (softmax top-k, SwiGLU, dropless):

- Router ``TokenChoiceTopKRouter``: ``score_func="softmax"``, ``route_norm=True``,
  ``route_scale=1``, no expert groups. It takes a softmax over all E logits (float32, under
  float32 autocast), picks the top K and divides by their sum (``+ 1e-20``): the same weights as
  jaxmoe's softmax over the top-K logits, up to rounding.
- ``load_balance_coeff=None``: no ``expert_bias_E`` buffer, so routing is by the scores alone
  (jaxmoe's bench layer has no bias either); no auxiliary loss (torchtitan computes none here).
- No shared experts.
- Dispatch ``LocalTokenDispatcher``: a stable argsort by expert, like the plain torch peer.
- Experts ``GroupedExperts``: three ``torch._grouped_mm`` calls (gate, up, down; the plain peer
  fuses gate and up), always in bf16 whatever the weights' dtype (so there is no fp32 peer).
- Combine: each routed row times its weight in float32, rounded to bf16, then a deterministic
  ``scatter_add`` into a bf16 output (the K contributions add in bf16; jaxmoe adds in float32).

The wheels it needs besides torch (all pure Python): ``torchtitan``, ``spmd_types`` (the version
torchtitan pins), ``tyro``, ``docstring_parser``, ``typeguard`` (docs/kernels.md,
'Benchmark harness').
"""

from __future__ import annotations

import importlib

import numpy as np
import torch

from jaxmoe.bench.harness import package_version
from jaxmoe.bench.torch_layer import grouped_mm_available, to_torch

MOE_MODULE = "torchtitan.models.common.moe"


def import_moe_module():
    """``torchtitan.models.common.moe`` (raises whatever its import chain raises)."""
    return importlib.import_module(MOE_MODULE)


def unavailable_reason(device) -> str | None:
    """Why torchtitan's MoE cannot run on ``device`` (None when it can).

    It needs CUDA (its router autocasts to float32, which CPU autocast refuses), an importable
    ``torchtitan.models.common.moe`` (the exact import error is returned otherwise) and a working
    ``torch._grouped_mm``.
    """
    if torch.device(device).type != "cuda":
        return f"torchtitan's MoE is benchmarked on CUDA only; torch {torch.__version__} sees none"
    try:
        import_moe_module()
    except Exception as error:  # noqa: BLE001 - any failure means "cannot benchmark here"
        return (
            f"import {MOE_MODULE} (torchtitan {package_version('torchtitan')}) failed: "
            f"{type(error).__name__}: {str(error)[:300]}"
        )
    ok, why = grouped_mm_available(device)
    return None if ok else why


def build_moe(num_experts: int, top_k: int, hidden_size: int, ffn_size: int):
    """torchtitan's ``MoE`` on the meta device, configured as in the module docstring."""
    moe = import_moe_module()
    config = moe.MoE.Config(
        num_experts=num_experts,
        routed_experts=moe.RoutedExperts.Config(
            inner_experts=moe.GroupedExperts.Config(
                dim=hidden_size, hidden_dim=ffn_size, num_experts=num_experts
            ),
            token_dispatcher=moe.LocalTokenDispatcher.Config(num_experts=num_experts, top_k=top_k),
        ),
        router=moe.TokenChoiceTopKRouter.Config(
            num_experts=num_experts,
            gate=moe.Linear.Config(in_features=hidden_size, out_features=num_experts, bias=False),
            top_k=top_k,
            score_func="softmax",
            route_norm=True,
            route_scale=1.0,
        ),
        load_balance_coeff=None,
        shared_experts=None,
    )
    with torch.device("meta"):  # no memory until jaxmoe's weights are assigned
        return config.build()


class TorchTitanMoELayer(torch.nn.Module):
    """torchtitan's ``MoE`` holding jaxmoe's parameters, called on ``[T, H]`` like the others.

    Args:
      params: jaxmoe's tree, ``{"router": {"kernel": [H, E]}, "experts": {"w_gate": [E, H, F],
        "w_up": [E, H, F], "w_down": [E, F, H]}}`` (NumPy or JAX arrays).
      top_k: K.
      device: a CUDA device.

    Weights map as ``gate.weight = kernel.T`` (float32, as the router computes),
    ``w1_EFD = w_gate^T``, ``w3_EFD = w_up^T``, ``w2_EDF = w_down^T`` (bf16, each stored
    contiguous so that torchtitan's ``w.transpose(-2, -1)`` is ``_grouped_mm``'s fast layout).
    """

    def __init__(self, params: dict, top_k: int, device):
        super().__init__()
        experts = params["experts"]
        num_experts, hidden_size, ffn_size = np.shape(experts["w_gate"])
        self.moe = build_moe(num_experts, top_k, hidden_size, ffn_size)

        def transposed(array):
            return to_torch(array, torch.bfloat16, device).transpose(-2, -1).contiguous()

        state = {
            "router.gate.weight": to_torch(params["router"]["kernel"], torch.float32, device)
            .transpose(0, 1)
            .contiguous(),
            "routed_experts.inner_experts.w1_EFD": transposed(experts["w_gate"]),
            "routed_experts.inner_experts.w3_EFD": transposed(experts["w_up"]),
            "routed_experts.inner_experts.w2_EDF": transposed(experts["w_down"]),
        }
        self.moe.load_state_dict(state, strict=True, assign=True)
        # The usage counter (not in the state dict) is still on the meta device.
        self.moe.tokens_per_expert_E = torch.zeros(num_experts, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, H] -> [T, H]
        return self.moe(x.unsqueeze(0)).squeeze(0)


__all__ = ["TorchTitanMoELayer", "build_moe", "unavailable_reason"]
