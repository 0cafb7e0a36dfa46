"""The plain gated grouped matmul: two grouped matmuls, then ``act(gate) * up`` in ``jnp``."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxmoe.ops.gated_grouped_matmul.base import GATE_ACTIVATIONS, GatedGroupedMatmulBackend


def unfused(gate, up, activation: str):
    """``act(gate) * up`` in the operands' dtype: what the layer computed before fusion."""
    return GATE_ACTIVATIONS[activation](gate) * up


@dataclasses.dataclass(frozen=True)
class ReferenceGatedGroupedMatmul(GatedGroupedMatmulBackend):
    """``fused`` as the unfused composition on ``grouped``'s kernels (any dtype, any shape).

    Behind the op's primitive it proves the derivative rule on float32 (the Mosaic kernel takes
    bf16/fp16 only): the result must equal differentiating the composition itself.
    """

    name: str = dataclasses.field(default="reference", init=False)

    def unsupported_reason(self, lhs, rhs_gate, group_sizes):
        return None

    def fused(self, lhs, rhs_gate, rhs_up, group_sizes, *, activation, residuals):
        gate, up = (
            self.grouped.gmm(lhs, rhs, group_sizes, transpose_rhs=False, out_dtype=lhs.dtype)
            for rhs in (rhs_gate, rhs_up)
        )
        hidden = unfused(gate, up, activation).astype(jnp.dtype(lhs.dtype))
        return (hidden, gate, up) if residuals else (hidden,)

    def input_dgrad_unsupported_reason(self, gate_bar, rhs_gate, group_sizes):
        return None

    def input_dgrad(self, gate_bar, up_bar, rhs_gate, rhs_up, group_sizes):
        gate_part, up_part = (
            self.grouped.gmm(bar, rhs, group_sizes, transpose_rhs=True, out_dtype=rhs.dtype)
            for bar, rhs in ((gate_bar, rhs_gate), (up_bar, rhs_up))
        )
        return gate_part + up_part
