"""The FP8 wgrad on Hopper in Pallas Mosaic GPU: a persistent, warp-specialized ``tgmm`` on e4m3.

``out[g] = (lhs_t_q[:, cols of g] @ rhs_t_q[:, cols of g].T) * lhs_scale[g][:, None] *
rhs_scale[g][None, :]`` (``[G, K, N]``): both operands transposed (``lhs_t_q [K, Mp]``, the
activations; ``rhs_t_q [N, Mp]``, the output gradient), the tokens contiguous, each group padded
by the caller to a 128-aligned column (:data:`ALIGN`) with zeros after it, so that every block is
whole and nothing is masked. The bf16 wgrad's tile order, ring and stores
(:mod:`jaxmoe.ops.mosaic.tgmm_kernel`), the forward's rowwise scale epilogue. How it is built
and measured: docs/kernels.md, 'The FP8 kernels' and 'FP8 wgrad (Mosaic)'.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.fp8.quantize import E4M3
from jaxmoe.ops.mosaic import persistent_loop, tgmm_kernel
from jaxmoe.ops.mosaic.persistent_loop import cta_tile_count, cta_tile_index, persistent_kernel
from jaxmoe.ops.mosaic.ring import ring_barriers, ring_consume, ring_produce
from jaxmoe.ops.mosaic.scale_epilogues import rowwise_scale_epilogue
from jaxmoe.ops.mosaic.tgmm_kernel import TgmmPlan
from jaxmoe.ops.mosaic.tiles import tile_shape_reasons
from jaxmoe.ops.mosaic.warpgroups import NUM_COMPUTE_WARPGROUPS, split_warpgroups
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
    tgmm_kernel.check_tgmm_tiles(cfg, operand_bytes=1, block_ms=(ALIGN,))


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
    """The kernel (see the module docstring). ``rhs_gmem`` is ``rhs_t_q [N, Mp]`` on the GPU and
    ``[Mp, N]`` in the interpreter; ``lhs_scale_gmem`` is ``lhs_scale`` flattened, ``[G * K]``."""
    bm, bk, bn, stages = cfg.block_m, cfg.block_k, cfg.block_n, cfg.stages
    wg_n = bn // NUM_COMPUTE_WARPGROUPS
    num_groups, k, n = out_gmem.shape
    num_k_tiles, num_n_tiles = k // bk, n // bn
    tiles_per_group = num_k_tiles * num_n_tiles
    my_tiles = cta_tile_count(num_groups * tiles_per_group)
    out_dtype = out_gmem.dtype

    def swizzled(row_bytes: int, itemsize: int):
        swizzle = plgpu.find_swizzle(row_bytes * 8)
        return (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))

    transforms = swizzled(bm, 1)  # 128 FP8 tokens a row (GPU)
    rhs_block = (bm, bn) if interpreted else (bn, bm)
    if interpreted:  # tokens by columns of N: rows of bn bytes
        rhs_transforms = swizzled(bn, 1)
    else:
        rhs_transforms = transforms
    out_itemsize = jnp.dtype(out_dtype).itemsize
    out_transforms = swizzled(wg_n * out_itemsize, out_itemsize)

    def tile_info(local_tile):
        index = cta_tile_index(local_tile)
        group = group_order_gmem[index // tiles_per_group]
        k_tile, n_tile = swizzle(
            index % tiles_per_group, num_k_tiles, num_n_tiles, cfg.group_swizzle
        )
        # No step for an empty group: there is no block of its to load.
        count = pl.cdiv(sizes_gmem[group], bm)
        return (group, k_tile * bk, n_tile * bn, starts_gmem[group] // bm), count

    @functools.partial(
        pl.run_scoped,
        lhs_ring=plgpu.SMEM((stages, bk, bm), lhs_gmem.dtype, transforms=transforms),
        rhs_ring=plgpu.SMEM((stages, *rhs_block), rhs_gmem.dtype, transforms=rhs_transforms),
        out_smem=plgpu.SMEM(
            (NUM_COMPUTE_WARPGROUPS, tgmm_kernel.epilogue_rows(cfg), wg_n),
            out_dtype,
            transforms=out_transforms,
        ),
        **ring_barriers(stages, copies_per_step=2),
        collective_axes="wg",
    )
    def _scope(lhs_ring, rhs_ring, out_smem, loaded, released):
        def memory_warpgroup():
            def load(info, i, slot):
                _, k0, col0, first_block = info
                # A multiple of bm by construction: Mosaic's layout inference needs to see that
                # the TMA box starts on a whole swizzled row (start_g + ... would not show it).
                tokens, cols = pl.ds((first_block + i) * bm, bm), pl.ds(col0, bn)
                barrier = loaded.at[slot]
                plgpu.copy_gmem_to_smem(
                    lhs_gmem.at[pl.ds(k0, bk), tokens], lhs_ring.at[slot], barrier
                )
                rhs_src = rhs_gmem.at[tokens, cols] if interpreted else rhs_gmem.at[cols, tokens]
                plgpu.copy_gmem_to_smem(rhs_src, rhs_ring.at[slot], barrier)

            ring_produce(my_tiles, tile_info, load, stages=stages, released=released)

        def compute_warpgroup(wg):
            wg_cols = pl.ds(wg * wg_n, wg_n)

            def tile(local_tile, step):
                (group, k0, col0, _), count = tile_info(local_tile)
                wg_col0 = col0 + wg * wg_n

                def acc_scope(acc_ref):
                    def mma(i, slot, carry):
                        rhs_smem = rhs_ring.at[slot]
                        if interpreted:
                            rhs = rhs_smem.at[:, wg_cols]
                        else:  # K-major B: the [wg_n, 128] block, transposed in place
                            rhs = plgpu.transpose_ref(rhs_smem.at[wg_cols, :], (1, 0))
                        plgpu.wgmma(acc_ref, lhs_ring.at[slot], rhs)
                        return carry

                    def store(acc):
                        tgmm_kernel.store_tile(
                            acc.astype(out_dtype),
                            out_smem.at[wg],
                            out_gmem.at[group, pl.ds(k0, bk), pl.ds(wg_col0, wg_n)],
                        )

                    @pl.when(count > 0)
                    def _contract_and_scale():
                        ring_consume(
                            step, count, mma, None, stages=stages, loaded=loaded, released=released
                        )
                        store(
                            rowwise_scale_epilogue(
                                acc_ref[...],
                                lhs_scale_gmem,
                                rhs_scale_gmem,
                                group=group,
                                row0=group * k + k0,
                                col0=wg_col0,
                                interpreted=interpreted,
                            )
                        )

                    @pl.when(count == 0)
                    def _empty_group():
                        store(acc_ref[...])  # zero-initialized, no wgmma: zeros, unscaled

                pl.run_scoped(acc_scope, plgpu.ACC((bk, wg_n), jnp.float32))
                return step + count

            lax.fori_loop(0, my_tiles, tile, jnp.int32(0))
            plgpu.wait_smem_to_gmem(0)

        split_warpgroups(memory_warpgroup, compute_warpgroup)


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
    group_order = tgmm_kernel.largest_first(sizes)
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
