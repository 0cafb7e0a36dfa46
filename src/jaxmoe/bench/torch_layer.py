"""A plain PyTorch MoE layer, written only to benchmark jaxmoe against (imported only with torch).

Same math and dtypes as ``jaxmoe.moe`` with a softmax router and SwiGLU experts::

    logits  = x.float() @ router.float()                 # [T, E] float32 router
    w, e    = softmax(topk(logits, K).values), topk(...).indices
    order   = argsort(e.flatten(), stable)               # expert-major permutation
    h       = grouped_mm(x[order // K], w_gate_up)       # gate and up in one grouped matmul
    h       = silu(h[:, :F]) * h[:, F:]
    out     = grouped_mm(h, w_down) * w.flatten()[order] # weighted, in float32
    y       = zeros.index_add(0, order // K, out)        # combine, accumulated in float32

``torch._grouped_mm`` takes the expert weights laid out ``[E, K, N]`` as the transpose of a
contiguous ``[E, N, K]`` tensor (its fast layout); the weights are stored that way.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def to_torch(array, dtype: torch.dtype, device) -> torch.Tensor:
    # numpy has no bfloat16 that torch can read: go through float32 (exact for bf16 values).
    return torch.from_numpy(np.asarray(array, dtype=np.float32)).to(device=device, dtype=dtype)


def grouped_mm_available(device) -> tuple[bool, str]:
    """Whether ``torch._grouped_mm`` exists and runs on ``device`` (and why not)."""
    if not hasattr(torch, "_grouped_mm"):
        return False, f"torch {torch.__version__} has no torch._grouped_mm"
    try:
        x = torch.zeros(32, 32, device=device, dtype=torch.bfloat16)
        w = torch.zeros(2, 32, 32, device=device, dtype=torch.bfloat16)
        offs = torch.tensor([16, 32], device=device, dtype=torch.int32)
        torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    except Exception as error:  # noqa: BLE001 - any failure means "cannot benchmark here"
        return False, f"torch._grouped_mm does not run on {device}: {str(error)[:200]}"
    return True, ""


class TorchMoELayer(torch.nn.Module):
    """The layer above, built from jaxmoe's parameter tree (``init_params`` layout).

    Args:
      params: ``{"router": {"kernel": [H, E]}, "experts": {"w_gate": [E, H, F], "w_up": [E, H, F],
        "w_down": [E, F, H]}}`` (NumPy or JAX arrays).
      top_k: K.
      dtype: torch dtype of the expert weights and activations (the router stays float32).
      device: where the tensors live.
    """

    def __init__(self, params: dict, top_k: int, dtype: torch.dtype, device):
        super().__init__()
        experts = params["experts"]
        gate_up = np.concatenate(
            [np.asarray(experts["w_gate"], np.float32), np.asarray(experts["w_up"], np.float32)],
            axis=-1,
        )  # [E, H, 2F]
        self.top_k = top_k
        self.ffn_size = int(np.shape(experts["w_up"])[-1])
        self.router = torch.nn.Parameter(
            to_torch(params["router"]["kernel"], torch.float32, device)
        )
        # Stored [E, N, K] contiguous; used transposed as [E, K, N].
        self.w_gate_up_nk = torch.nn.Parameter(
            to_torch(gate_up, dtype, device).transpose(-2, -1).contiguous()
        )
        self.w_down_nk = torch.nn.Parameter(
            to_torch(experts["w_down"], dtype, device).transpose(-2, -1).contiguous()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, H]
        num_experts = self.router.shape[1]
        logits = x.float() @ self.router  # [T, E]
        top_logits, top_experts = torch.topk(logits, self.top_k, dim=-1)
        weights = torch.softmax(top_logits, dim=-1)  # [T, K] float32
        flat_experts = top_experts.flatten()
        order = torch.argsort(flat_experts, stable=True)
        token_ids = order // self.top_k
        counts = torch.bincount(flat_experts, minlength=num_experts)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        rows = x[token_ids]  # [T*K, H], expert-major
        gate_up = torch._grouped_mm(rows, self.w_gate_up_nk.transpose(-2, -1), offs=offs)
        hidden = F.silu(gate_up[:, : self.ffn_size]) * gate_up[:, self.ffn_size :]
        out = torch._grouped_mm(hidden, self.w_down_nk.transpose(-2, -1), offs=offs)
        out = out.float() * weights.flatten()[order, None]
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        return y.index_add_(0, token_ids, out).to(x.dtype)


def to_torch_input(x, dtype: torch.dtype, device) -> torch.Tensor:
    """A JAX/NumPy array as a torch tensor of ``dtype`` on ``device``."""
    return to_torch(x, dtype, device)
