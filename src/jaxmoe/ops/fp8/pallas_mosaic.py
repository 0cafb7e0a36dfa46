"""The FP8 grouped matmul on Hopper (``backend="pallas"``): the Mosaic GPU ``gmm`` on e4m3, the
scales in its epilogue (rowwise) or per K step (blockwise), and the backend class
:class:`PallasMosaicScaledGroupedMatmul` that decides once per call (:func:`plan_scaled_gmm`)
whether it runs.

Rowwise: ``out[m, n] = (sum_k lhs_q[m, k] rhs_q[g, k, n]) lhs_scale[m] rhs_scale[g, n]``, the
scales constant along K, applied once per output. Blockwise (DeepSeek-V3: ``lhs_scale [M, K /
128]``, ``rhs_scale [G, K / 128, N / 128]``): one K step (``block_k`` 128) is one scale block,
each step's product scaled and added to the main float32 accumulator. FP8 ``wgmma`` reads both
operands K-major, so on a GPU the weights go in ``[G, N, K]`` (``scaled_gmm_kn`` swaps the FP8
API's ``[G, K, N]``, or takes ``rhs_layout="gnk"`` as they are); the interpreter, which has no
transposed operand, reads ``[G, K, N]``. How it is built and measured: docs/kernels.md, 'The
FP8 kernels' and 'FP8 grouped matmul (Mosaic)'.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxmoe.ops.fp8.base import ScaledGroupedMatmulBackend
from jaxmoe.ops.fp8.pallas_mosaic_wgrad import launch_scaled_tgmm, plan_scaled_tgmm
from jaxmoe.ops.fp8.quantize import E4M3
from jaxmoe.ops.fp8.recipe import Fp8Recipe
from jaxmoe.ops.grouped_matmul.pallas_mosaic import PallasMosaicGroupedMatmul
from jaxmoe.ops.mosaic import persistent_loop
from jaxmoe.ops.mosaic import tiles as mosaic_tiles
from jaxmoe.ops.mosaic.launch import GmmPlan, launch_gmm
from jaxmoe.ops.mosaic.scale_epilogues import blockwise_k_step_scale, rowwise_scale_epilogue
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, check_tiles
from jaxmoe.ops.mosaic.variant import GmmVariant
from jaxmoe.ops.pallas_common import use_interpret

Array = jax.Array

# One 128-byte swizzled row of FP8; everything else as the bf16 kernel's measured default.
FP8_BLOCK_K = 128


def default_fp8_tiles(m: int, k: int, n: int, recipe: Fp8Recipe | None = None) -> MosaicTileConfig:
    """Rowwise: the bf16 kernel's default schedule (the hand-written ring across a CTA's tiles,
    a 4-deep ring, the swizzled 64-row epilogue slab) with ``block_k`` widened to 128 FP8
    elements, the same bytes per ring stage. The compute warpgroups split the columns and the
    tiles stay on the global ``block_m`` grid: the bf16 kernel's split rows, tiles from each
    group's first row and weight multicast are not measured with FP8 yet (the FP8 layer pads
    its groups to 128 rows, where the two work lists are the same).

    Blockwise (``recipe``): DeepGEMM's ``128 x 128`` tile on the ring, the compute warpgroups
    splitting its rows (each a ``64 x 128`` product: one scale block of columns) and a 6-deep
    ring: 1.03-1.14x the jax-pipeline tiles (:func:`pipeline_fp8_tiles`, ``block_m`` 64) on the
    six benchmark shapes. Measured: docs/kernels.md, 'FP8 grouped matmul (Mosaic)'."""
    if recipe is not None and recipe.name == "blockwise":
        return MosaicTileConfig(
            block_m=128,
            block_n=128,
            block_k=FP8_BLOCK_K,
            stages=6,
            epilogue_rows=64,
            swizzled_epilogue=True,
            ring=True,
            split_rows=True,
        )
    del m, k, n
    return MosaicTileConfig(
        block_k=FP8_BLOCK_K, stages=4, epilogue_rows=64, swizzled_epilogue=True, ring=True
    )


def pipeline_fp8_tiles(m: int, k: int, n: int, recipe: Fp8Recipe | None = None) -> MosaicTileConfig:
    """Tiles on jax's warp-specialized pipeline (the bf16 kernel's default before the ring)
    with ``block_k`` 128: a 4-deep ring and a 64-row epilogue slab; a 3-deep ring
    where only that lets tiles chain (``K / 128`` a multiple of 3, not of 4).

    Blockwise (``recipe``): ``block_m`` 64. Each compute warpgroup holds two float32
    ``[block_m, 128]`` accumulators (the running sum and the step's product): 128 registers per
    thread at ``block_m`` 64, 256 (more than a thread has: spills) at 128 (measured:
    docs/kernels.md, 'FP8 grouped matmul (Mosaic)')."""
    cfg = MosaicTileConfig(
        block_k=FP8_BLOCK_K, stages=4, epilogue_rows=64, pipelined_tiles=min(k, n) <= 1024
    )
    steps = k // FP8_BLOCK_K
    if cfg.pipelined_tiles and steps % cfg.stages and steps % 3 == 0:
        # Chaining tiles needs whole ring turns: K = 768 is 6 steps of 128, so a 3-deep ring
        # chains where the 4-deep one cannot (docs/kernels.md, 'FP8 grouped matmul (Mosaic)').
        cfg = dataclasses.replace(cfg, stages=3)
    if recipe is not None and recipe.name == "blockwise":
        cfg = dataclasses.replace(cfg, block_m=64)
    return cfg


def unsupported_reason(
    lhs_shape,
    rhs_shape,
    lhs_dtype,
    rhs_dtype,
    out_dtype,
    recipe: Fp8Recipe,
    cfg: MosaicTileConfig,
    interpret: bool = False,
) -> str | None:
    """Why the FP8 Mosaic kernel cannot take these operands (``rhs_shape`` ``[G, K, N]``), or
    ``None`` if it can."""
    (m, k), n = lhs_shape, rhs_shape[2]
    reasons = []
    if recipe.name == "blockwise":
        if recipe.block_size != FP8_BLOCK_K:
            reasons.append(
                f"the blockwise recipe's block_size={recipe.block_size} is not {FP8_BLOCK_K} "
                f"(one K step of the kernel is one scale block: block_size {FP8_BLOCK_K} only)"
            )
        _, wg_n = mosaic_tiles.warpgroup_tile(cfg)
        if wg_n != recipe.block_size:
            reasons.append(
                f"the blockwise recipe needs block_n={2 * recipe.block_size} and split_rows="
                f"False (each compute warpgroup's columns one {recipe.block_size}-wide scale "
                f"block); got block_n={cfg.block_n}, split_rows={cfg.split_rows}"
            )
    elif recipe.name != "rowwise":
        reasons.append(f"the {recipe.name!r} recipe has no kernel (rowwise and blockwise only)")
    for name, dtype in (("lhs_q", lhs_dtype), ("rhs_q", rhs_dtype)):
        if jnp.dtype(dtype) != E4M3:
            reasons.append(f"{name} is {jnp.dtype(dtype)}, not float8_e4m3fn")
    reasons += mosaic_tiles.tile_shape_reasons(m, k, n, cfg, out_dtype, interpret)
    return "; ".join(reasons) or None


def scaled_gmm_kn(
    lhs_q: Array,
    lhs_scale: Array,
    rhs_q: Array,
    rhs_scale: Array,
    group_sizes: Array,
    *,
    rhs_layout: str = "gkn",
    out_dtype=jnp.bfloat16,
    tiles: MosaicTileConfig | None = None,
    interpret: bool | None = None,
    recipe: Fp8Recipe | str = "rowwise",
) -> Array:
    """The FP8 grouped matmul by the Mosaic kernel (no checks of the FP8 API's own).

    Args:
      lhs_q: ``[M, K]`` e4m3, rows sorted by group.
      lhs_scale: float32; rowwise ``[M, 1]`` or ``[M]``; blockwise ``[M, K / 128]``.
      rhs_q: e4m3 ``[G, K, N]`` (``rhs_layout="gkn"``, the FP8 API's) or ``[G, N, K]``
        (``"gnk"``: K-major, what FP8 ``wgmma`` reads; no transpose is made).
      rhs_scale: float32; rowwise ``[G, 1, N]`` or ``[G, N]``; blockwise
        ``[G, K / 128, N / 128]`` (in either ``rhs_layout``).
      group_sizes: ``[G]`` int32, clipped to ``M``.
      out_dtype: a 2-byte float (default bfloat16).
      tiles: block sizes (``block_k`` must be 128); ``None``: :func:`default_fp8_tiles`.
      interpret: ``None`` runs Mosaic GPU's interpreter when JAX's default backend is not a GPU.
      recipe: ``"rowwise"`` (scales in the epilogue) or ``"blockwise"`` (block_size 128, scales
        per K step; ``block_n`` must be 256), or an :class:`Fp8Recipe`.

    Raises:
      NotImplementedError: operands the kernel cannot take (see :func:`unsupported_reason`).
    """
    if rhs_layout not in ("gkn", "gnk"):
        raise ValueError(f"scaled_gmm_kn: `rhs_layout` must be 'gkn' or 'gnk'; got {rhs_layout!r}")
    rhs_shape = _gkn_shape(rhs_q.shape, rhs_layout)
    recipe = recipe if isinstance(recipe, Fp8Recipe) else Fp8Recipe(recipe)
    plan = plan_scaled_gmm(
        lhs_q.shape,
        rhs_shape,
        lhs_q.dtype,
        rhs_q.dtype,
        out_dtype=out_dtype,
        recipe=recipe,
        tiles=tiles,
        interpret=interpret,
    )
    if plan.unsupported is not None:
        raise NotImplementedError(
            f"FP8 mosaic gmm: lhs_q {lhs_q.shape} {lhs_q.dtype}, rhs_q {rhs_q.shape} "
            f"{rhs_q.dtype}, out {plan.out_dtype}: {plan.unsupported}."
        )
    return launch_scaled_gmm(
        lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, plan, recipe=recipe, rhs_layout=rhs_layout
    )


def _gkn_shape(rhs_shape, rhs_layout: str) -> tuple[int, int, int]:
    """``[G, K, N]`` of weights stored ``rhs_layout``."""
    if rhs_layout == "gnk":
        num_groups, n, k = rhs_shape
    else:
        num_groups, k, n = rhs_shape
    return num_groups, k, n


def plan_scaled_gmm(
    lhs_shape, rhs_shape, lhs_dtype, rhs_dtype, *, out_dtype, recipe: Fp8Recipe, tiles, interpret
) -> GmmPlan:
    """The plan of the FP8 ``gmm`` of ``lhs_q [M, K]`` by weights ``[G, K, N]`` (``rhs_shape``,
    whatever their layout): ``tiles`` or :func:`default_fp8_tiles`, checked; the interpreter or
    not (the GPU reads the weights K-major, i.e. transposed; the interpreter cannot); and
    :func:`unsupported_reason`."""
    (m, k), n = lhs_shape, rhs_shape[2]
    out_dtype = jnp.dtype(out_dtype)
    cfg = tiles or default_fp8_tiles(m, k, n, recipe)
    check_tiles(cfg, operand_bytes=1)
    interpret_params = persistent_loop.interpret_params(interpret)
    interpreted = interpret_params is not None
    reason = unsupported_reason(
        lhs_shape, rhs_shape, lhs_dtype, rhs_dtype, out_dtype, recipe, cfg, interpreted
    )
    return GmmPlan(cfg, not interpreted, out_dtype, interpret_params, reason)


def launch_scaled_gmm(
    lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, plan: GmmPlan, *, recipe, rhs_layout="gkn"
) -> Array:
    """The FP8 kernel on checked operands, as ``plan`` says: the weights laid out as the plan
    reads them, the recipe's scales in the epilogue (rowwise) or per K step (blockwise)."""
    num_groups, k, n = _gkn_shape(rhs_q.shape, rhs_layout)
    m = lhs_q.shape[0]
    transpose_rhs, interpreted = plan.transpose_rhs, plan.interpreted
    if transpose_rhs and rhs_layout == "gkn":
        rhs_q = jnp.swapaxes(rhs_q, 1, 2)
    elif not transpose_rhs and rhs_layout == "gnk":
        rhs_q = jnp.swapaxes(rhs_q, 1, 2)
    launch = functools.partial(launch_gmm, lhs_q, rhs_q, group_sizes.astype(jnp.int32), plan)
    if recipe.name == "blockwise":
        return launch(
            GmmVariant(
                k_step_scale=functools.partial(blockwise_k_step_scale, interpreted=interpreted)
            ),
            epilogue_operands=(
                jnp.swapaxes(lhs_scale.reshape(m, k // FP8_BLOCK_K), 0, 1).astype(jnp.float32),
                rhs_scale.reshape(num_groups, k // FP8_BLOCK_K, n // FP8_BLOCK_K).astype(
                    jnp.float32
                ),
            ),
        )
    return launch(
        GmmVariant(epilogue=functools.partial(rowwise_scale_epilogue, interpreted=interpreted)),
        epilogue_operands=(
            lhs_scale.reshape(m).astype(jnp.float32),
            rhs_scale.reshape(num_groups, n).astype(jnp.float32),
        ),
    )


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
        return not use_interpret(self.interpret)

    def _plan(self, lhs_q, rhs_q, recipe, out_dtype) -> GmmPlan:
        return plan_scaled_gmm(
            lhs_q.shape,
            rhs_q.shape,
            lhs_q.dtype,
            rhs_q.dtype,
            out_dtype=out_dtype,
            recipe=recipe,
            tiles=self.tiles,
            interpret=self.interpret,
        )

    def unsupported_reason(self, lhs_q, rhs_q, recipe, out_dtype) -> str | None:
        return self._plan(lhs_q, rhs_q, recipe, out_dtype).unsupported

    def scaled_gmm(self, lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, *, recipe, out_dtype):
        plan = self._plan(lhs_q, rhs_q, recipe, out_dtype)
        if plan.unsupported is None:
            return launch_scaled_gmm(
                lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, plan, recipe=recipe
            )
        reason = plan.unsupported
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
        plan = plan_scaled_tgmm(
            lhs_t_q.shape,
            rhs_t_q.shape,
            lhs_t_q.dtype,
            rhs_t_q.dtype,
            out_dtype=out_dtype,
            tiles=None,
            interpret=self.interpret,
        )
        if plan.unsupported is None:
            return launch_scaled_tgmm(*args, plan)
        reason = plan.unsupported
        if self.fallback is None:
            raise NotImplementedError(
                f"fp8 backend 'pallas' (Mosaic GPU), FP8 wgrad: lhs_t_q {lhs_t_q.shape} "
                f"{lhs_t_q.dtype}, rhs_t_q {rhs_t_q.shape} {rhs_t_q.dtype}, out "
                f"{jnp.dtype(out_dtype)}: {reason}. Use backend='xla', or 'auto', which takes "
                "the XLA backend wherever the kernel does not apply, or Fp8Recipe(wgrad='high')."
            )
        return self.fallback.scaled_tgmm(*args, out_dtype=out_dtype)
