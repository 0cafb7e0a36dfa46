"""The FP8 wgrad on Hopper in Pallas Mosaic GPU: a persistent, warp-specialized ``tgmm`` on e4m3.

``out[g] = (lhs_t_q[:, cols of g] @ rhs_t_q[:, cols of g].T) * lhs_scale[g][:, None] *
rhs_scale[g][None, :]`` (``[G, K, N]``): both operands transposed (``lhs_t_q [K, Mp]``, the
activations; ``rhs_t_q [N, Mp]``, the output gradient), the tokens contiguous, each group padded
by the caller to a 128-aligned column (:data:`ALIGN`) with zeros after it, so that every block is
whole and nothing is masked. It runs on the bf16 wgrad's ring, tile order, stores and plan
(:mod:`jaxmoe.ops.mosaic.tgmm_ring`, :class:`~jaxmoe.ops.mosaic.tgmm_launch.TgmmPlan`) as a
variant of its own (:class:`_TokenBlockWgrad`), with the forward's rowwise scale epilogue. How it
is built and measured: docs/kernels.md, 'The wgrad', 'The FP8 kernels' and 'FP8 wgrad (Mosaic)'.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.fp8.quantize import E4M3
from jaxmoe.ops.mosaic import persistent_loop
from jaxmoe.ops.mosaic.persistent_loop import cta_tile_count, cta_tile_index, persistent_kernel
from jaxmoe.ops.mosaic.scale_epilogues import rowwise_scale_epilogue
from jaxmoe.ops.mosaic.tgmm_launch import TgmmPlan, check_tgmm_tiles
from jaxmoe.ops.mosaic.tgmm_ring import (
    SlotBuffer,
    largest_first,
    run_wgrad_ring,
    store_tile,
)
from jaxmoe.ops.mosaic.tiles import swizzle_transforms, tile_shape_reasons
from jaxmoe.ops.mosaic.warpgroups import NUM_COMPUTE_WARPGROUPS
from jaxmoe.ops.pallas_common import swizzle

Array = jax.Array

# Group starts and the contraction block: 128 FP8 tokens, one 128-byte swizzled row.
ALIGN = 128


@dataclasses.dataclass(frozen=True)
class Fp8TgmmTileConfig:
    """Block sizes of the FP8 Mosaic ``tgmm``.

    ``block_m`` tokens of the contraction per step (128: the padding's alignment, one 128-byte
    row); the output tile is ``block_k x block_n`` (``block_k`` is ``wgmma``'s M: 64 or 128), each
    compute warpgroup owning half of ``block_n``. ``stages``: the depth of the one ring.
    ``epilogue_rows`` as the bf16 wgrad's: the height of the slab that stages the result
    (``None``: ``block_k``). The defaults stage it in 64-row halves, which makes room for a fourth
    slot: ``4 * 128 * (128 + 256)`` bytes of FP8 blocks plus ``64 x 256`` bf16, 224 KiB of the
    H100's 227 (a whole ``128 x 256`` slab allows 3 slots, 208 KiB).
    """

    block_m: int = ALIGN
    block_k: int = 128
    block_n: int = 256
    stages: int = 4
    group_swizzle: int = 8
    epilogue_rows: int | None = 64


def default_fp8_tgmm_tiles(k: int, n: int) -> Fp8TgmmTileConfig:
    """``128 x 128 x 256`` output tiles, a 4-slot ring, the result staged in 64-row halves: the
    bf16 wgrad's tiles, faster than 3 slots with a whole slab (measured: docs/kernels.md, 'FP8
    wgrad (Mosaic)')."""
    del k, n
    return Fp8TgmmTileConfig()


def check_fp8_tgmm_tiles(cfg: Fp8TgmmTileConfig) -> None:
    """Raises ``ValueError`` for block sizes the kernel cannot lower or fit in shared memory."""
    check_tgmm_tiles(cfg, operand_bytes=1, block_ms=(ALIGN,))


def unsupported_reason(
    lhs_t_shape,
    rhs_t_shape,
    lhs_dtype,
    rhs_dtype,
    out_dtype,
    cfg: Fp8TgmmTileConfig,
    interpret: bool = False,
) -> str | None:
    """Why the FP8 ``tgmm`` cannot take ``lhs_t_q [K, Mp]``, ``rhs_t_q [N, Mp]``, or ``None``."""
    (k, mp), n = lhs_t_shape, rhs_t_shape[0]
    reasons = [
        f"{name} is {jnp.dtype(dtype)}, not float8_e4m3fn"
        for name, dtype in (("lhs_t_q", lhs_dtype), ("rhs_t_q", rhs_dtype))
        if jnp.dtype(dtype) != E4M3
    ]
    return "; ".join(reasons + tile_shape_reasons(mp, k, n, cfg, out_dtype, interpret)) or None


def _jaxmoe_mosaic_fp8_tgmm(
    group_order_gmem,
    starts_gmem,
    sizes_gmem,
    lhs_gmem,
    rhs_gmem,
    lhs_scale_gmem,
    rhs_scale_gmem,
    out_gmem,
    *,
    cfg: Fp8TgmmTileConfig,
    interpreted: bool,
):
    """The kernel (see the module docstring) on the bf16 wgrad's ring
    (:func:`~jaxmoe.ops.mosaic.tgmm_ring.run_wgrad_ring`). ``rhs_gmem`` is ``rhs_t_q [N, Mp]``
    on the GPU and ``[Mp, N]`` in the interpreter; ``lhs_scale_gmem`` is ``lhs_scale``
    flattened, ``[G * K]``."""
    operands = (group_order_gmem, starts_gmem, sizes_gmem, lhs_gmem, rhs_gmem)
    scales = (lhs_scale_gmem, rhs_scale_gmem)
    run_wgrad_ring(_TokenBlockWgrad(cfg, interpreted, *operands, scales, out_gmem))


class _TokenBlockWgrad:
    """The FP8 wgrad as a :class:`~jaxmoe.ops.mosaic.tgmm_ring.WgradVariant`: both operands
    K-major (``block_m`` tokens contiguous), every block whole (a group's tiles take
    ``cdiv(size, block_m)`` steps, an empty group's none), the accumulator scaled by
    :func:`~jaxmoe.ops.mosaic.scale_epilogues.rowwise_scale_epilogue`."""

    cluster_wide = False

    def __init__(self, cfg, interpreted, group_order, starts, sizes, lhs, rhs, scales, out_gmem):
        self.cfg, self.interpreted = cfg, interpreted
        self.group_order, self.starts, self.sizes = group_order, starts, sizes
        self.lhs_gmem, self.rhs_gmem, self.scales, self.out_gmem = lhs, rhs, scales, out_gmem
        bm, bk, bn = cfg.block_m, cfg.block_k, cfg.block_n
        self.wg_n = bn // NUM_COMPUTE_WARPGROUPS
        num_groups, self.k, n = out_gmem.shape
        self.num_k_tiles, self.num_n_tiles = self.k // bk, n // bn
        self.tiles_per_group = self.num_k_tiles * self.num_n_tiles
        self.num_tiles = cta_tile_count(num_groups * self.tiles_per_group)
        self.out_dtype = out_gmem.dtype
        transforms = swizzle_transforms(bm, 1)  # 128 FP8 tokens a row (GPU)
        self.lhs_slot = SlotBuffer((bk, bm), lhs.dtype, transforms)
        if interpreted:  # tokens by columns of N: rows of bn bytes
            self.rhs_slot = SlotBuffer((bm, bn), rhs.dtype, swizzle_transforms(bn, 1))
        else:
            self.rhs_slot = SlotBuffer((bn, bm), rhs.dtype, transforms)
        out_itemsize = jnp.dtype(self.out_dtype).itemsize
        self.out_transforms = swizzle_transforms(self.wg_n * out_itemsize, out_itemsize)

    def tile_steps(self, local_tile):
        bm = self.cfg.block_m
        index = cta_tile_index(local_tile)
        group = self.group_order[index // self.tiles_per_group]
        k_tile, n_tile = swizzle(
            index % self.tiles_per_group, self.num_k_tiles, self.num_n_tiles, self.cfg.group_swizzle
        )
        # No step for an empty group: there is no block of its to load.
        count = pl.cdiv(self.sizes[group], bm)
        info = (
            group,
            k_tile * self.cfg.block_k,
            n_tile * self.cfg.block_n,
            self.starts[group] // bm,
        )
        return info, count

    def load(self, info, i, lhs_slot, rhs_slot, barrier):
        bm = self.cfg.block_m
        _, k0, col0, first_block = info
        # A multiple of bm by construction: Mosaic's layout inference needs to see that the TMA
        # box starts on a whole swizzled row (start_g + ... would not show it).
        tokens, cols = pl.ds((first_block + i) * bm, bm), pl.ds(col0, self.cfg.block_n)
        plgpu.copy_gmem_to_smem(
            self.lhs_gmem.at[pl.ds(k0, self.cfg.block_k), tokens], lhs_slot, barrier
        )
        rhs_src = (
            self.rhs_gmem.at[tokens, cols] if self.interpreted else self.rhs_gmem.at[cols, tokens]
        )
        plgpu.copy_gmem_to_smem(rhs_src, rhs_slot, barrier)

    def warpgroup(self, wg):
        return wg, pl.ds(wg * self.wg_n, self.wg_n)

    def mma(self, share, acc_ref, info, i, lhs_slot, rhs_slot):
        _, wg_cols = share
        if self.interpreted:
            rhs = rhs_slot.at[:, wg_cols]
        else:  # K-major B: the [wg_n, 128] block, transposed in place
            rhs = plgpu.transpose_ref(rhs_slot.at[wg_cols, :], (1, 0))
        plgpu.wgmma(acc_ref, lhs_slot, rhs)

    def tile_epilogue(self, share, info, count, out_slab):
        wg, _ = share
        group, k0, col0, _ = info
        wg_col0 = col0 + wg * self.wg_n
        out_ref = self.out_gmem.at[group, pl.ds(k0, self.cfg.block_k), pl.ds(wg_col0, self.wg_n)]

        def finish(acc_ref, contract):
            @pl.when(count > 0)
            def _contract_and_scale():
                contract()
                scaled = rowwise_scale_epilogue(
                    acc_ref[...],
                    *self.scales,
                    group=group,
                    row0=group * self.k + k0,
                    col0=wg_col0,
                    interpreted=self.interpreted,
                )
                store_tile(scaled.astype(self.out_dtype), out_slab, out_ref)

            @pl.when(count == 0)
            def _empty_group():
                # Zero-initialized, no wgmma: zeros, unscaled.
                store_tile(acc_ref[...].astype(self.out_dtype), out_slab, out_ref)

        return finish


def _check_shapes(lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, group_starts, group_sizes) -> None:
    (k, mp), (n, rhs_mp), g = lhs_t_q.shape, rhs_t_q.shape, group_sizes.shape[0]
    problems = []
    if rhs_mp != mp:
        problems.append(f"rhs_t_q {rhs_t_q.shape} and lhs_t_q {lhs_t_q.shape} differ in Mp")
    if tuple(lhs_scale.shape) != (g, k):
        problems.append(f"lhs_scale {lhs_scale.shape} is not [G, K] = {(g, k)}")
    if tuple(rhs_scale.shape) != (g, n):
        problems.append(f"rhs_scale {rhs_scale.shape} is not [G, N] = {(g, n)}")
    if tuple(group_starts.shape) != (g,) or group_sizes.ndim != 1:
        problems.append(f"group_starts {group_starts.shape} and group_sizes {group_sizes.shape}")
    if problems:
        raise ValueError("scaled_tgmm: " + "; ".join(problems) + ".")


def scaled_tgmm(
    lhs_t_q: Array,
    lhs_scale: Array,
    rhs_t_q: Array,
    rhs_scale: Array,
    group_starts: Array,
    group_sizes: Array,
    *,
    out_dtype=jnp.bfloat16,
    tiles: Fp8TgmmTileConfig | None = None,
    interpret: bool | None = None,
) -> Array:
    """The FP8 wgrad: ``out[g] = (f32(lhs_t_q[:, cols]) @ f32(rhs_t_q[:, cols]).T) *
    lhs_scale[g][:, None] * rhs_scale[g][None, :]`` over group ``g``'s columns ``cols =
    [start_g, start_g + size_g)``, cast to ``out_dtype``; zeros for empty groups. ``[G, K, N]``.

    Args:
      lhs_t_q: ``[K, Mp]`` e4m3, the activations transposed (tokens contiguous).
      lhs_scale: ``[G, K]`` float32, one scale per (group, k).
      rhs_t_q: ``[N, Mp]`` e4m3, the output gradient transposed.
      rhs_scale: ``[G, N]`` float32.
      group_starts: ``[G]`` int32, each a multiple of :data:`ALIGN` (128).
      group_sizes: ``[G]`` int32. The layout is the caller's (not checked: the values live on
        the device): the columns from ``start_g + size_g`` to ``start_g + round_up(size_g, 128)``
        are zero in both operands and groups do not overlap (see the module docstring).
      out_dtype: a 2-byte float (default bfloat16).
      tiles: block sizes; ``None``: :func:`default_fp8_tgmm_tiles`.
      interpret: ``None`` runs Mosaic GPU's interpreter when JAX's default backend is not a GPU.

    Raises:
      ValueError: operands of inconsistent shapes, or tiles that cannot be lowered.
      NotImplementedError: operands the kernel cannot take (see :func:`unsupported_reason`).
    """
    _check_shapes(lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, group_starts, group_sizes)
    plan = plan_scaled_tgmm(
        lhs_t_q.shape,
        rhs_t_q.shape,
        lhs_t_q.dtype,
        rhs_t_q.dtype,
        out_dtype=out_dtype,
        tiles=tiles,
        interpret=interpret,
    )
    if plan.unsupported is not None:
        raise NotImplementedError(
            f"FP8 mosaic tgmm: lhs_t_q {lhs_t_q.shape} {lhs_t_q.dtype}, rhs_t_q {rhs_t_q.shape} "
            f"{rhs_t_q.dtype}, out {plan.out_dtype}: {plan.unsupported}."
        )
    return launch_scaled_tgmm(
        lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, group_starts, group_sizes, plan
    )


def plan_scaled_tgmm(
    lhs_t_shape, rhs_t_shape, lhs_dtype, rhs_dtype, *, out_dtype, tiles, interpret
) -> TgmmPlan:
    """The plan of the FP8 wgrad of ``lhs_t_q [K, Mp]`` and ``rhs_t_q [N, Mp]``: ``tiles`` or
    :func:`default_fp8_tgmm_tiles`, checked; the interpreter or not; and
    :func:`unsupported_reason`."""
    k, n = lhs_t_shape[0], rhs_t_shape[0]
    out_dtype = jnp.dtype(out_dtype)
    cfg = tiles or default_fp8_tgmm_tiles(k, n)
    check_fp8_tgmm_tiles(cfg)
    interpret_params = persistent_loop.interpret_params(interpret)
    reason = unsupported_reason(
        lhs_t_shape, rhs_t_shape, lhs_dtype, rhs_dtype, out_dtype, cfg, interpret_params is not None
    )
    return TgmmPlan(cfg, out_dtype, interpret_params, reason)


def launch_scaled_tgmm(
    lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, group_starts, group_sizes, plan: TgmmPlan
) -> Array:
    """The FP8 wgrad kernel on checked operands, as ``plan`` says: one CTA per SM."""
    plan.refuse()
    k, n, num_groups = lhs_t_q.shape[0], rhs_t_q.shape[0], group_sizes.shape[0]
    cfg, out_dtype, interpret_params = plan.tiles, plan.out_dtype, plan.interpret_params
    interpreted = plan.interpreted
    if num_groups == 0:
        return jnp.zeros((0, k, n), out_dtype)
    sizes = group_sizes.astype(jnp.int32)
    group_order = largest_first(sizes)
    # The interpreter has no transposed wgmma operand: B goes in [Mp, N] there.
    rhs = rhs_t_q.T if interpreted else rhs_t_q
    kernel = persistent_kernel(
        functools.partial(_jaxmoe_mosaic_fp8_tgmm, cfg=cfg, interpreted=interpreted),
        jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
        interpret_params,
    )
    return kernel(
        group_order,
        group_starts.astype(jnp.int32),
        sizes,
        lhs_t_q,
        rhs,
        lhs_scale.reshape(num_groups * k).astype(jnp.float32),
        rhs_scale.astype(jnp.float32),
    )
