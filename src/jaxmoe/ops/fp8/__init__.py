"""FP8 expert matmuls: quantization, recipes, and the FP8 grouped matmul (a backend per file).

``quantize.py`` (FP8 casts with block scales), ``recipe.py`` (rowwise and DeepSeek-V3 blockwise
scaling), ``base.py`` (the backend interface), ``reference.py`` and ``xla.py`` (backends),
``api.py`` (``fp8_grouped_matmul`` with its custom VJP, ``scaled_grouped_matmul``),
``weights.py`` (``Fp8Weights``: FP8 weights quantized once per step, reused by micro-batches).
"""

from jaxmoe.ops.fp8.api import (
    FP8_BACKEND_NAMES,
    fp8_grouped_matmul,
    quantize_fp8_weights,
    resolve_fp8_backend,
    scaled_grouped_matmul,
)
from jaxmoe.ops.fp8.base import ScaledGroupedMatmulBackend
from jaxmoe.ops.fp8.quantize import E4M3, E5M2, SCALE_EPS, dequantize, fp8_max, quantize
from jaxmoe.ops.fp8.recipe import RECIPE_NAMES, Fp8Recipe, resolve_recipe
from jaxmoe.ops.fp8.reference import ReferenceScaledGroupedMatmul
from jaxmoe.ops.fp8.weights import Fp8Weights
from jaxmoe.ops.fp8.xla import XlaScaledGroupedMatmul

__all__ = [
    "E4M3",
    "E5M2",
    "FP8_BACKEND_NAMES",
    "RECIPE_NAMES",
    "SCALE_EPS",
    "Fp8Recipe",
    "Fp8Weights",
    "ReferenceScaledGroupedMatmul",
    "ScaledGroupedMatmulBackend",
    "XlaScaledGroupedMatmul",
    "dequantize",
    "fp8_grouped_matmul",
    "fp8_max",
    "quantize",
    "quantize_fp8_weights",
    "resolve_fp8_backend",
    "resolve_recipe",
    "scaled_grouped_matmul",
]
