"""The FP8 grouped matmul on Hopper: the Mosaic GPU ``gmm`` on e4m3, scales in its epilogue.

The kernel is :mod:`jaxmoe.ops.grouped_matmul.pallas_mosaic`'s (the same on-device work list,
persistent warp-specialized schedule, TMA ring and group-boundary stores), run on float8 operands
with an epilogue hook that applies the rowwise recipe's scales to the float32 accumulator before
the cast::

    out[m, n] = (sum_k lhs_q[m, k] * rhs_q[g, k, n]) * lhs_scale[m] * rhs_scale[g, n]

Both scales are constant along K, so they are applied once per output, not per K step. Each
compute warpgroup reads its rows' ``lhs_scale`` and its columns' ``rhs_scale[g]`` from GPU memory
in the epilogue (``bm + bn / 2`` floats per tile, against ``bm * bn`` outputs).

The blockwise recipe (DeepSeek-V3: ``lhs_scale [M, K/128]``, ``rhs_scale [G, K/128, N/128]``)
scales vary along K, so they go in the kernel's per-K-step hook (``k_step_scale``) instead::

    out[m, n] = sum_kb (sum_{k in kb} lhs_q[m, k] * rhs_q[g, k, n])
                       * lhs_scale[m, kb] * rhs_scale[g, kb, n // 128]

One K step (``block_k = 128``) is one scale block: each step's ``wgmma`` goes into a fresh
float32 accumulator, which, once complete, is scaled by its rows' ``lhs_scale[:, kb]`` (read
from a transposed ``[K/128, M]`` copy, so contiguous) and by one ``rhs_scale`` scalar (with
``block_n = 256`` each compute warpgroup's 128 columns are one scale block), and added to the
main float32 accumulator (a register value carried by the pipeline). This is DeepGEMM's
"promotion": the FP8 products are summed in the tensor core's accumulator over 128 K only. The
cost is a ``wgmma`` wait per K step (no overlap of one step's multiply with the next's).

Layout: FP8 ``wgmma`` reads both operands K-major (only 16-bit types have a transposed operand),
so the weights must be stored ``[G, N, K]`` (K contiguous). ``scaled_gmm`` takes them in the
FP8 API's ``[G, K, N]`` and swaps the last two axes before the kernel; inside
``fp8_grouped_matmul``'s jit that transpose fuses into the quantization pass that writes
``rhs_q`` anyway. Callers that keep FP8 weights ``[G, N, K]`` (as ``torch._scaled_grouped_mm``
wants them) call :func:`scaled_gmm_kn` with ``rhs_layout="gnk"`` and pay nothing. ``block_k`` is
128: one 128-byte swizzled row of 1-byte elements (64 for bf16); the shared-memory ring holds
the same bytes per stage as the bf16 kernel's.

The dgrad of ``fp8_grouped_matmul`` is another ``scaled_gmm`` (``d out`` quantized per row against
the weights re-quantized per input channel, contracted over N), so it runs in this kernel too;
blockwise, the forward's FP8 weights and block scales transposed (``N % 128 == 0`` and
``K % 256 == 0`` for the kernel to take it).
The wgrad is high precision by default (see :func:`jaxmoe.ops.fp8.fp8_grouped_matmul`): the
bf16 Mosaic wgrad (Triton where that refuses the operands); with ``Fp8Recipe(wgrad="fp8")`` it
is :mod:`.pallas_mosaic_wgrad`'s FP8 kernel.

Limits: the rowwise recipe, or blockwise with ``block_size`` 128 and ``block_n`` 256 (the
default), e4m3 operands, a 2-byte result, ``M % block_m == 0``,
``K % 128 == 0``, ``N % block_n == 0``, a Hopper GPU. On a CPU the kernel runs in Mosaic GPU's
interpreter, which has no transposed ``wgmma`` operand but also no K-major rule, so there the
weights go in as ``[G, K, N]`` and the same body (work list, schedule, epilogue) is exercised;
the K-major path is proven by lowering for CUDA (tests) and on the device (the FP8
grouped-matmul bench).

Speed against ``torch._scaled_grouped_mm`` and the bf16 kernel: docs/kernels.md, 'FP8 grouped
matmul (Mosaic)'. Error against the float64 product of the dequantized operands: 1.7e-3 (bf16
rounding) up to 3.3e-3 at K = 14336, identical to torch's fast accumulation; the wgmma
accumulator of FP8 products is narrower than float32 (no promotion to a second float32
accumulator yet, which torch's ``use_fast_accum=False`` does at 0.83-0.87x the speed).
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

    Blockwise (``recipe``): :func:`pipeline_fp8_tiles` with ``block_m`` 64, which the ring did
    not beat. Measured: docs/kernels.md, 'FP8 grouped matmul (Mosaic)'."""
    if recipe is not None and recipe.name == "blockwise":
        return pipeline_fp8_tiles(m, k, n, recipe)
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
            k_step_scale=functools.partial(blockwise_k_step_scale, interpreted=interpreted),
            epilogue_operands=(
                jnp.swapaxes(lhs_scale.reshape(m, k // FP8_BLOCK_K), 0, 1).astype(jnp.float32),
                rhs_scale.reshape(num_groups, k // FP8_BLOCK_K, n // FP8_BLOCK_K).astype(
                    jnp.float32
                ),
            ),
        )
    return launch(
        epilogue=functools.partial(rowwise_scale_epilogue, interpreted=interpreted),
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
