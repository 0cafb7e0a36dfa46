"""FP8 recipes: how each operand of an expert matmul is scaled, forward and backward.

Two recipes, both e4m3 (``jnp.float8_e4m3fn``) with float32 scales, for
``out[M, N] = lhs[M, K] @ rhs[g][K, N]``:

============  ==================================  ======================================
recipe        ``lhs`` (activations, ``[M, K]``)     ``rhs`` (weights, ``[G, K, N]``)
============  ==================================  ======================================
rowwise       one scale per row (per token):      one scale per output channel:
              blocks ``(1, K)``, scale ``[M, 1]``   blocks ``(1, K, 1)``, scale ``[G, 1, N]``
blockwise     1 x ``block_size`` tiles along K:     ``block_size`` x ``block_size`` blocks:
              scale ``[M, ceil(K/b)]``              scale ``[G, ceil(K/b), ceil(N/b)]``
============  ==================================  ======================================

Rowwise is what ``torch._scaled_grouped_mm`` takes (the FP8 peer benchmarked): both scales
are constant along the contraction, so they apply once, in the epilogue:
``out = (lhs_q @ rhs_q[g]) * lhs_scale[m] * rhs_scale[g, n]``. Blockwise is DeepSeek-V3's
recipe: the scales change every ``block_size`` along K, so each K block's partial product is
scaled as it is accumulated (in float32): ``out = sum_kb (lhs_q[:, kb] @ rhs_q[g, kb, :]) *
lhs_scale[m, kb] * rhs_scale[g, kb, n // b]``. Finer blocks bound the damage an outlier does to
its neighbours' precision.

References: DeepSeek-AI 2024, DeepSeek-V3 technical report, section 3.3; PyTorch
``torch._scaled_grouped_mm`` (row-wise scales); NVIDIA TransformerEngine ``Float8BlockScaling``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxmoe.ops.fp8.quantize import E4M3, FP8_DTYPES
from jaxmoe.option_names import FP8_RECIPES, FP8_WGRAD_PRECISIONS, check_registry

RECIPE_NAMES = ("rowwise", "blockwise")
WGRAD_PRECISIONS = ("auto", "high", "fp8")
# wgrad="auto": FP8 where the harmonic mean of the product's K and N, 2KN / (K + N), is at least
# this. The FP8 wgrad re-quantizes both operands, 5 bytes moved per element of ``[M, K]`` and
# ``[M, N]`` for 2MKN flops, so it saves time only where 2KN / (K + N) is large: on one H200 it
# won on Mixtral (6371) and DeepSeek-V3 (3186) and lost on Qwen3 (1117) (docs/performance.md,
# 'The layer, FP8').
AUTO_FP8_WGRAD_MIN_WIDTH = 2048
check_registry("FP8_RECIPES", FP8_RECIPES, RECIPE_NAMES)
check_registry("FP8_WGRAD_PRECISIONS", FP8_WGRAD_PRECISIONS, WGRAD_PRECISIONS)


@dataclasses.dataclass(frozen=True)
class Fp8Recipe:
    """An FP8 scaling recipe (hashable: a static argument under ``jit``).

    Attributes:
      name: ``"rowwise"`` or ``"blockwise"`` (see the module docstring).
      block_size: the tile extent of ``"blockwise"`` (DeepSeek-V3: 128); unused by rowwise.
      dtype: the FP8 format of the forward operands (and of the weights in dgrad).
      grad_dtype: the FP8 format of the output gradient in dgrad. e4m3 by default, as in
        DeepSeek-V3: with per-row or per-tile scales the gradient's range inside one scale
        group is narrow, so e4m3's extra mantissa bit beats e5m2's range. TransformerEngine's
        HYBRID format (e5m2 gradients) answers per-tensor scaling, which these recipes avoid;
        pass ``grad_dtype=jnp.float8_e5m2`` to follow it.
      wgrad: the weight gradient's precision. ``"high"``: the gradient's dtype with float32
        accumulation, on the FP8 activations dequantized (torchao's ``ROWWISE_WITH_GW_HP``).
        ``"fp8"`` (rowwise only): both operands re-quantized with one scale per (group,
        column), constant along the wgrad's contraction over tokens, so the product runs on
        FP8 tensor cores with the scales in its epilogue (:mod:`jaxmoe.ops.fp8.columnwise`;
        torchao's ``ROWWISE`` scales per column over all tokens). ``"auto"`` (default): per
        product, ``"fp8"`` where it is faster (:meth:`fp8_wgrad`), else ``"high"``; always
        ``"high"`` for blockwise, whose FP8 wgrad (DeepSeek-V3's 128 x 1 token tiles) is not
        built.
    """

    name: str = "rowwise"
    block_size: int = 128
    dtype: jnp.dtype = E4M3
    grad_dtype: jnp.dtype = E4M3
    wgrad: str = "auto"

    def __post_init__(self):
        if self.name not in RECIPE_NAMES:
            raise ValueError(
                f"Fp8Recipe.name must be one of {RECIPE_NAMES}; got {self.name!r}. "
                "Use 'rowwise' (per token / per output channel) or 'blockwise' (DeepSeek-V3)."
            )
        size = self.block_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                f"Fp8Recipe.block_size must be an int >= 1; got {size!r}. DeepSeek-V3 uses 128."
            )
        for field in ("dtype", "grad_dtype"):
            value = jnp.dtype(getattr(self, field))
            if value not in FP8_DTYPES:
                raise ValueError(
                    f"Fp8Recipe.{field} must be jnp.float8_e4m3fn or jnp.float8_e5m2; got {value}."
                )
            object.__setattr__(self, field, value)
        if self.wgrad not in WGRAD_PRECISIONS:
            raise ValueError(
                f"Fp8Recipe.wgrad must be one of {WGRAD_PRECISIONS}; got {self.wgrad!r}. 'high' "
                "keeps the weight gradient in the gradient's dtype, 'fp8' runs it in FP8, "
                "'auto' picks per product."
            )
        if self.wgrad == "fp8" and self.name != "rowwise":
            raise ValueError(
                f"Fp8Recipe: wgrad='fp8' needs name='rowwise'; got name={self.name!r}. The "
                "blockwise recipe's FP8 wgrad (128 x 1 token tiles) is not built: use "
                "wgrad='high' with it."
            )

    def quantizes_like(self, other: Fp8Recipe) -> bool:
        """Whether ``other`` quantizes every operand as this recipe does (the weight gradient's
        precision aside: it does not change the weights' FP8 operands)."""
        fields = ("name", "block_size", "dtype", "grad_dtype")
        return all(getattr(self, field) == getattr(other, field) for field in fields)

    def fp8_wgrad(self, k: int, n: int) -> bool:
        """Whether the weight gradient of ``[M, K] @ [G, K, N]`` runs in FP8: ``wgrad="fp8"``,
        or ``"auto"`` with the rowwise recipe where ``2KN / (K + N) >=``
        ``AUTO_FP8_WGRAD_MIN_WIDTH``."""
        if self.wgrad == "auto":
            return self.name == "rowwise" and 2 * k * n >= AUTO_FP8_WGRAD_MIN_WIDTH * (k + n)
        return self.wgrad == "fp8"

    @property
    def lhs_blocks(self) -> tuple[int | None, int | None]:
        """Quantization blocks of an ``[M, K]`` operand contracted over its last dim."""
        return (1, None) if self.name == "rowwise" else (1, self.block_size)

    @property
    def rhs_blocks(self) -> tuple[int, int | None, int | None]:
        """Quantization blocks of a ``[G, K, N]`` operand contracted over its middle dim."""
        return (1, None, 1) if self.name == "rowwise" else (1, self.block_size, self.block_size)


def resolve_recipe(recipe: str | Fp8Recipe, caller: str = "fp8_grouped_matmul") -> Fp8Recipe:
    """A recipe name (``"rowwise"``, ``"blockwise"``) or an :class:`Fp8Recipe` -> the recipe."""
    if isinstance(recipe, Fp8Recipe):
        return recipe
    if isinstance(recipe, str) and recipe in RECIPE_NAMES:
        return Fp8Recipe(recipe)
    raise ValueError(
        f"{caller}: `recipe` must be one of {RECIPE_NAMES} or a jaxmoe.ops.fp8.Fp8Recipe; got "
        f"{recipe!r}. Use recipe='rowwise' or recipe='blockwise'."
    )
