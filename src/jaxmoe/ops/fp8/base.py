"""The FP8 grouped matmul's backend interface and argument checks.

A backend implements, on validated arguments (group sizes clipped to ``M``, int32):

* ``scaled_gmm(lhs_q[M, K], lhs_scale, rhs_q[G, K, N], rhs_scale, group_sizes[G], recipe)
  -> [M, N]``: the grouped matmul of FP8 operands with the recipe's scales applied (see
  :mod:`jaxmoe.ops.fp8.recipe`): ``out[m] = dequant(lhs)[m] @ dequant(rhs)[g(m)]``, computed
  as FP8 products accumulated in float32 and scaled per K block (blockwise) or in the epilogue
  (rowwise). Rows at or past ``sum(group_sizes)`` are zeros.
* ``tgmm(lhs[M, K], rhs[M, N], group_sizes[G]) -> [G, K, N]``: the high-precision weight
  gradient (the recipe's ``wgrad="high"``).
* ``scaled_tgmm(lhs_t_q[K, Mp], lhs_scale[G, K], rhs_t_q[N, Mp], rhs_scale[G, N],
  group_starts[G], group_sizes[G]) -> [G, K, N]``: the FP8 weight gradient (``wgrad="fp8"``) on
  operands in :mod:`jaxmoe.ops.fp8.columnwise`'s padded layout (group ``g`` is columns
  ``[starts[g], starts[g] + n_g)``, zeros up to the next multiple of 128)::

      out[g] = (lhs_t_q[:, cols_g] @ rhs_t_q[:, cols_g]^T) * lhs_scale[g, :, None]
               * rhs_scale[g, None, :]
"""

from __future__ import annotations

import abc
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.ops.fp8.quantize import FP8_DTYPES, scale_shape
from jaxmoe.ops.fp8.recipe import Fp8Recipe
from jaxmoe.ops.grouped_matmul.base import check_grouped_matmul_args

Array = jax.Array


def check_scaled_args(lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, recipe: Fp8Recipe):
    """Raises ValueError, naming the argument, for what ``scaled_grouped_matmul`` cannot take."""
    for name, value in (("lhs_q", lhs_q), ("rhs_q", rhs_q)):
        dtype = jnp.result_type(value)
        if dtype not in FP8_DTYPES:
            raise ValueError(
                f"scaled_grouped_matmul: `{name}` must be FP8 (float8_e4m3fn or float8_e5m2); "
                f"got dtype {dtype}. Quantize it first: jaxmoe.ops.fp8.quantize(x, blocks)."
            )
    # The shape rules of grouped_matmul; the two FP8 formats may differ (e5m2 x e4m3 is fine).
    check_grouped_matmul_args(
        jax.ShapeDtypeStruct(np.shape(lhs_q), jnp.float32),
        jax.ShapeDtypeStruct(np.shape(rhs_q), jnp.float32),
        group_sizes,
    )
    blocks = (("lhs_scale", lhs_scale, lhs_q, recipe.lhs_blocks),) + (
        ("rhs_scale", rhs_scale, rhs_q, recipe.rhs_blocks),
    )
    for name, scale, operand, block_shape in blocks:
        expected = scale_shape(np.shape(operand), block_shape)
        if np.shape(scale) != expected or jnp.result_type(scale) != jnp.float32:
            raise ValueError(
                f"scaled_grouped_matmul: `{name}` must be float32 of shape {expected} for the "
                f"{recipe.name!r} recipe (blocks {block_shape}); got {jnp.result_type(scale)} "
                f"{np.shape(scale)}. Pass the scale quantize() returned with recipe."
                f"{'lhs' if name == 'lhs_scale' else 'rhs'}_blocks."
            )


@dataclasses.dataclass(frozen=True)
class ScaledGroupedMatmulBackend(abc.ABC):
    """One implementation of the FP8 grouped matmul primitives (see the module docstring)."""

    name: str = dataclasses.field(default="", init=False)

    @property
    def k_major_weights(self) -> bool:
        """Whether ``scaled_gmm`` reads the weights K-major (``[G, N, K]`` in memory): then
        :func:`jaxmoe.ops.fp8.weights.make_fp8_weights` writes them so."""
        return False

    @abc.abstractmethod
    def scaled_gmm(
        self, lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, *, recipe: Fp8Recipe, out_dtype
    ) -> Array: ...

    @abc.abstractmethod
    def tgmm(self, lhs: Array, rhs: Array, group_sizes: Array, *, out_dtype) -> Array: ...

    @abc.abstractmethod
    def scaled_tgmm(
        self, lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, group_starts, group_sizes, *, out_dtype
    ) -> Array: ...
