"""The FP8 Mosaic GPU kernels as one backend: :class:`PallasMosaicScaledGroupedMatmul`."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from jaxmoe.ops.fp8.base import ScaledGroupedMatmulBackend
from jaxmoe.ops.fp8.pallas_mosaic import default_fp8_tiles, scaled_gmm_kn, unsupported_reason
from jaxmoe.ops.fp8.pallas_mosaic_wgrad import default_fp8_tgmm_tiles, scaled_tgmm
from jaxmoe.ops.fp8.pallas_mosaic_wgrad import unsupported_reason as unsupported_tgmm_reason
from jaxmoe.ops.grouped_matmul import pallas_triton
from jaxmoe.ops.grouped_matmul.pallas_mosaic_backend import PallasMosaicGroupedMatmul
from jaxmoe.ops.grouped_matmul.pallas_mosaic_tiles import MosaicTileConfig, check_tiles


@dataclasses.dataclass(frozen=True)
class PallasMosaicScaledGroupedMatmul(ScaledGroupedMatmulBackend):
    """``scaled_gmm`` (forward and dgrad) by the FP8 Mosaic kernel, ``scaled_tgmm`` (the FP8
    wgrad) by :mod:`.pallas_mosaic_wgrad`, ``tgmm`` (the high-precision wgrad) by the bf16 one.

    Operands the kernel cannot take (blockwise with a ``block_size`` other than 128 or
    ``block_n`` other than 256, e5m2, unaligned shapes, a GPU other than a Hopper): with
    ``fallback=None`` (``backend="pallas"``) ``NotImplementedError`` saying why, never a silent
    switch; ``"auto"`` builds it with the XLA backend as ``fallback``.

    Attributes:
      tiles: block sizes; ``None``: :func:`default_fp8_tiles`.
      fallback: the backend that takes what the kernel refuses, or ``None`` to refuse.
      interpret: ``None`` runs the interpreters when JAX's default backend is not a GPU.
    """

    supports_check_vma: ClassVar[bool] = False  # Pallas outputs carry no vma types
    name: str = dataclasses.field(default="pallas", init=False)
    tiles: MosaicTileConfig | None = None
    fallback: ScaledGroupedMatmulBackend | None = None
    interpret: bool | None = None

    def __post_init__(self):
        if self.tiles is not None:
            check_tiles(self.tiles, operand_bytes=1)

    @property
    def k_major_weights(self) -> bool:
        # On a GPU the kernel swaps the weights to K-major; the interpreter reads [G, K, N].
        return not pallas_triton._use_interpret(self.interpret)

    def unsupported_reason(self, lhs_q, rhs_q, recipe, out_dtype) -> str | None:
        m, k = lhs_q.shape
        cfg = self.tiles or default_fp8_tiles(m, k, rhs_q.shape[2], recipe)
        interpreted = pallas_triton._use_interpret(self.interpret)
        return unsupported_reason(
            lhs_q.shape, rhs_q.shape, lhs_q.dtype, rhs_q.dtype, out_dtype, recipe, cfg, interpreted
        )

    def scaled_gmm(self, lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, *, recipe, out_dtype):
        reason = self.unsupported_reason(lhs_q, rhs_q, recipe, out_dtype)
        if reason is None:
            return scaled_gmm_kn(
                lhs_q,
                lhs_scale,
                rhs_q,
                rhs_scale,
                group_sizes,
                out_dtype=out_dtype,
                tiles=self.tiles,
                interpret=self.interpret,
                recipe=recipe,
            )
        if self.fallback is None:
            raise NotImplementedError(
                f"fp8 backend 'pallas' (Mosaic GPU): lhs_q {lhs_q.shape} {lhs_q.dtype}, rhs_q "
                f"{rhs_q.shape} {rhs_q.dtype}, recipe {recipe.name!r}, out "
                f"{jnp.dtype(out_dtype)}: {reason}. Use backend='xla', or 'auto', which takes "
                "the XLA backend wherever the kernel does not apply."
            )
        return self.fallback.scaled_gmm(
            lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, recipe=recipe, out_dtype=out_dtype
        )

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        # The high-precision wgrad (the gradient's dtype, float32 accumulation): the bf16
        # layer's own, the Mosaic wgrad on the ring (1.00-1.13x torch's wgrad on an H100, where
        # the Triton one was 0.89-1.0x), Triton taking what it refuses.
        bf16 = PallasMosaicGroupedMatmul(triton_fallback=True, interpret=self.interpret)
        return bf16.tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype)

    def scaled_tgmm(
        self, lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, group_starts, group_sizes, *, out_dtype
    ):
        args = (lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, group_starts, group_sizes)
        cfg = default_fp8_tgmm_tiles(lhs_t_q.shape[0], rhs_t_q.shape[0])
        interpreted = pallas_triton._use_interpret(self.interpret)
        reason = unsupported_tgmm_reason(
            lhs_t_q.shape, rhs_t_q.shape, lhs_t_q.dtype, rhs_t_q.dtype, out_dtype, cfg, interpreted
        )
        if reason is None:
            return scaled_tgmm(*args, out_dtype=out_dtype, interpret=self.interpret)
        if self.fallback is None:
            raise NotImplementedError(
                f"fp8 backend 'pallas' (Mosaic GPU), FP8 wgrad: lhs_t_q {lhs_t_q.shape} "
                f"{lhs_t_q.dtype}, rhs_t_q {rhs_t_q.shape} {rhs_t_q.dtype}, out "
                f"{jnp.dtype(out_dtype)}: {reason}. Use backend='xla', or 'auto', which takes "
                "the XLA backend wherever the kernel does not apply, or Fp8Recipe(wgrad='high')."
            )
        return self.fallback.scaled_tgmm(*args, out_dtype=out_dtype)
