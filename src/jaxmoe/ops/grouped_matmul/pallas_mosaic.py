"""The Mosaic GPU grouped-matmul backend (``backend="pallas"``, and ``"auto"`` on a Hopper): it
plans each call once (:func:`jaxmoe.ops.mosaic.launch.plan_gmm`,
:func:`jaxmoe.ops.mosaic.tgmm_launch.plan_tgmm`) and launches the Mosaic kernel, or, where that
refuses the operands, raises or falls back to the Triton kernels of :mod:`.pallas_triton`."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from jaxmoe.ops.grouped_matmul import pallas_triton
from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend
from jaxmoe.ops.grouped_matmul.xla import XlaGroupedMatmul
from jaxmoe.ops.mosaic import launch, tgmm_launch
from jaxmoe.ops.mosaic import tiles as mosaic_tiles
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, check_tiles


@dataclasses.dataclass(frozen=True)
class PallasMosaicGroupedMatmul(GroupedMatmulBackend):
    """``gmm`` (forward, dgrad) and ``tgmm`` (wgrad) by the Mosaic GPU kernels.

    On operands the Mosaic kernels cannot take (fp32, ``M``/``K``/``N`` not multiples of the
    blocks, a GPU other than a Hopper, a transposed ``wgmma`` operand (dgrad, wgrad) in the CPU
    interpreter):

    - ``triton_fallback=False`` (``backend="pallas"``, and this class built by hand): raise
      ``NotImplementedError`` saying why. A backend the user names never switches kernels
      silently; ``"pallas_triton"`` or ``"auto"`` are the ways to get the Triton kernel.
    - ``triton_fallback=True`` (what ``backend="auto"`` builds on a GPU): the Triton kernel takes
      them. This is the measured rule of ``auto``: the Mosaic ``gmm`` wherever it applies,
      Triton elsewhere (docs/kernels.md, 'Grouped matmul: the auto backend').
    - The wgrad (``tgmm``): the Mosaic kernel (:mod:`jaxmoe.ops.mosaic.tgmm_launch`) wherever it
      applies, for both; ``auto`` takes the Triton wgrad only where it does not. No shape rule:
      where it is slower (skewed Qwen3) the fwd+bwd loses less than it gains balanced
      (docs/kernels.md, 'Mosaic wgrad').

    Attributes:
      gmm_tiles: Mosaic block sizes; ``None``: :func:`default_mosaic_gmm_tiles`.
      tgmm_tiles: the Mosaic wgrad's block sizes; ``None``: ``default_mosaic_tgmm_tiles``.
      triton: the Triton backend that takes, with ``triton_fallback``, the operands the Mosaic
        kernels refuse; ``None``: default tiles and the same ``interpret``.
      triton_fallback: see above.
      interpret: ``None`` runs the interpreters when JAX's default backend is not a GPU.
    """

    supports_check_vma: ClassVar[bool] = False  # Pallas outputs carry no vma types
    name: str = dataclasses.field(default="pallas", init=False)
    gmm_tiles: MosaicTileConfig | None = None
    tgmm_tiles: tgmm_launch.MosaicTgmmTileConfig | None = None
    triton: pallas_triton.PallasTritonGroupedMatmul | None = None
    triton_fallback: bool = False
    interpret: bool | None = None

    def __post_init__(self):
        if self.gmm_tiles is not None:
            check_tiles(self.gmm_tiles)
        if self.tgmm_tiles is not None:
            tgmm_launch.check_tgmm_tiles(self.tgmm_tiles)
        if self.triton is None:  # frozen dataclass: fill the default in place
            triton = pallas_triton.PallasTritonGroupedMatmul(interpret=self.interpret)
            object.__setattr__(self, "triton", triton)

    def preferred_alignment(self, dtype) -> int:
        """``MOSAIC_ALIGNMENT`` (64) rows on a Hopper GPU, where these kernels run; 128 (the
        Triton and FP8 kernels' row tile) for FP8 operands or another GPU."""
        if jnp.dtype(dtype).itemsize == 1 or not mosaic_tiles.hopper_gpu():
            return super().preferred_alignment(dtype)
        return mosaic_tiles.MOSAIC_ALIGNMENT

    def _fallback(self, lhs) -> GroupedMatmulBackend:
        """What ``triton_fallback`` runs where the Mosaic kernel does not apply: the Triton
        kernels, or XLA for operands they do not take either (``auto`` never picks a kernel
        that cannot run)."""
        if pallas_triton.unsupported_reason(lhs.dtype) is None:
            return self.triton
        return XlaGroupedMatmul()

    def gmm(self, lhs, rhs, group_sizes, *, transpose_rhs, out_dtype):
        plan = launch.plan_gmm(
            lhs.shape,
            rhs.shape,
            lhs.dtype,
            transpose_rhs=transpose_rhs,
            out_dtype=out_dtype,
            tiles=self.gmm_tiles,
            interpret=self.interpret,
        )
        if plan.unsupported is None:
            return launch.launch_gmm(lhs, rhs, group_sizes, plan)
        reason = plan.unsupported
        if not self.triton_fallback:
            raise NotImplementedError(
                f"grouped_matmul backend 'pallas' (Mosaic GPU): lhs {lhs.shape} {lhs.dtype}, "
                f"rhs {rhs.shape}, out {jnp.dtype(out_dtype)}: {reason}. Use "
                "backend='pallas_triton' (Triton kernels), or 'auto', which takes the Triton "
                "kernel wherever the Mosaic one does not apply."
            )
        return self._fallback(lhs).gmm(
            lhs, rhs, group_sizes, transpose_rhs=transpose_rhs, out_dtype=out_dtype
        )

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        plan = tgmm_launch.plan_tgmm(
            lhs.shape,
            rhs.shape,
            lhs.dtype,
            out_dtype=out_dtype,
            tiles=self.tgmm_tiles,
            interpret=self.interpret,
        )
        if plan.unsupported is None:
            return tgmm_launch.launch_tgmm(lhs, rhs, group_sizes, plan)
        reason = plan.unsupported
        if self.triton_fallback:
            return self._fallback(lhs).tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype)
        raise NotImplementedError(
            f"grouped_matmul backend 'pallas' (Mosaic GPU) wgrad: lhs {lhs.shape} "
            f"{lhs.dtype}, rhs {rhs.shape}, out {jnp.dtype(out_dtype)}: {reason}. Use "
            "backend='pallas_triton' (Triton kernels), or 'auto', which takes the Triton "
            "kernel wherever the Mosaic one does not apply."
        )
