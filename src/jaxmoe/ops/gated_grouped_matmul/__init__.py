"""The gated grouped matmul op (``act(x Wg) * (x Wu)`` per group) and the gated FFN (then the
down projection, fused into its backward): one API, a backend per file."""

from jaxmoe.ops.gated_grouped_matmul.api import gated_ffn, gated_grouped_matmul
from jaxmoe.ops.gated_grouped_matmul.base import GATE_ACTIVATIONS, GatedGroupedMatmulBackend
from jaxmoe.ops.gated_grouped_matmul.reference import ReferenceGatedGroupedMatmul

__all__ = [
    "GATE_ACTIVATIONS",
    "GatedGroupedMatmulBackend",
    "ReferenceGatedGroupedMatmul",
    "gated_ffn",
    "gated_grouped_matmul",
]
