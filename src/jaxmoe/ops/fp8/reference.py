"""The plain FP8 grouped matmul: dequantize both operands to float32, then the exact grouped matmul.

Equal to the scaled FP8 product up to float32 rounding (each dequantized element is one float32
multiply), so it is the yardstick for the other backends.
"""

from __future__ import annotations

import dataclasses

from jaxmoe.ops.fp8.base import ScaledGroupedMatmulBackend
from jaxmoe.ops.fp8.quantize import dequantize
from jaxmoe.ops.grouped_matmul.reference import ReferenceGroupedMatmul


@dataclasses.dataclass(frozen=True)
class ReferenceScaledGroupedMatmul(ScaledGroupedMatmulBackend):
    """Dequantize-then-matmul in float32 at HIGHEST precision. For tests."""

    name: str = dataclasses.field(default="reference", init=False)

    def scaled_gmm(self, lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, *, recipe, out_dtype):
        lhs = dequantize(lhs_q, lhs_scale, recipe.lhs_blocks)
        rhs = dequantize(rhs_q, rhs_scale, recipe.rhs_blocks)
        return ReferenceGroupedMatmul().gmm(
            lhs, rhs, group_sizes, transpose_rhs=False, out_dtype=out_dtype
        )

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        return ReferenceGroupedMatmul().tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype)
