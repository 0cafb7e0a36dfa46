"""The Mosaic GPU grouped wgrad's tiles, plan and launch: ``tgmm`` on Hopper.

``out[g] = lhs[rows of g].T @ rhs[rows of g]`` (``[G, K, N]``): the block sizes
(:class:`MosaicTgmmTileConfig`), their checks and which operands the kernel takes, the plan of a
call (:class:`TgmmPlan`, which the FP8 wgrad shares) and its launch, and the checked entry point
:func:`tgmm`. The kernel body: :mod:`.tgmm_kernel`, on the ring of :mod:`.tgmm_ring`. How it is
built and measured: docs/kernels.md, 'The wgrad' and 'Mosaic wgrad'.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxmoe.ops.mosaic import persistent_loop
from jaxmoe.ops.mosaic.persistent_loop import persistent_kernel
from jaxmoe.ops.mosaic.tgmm_kernel import cluster_ctas, group_offsets, mosaic_tgmm_body
from jaxmoe.ops.mosaic.tgmm_ring import epilogue_rows, largest_first, smem_bytes
from jaxmoe.ops.mosaic.tiles import tile_shape_reasons
from jaxmoe.ops.pallas_common import check_tgmm_operands

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class MosaicTgmmTileConfig:
    """Block sizes of the Mosaic GPU ``tgmm`` (docs/kernels.md, 'The wgrad').

    ``block_m`` rows of the contraction per ring step; the output tile is ``block_k x block_n``
    (``block_k`` is ``wgmma``'s M: 64 or 128); ``stages``: the ring's depth; ``epilogue_rows``:
    the slab that stages a warpgroup's result (``None``: ``block_k``; ``block_k // 2`` stores it
    in halves and frees room for a fourth slot). ``split_rows`` (``block_k`` 128): the compute
    warpgroups split the tile's rows, as the ``gmm``'s option of that name; on in
    :func:`default_mosaic_tgmm_tiles`, off here so that a config naming ``block_k`` 64 stays
    valid. ``multicast_rhs``: clusters of two CTAs take neighbouring K tiles of one (group, N
    tile) and share each ``rhs`` block by TMA multicast; needs an even ``K / block_k``; off by
    default (exact, no faster).
    """

    block_m: int = 64
    block_k: int = 128
    block_n: int = 256
    stages: int = 4
    group_swizzle: int = 8
    epilogue_rows: int | None = 64
    split_rows: bool = False
    multicast_rhs: bool = False


def default_mosaic_tgmm_tiles(m: int, k: int, n: int) -> MosaicTgmmTileConfig:
    """Block sizes of the Mosaic ``tgmm``: ``64 x 128 x 256`` tiles, a 4-deep ring made to fit by
    storing the result in 64-row halves, and the compute warpgroups splitting the rows
    (``split_rows``); each the fastest of the variants measured (docs/kernels.md, 'Mosaic
    wgrad')."""
    del m, k, n
    return MosaicTgmmTileConfig(split_rows=True)


def check_tgmm_tiles(
    cfg: MosaicTgmmTileConfig, operand_bytes: int = 2, block_ms: tuple[int, ...] = (64, 128)
) -> None:
    """Raises ``ValueError`` for block sizes the kernel cannot lower or fit in shared memory
    (``operand_bytes``: 2 for bf16/fp16, 1 for the FP8 wgrad's; ``block_ms``: the contraction
    blocks its swizzle takes)."""
    problems = []
    smem = smem_bytes(cfg, operand_bytes)
    if cfg.block_m not in block_ms:
        problems.append(f"block_m={cfg.block_m} must be {' or '.join(map(str, block_ms))}")
    if cfg.block_k not in (64, 128):
        problems.append(f"block_k={cfg.block_k} must be 64 or 128 (wgmma's M per warpgroup)")
    if cfg.block_n not in (128, 256):
        problems.append(f"block_n={cfg.block_n} must be 128 or 256 (two warpgroups take half)")
    if cfg.stages < 2:
        problems.append(f"stages={cfg.stages} must be >= 2")
    if cfg.group_swizzle < 1:
        problems.append(f"group_swizzle={cfg.group_swizzle} must be >= 1")
    if getattr(cfg, "split_rows", False) and cfg.block_k != 128:
        problems.append(
            f"split_rows=True needs block_k=128 (64 rows, one wgmma M tile, per warpgroup), "
            f"not {cfg.block_k}"
        )
    if epilogue_rows(cfg) not in (cfg.block_k, cfg.block_k // 2) or epilogue_rows(cfg) < 64:
        problems.append(
            f"epilogue_rows={epilogue_rows(cfg)} must be block_k or block_k // 2, and >= 64 "
            "(wgmma's row blocks)"
        )
    if smem > SMEM_LIMIT:
        problems.append(f"{smem} bytes of shared memory > {SMEM_LIMIT} (fewer stages)")
    if problems:
        raise ValueError(f"{type(cfg).__name__}: " + "; ".join(problems) + ".")


SMEM_LIMIT = 227 * 1024  # an H100's per-block opt-in maximum


def unsupported_tgmm_reason(
    lhs_shape, rhs_shape, dtype, out_dtype, cfg: MosaicTgmmTileConfig, interpret: bool = False
) -> str | None:
    """Why the Mosaic ``tgmm`` cannot take ``lhs [M, K]``, ``rhs [M, N]``, or ``None``."""
    m, k = lhs_shape
    n = rhs_shape[1]
    reasons = []
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        reasons.append(f"operands are {jnp.dtype(dtype)}, not bf16/fp16")
    reasons += tile_shape_reasons(m, k, n, cfg, out_dtype, interpret)
    k_tiles = k // cfg.block_k
    if cfg.multicast_rhs and k % cfg.block_k == 0 and k_tiles % cluster_ctas(cfg):
        reasons.append(
            f"multicast_rhs=True pairs neighbouring K tiles, and K / block_k = {k_tiles} is odd"
        )
    if interpret:
        reasons.append("Mosaic GPU's interpreter has no transposed wgmma operand (wgrad)")
    return "; ".join(reasons) or None


@dataclasses.dataclass(frozen=True)
class TgmmPlan:
    """How a Mosaic ``tgmm`` (this one or the FP8 wgrad) runs one call, decided once, before
    tracing: its ``tiles`` (checked), ``out_dtype``, ``interpret_params`` (``None`` on a GPU)
    and ``unsupported``, why the kernel cannot take the operands (``None`` if it can; such a
    plan is never launched)."""

    tiles: Any
    out_dtype: jnp.dtype
    interpret_params: Any
    unsupported: str | None = None

    @property
    def interpreted(self) -> bool:
        return self.interpret_params is not None

    def refuse(self) -> None:
        """``NotImplementedError`` for a plan that says the kernel cannot run."""
        if self.unsupported is not None:
            raise NotImplementedError(
                f"mosaic tgmm: the plan refuses the operands: {self.unsupported}"
            )


def plan_tgmm(lhs_shape, rhs_shape, dtype, *, out_dtype, tiles, interpret) -> TgmmPlan:
    """The plan of ``tgmm(lhs [M, K], rhs [M, N])``: ``tiles`` or the default, checked; whether
    it runs in the interpreter; and :func:`unsupported_tgmm_reason`."""
    m, k = lhs_shape
    n = rhs_shape[1]
    out_dtype = jnp.dtype(out_dtype or dtype)
    cfg = tiles or default_mosaic_tgmm_tiles(m, k, n)
    check_tgmm_tiles(cfg)
    interpret_params = persistent_loop.interpret_params(interpret)
    reason = unsupported_tgmm_reason(
        lhs_shape, rhs_shape, dtype, out_dtype, cfg, interpret_params is not None
    )
    return TgmmPlan(cfg, out_dtype, interpret_params, reason)


def tgmm(
    lhs: Array,
    rhs: Array,
    group_sizes: Array,
    *,
    out_dtype=None,
    tiles: MosaicTgmmTileConfig | None = None,
    interpret: bool | None = None,
) -> Array:
    """``out[g] = lhs[rows of g]^T @ rhs[rows of g]``; zeros for empty groups; ``[G, K, N]``.

    Same contract as :func:`jaxmoe.ops.grouped_matmul.pallas_triton.tgmm`; the operands must pass
    :func:`unsupported_tgmm_reason` (bf16/fp16, dims divisible by the blocks, a Hopper GPU).
    Checks its arguments (``ValueError``) and refuses what the kernel cannot take
    (``NotImplementedError``, why).
    """
    check_tgmm_operands(lhs, rhs, group_sizes)
    plan = plan_tgmm(
        lhs.shape, rhs.shape, lhs.dtype, out_dtype=out_dtype, tiles=tiles, interpret=interpret
    )
    if plan.unsupported is not None:
        raise NotImplementedError(
            f"mosaic tgmm: lhs {lhs.shape} {lhs.dtype}, rhs {rhs.shape}, out {plan.out_dtype}: "
            f"{plan.unsupported}. Use backend='pallas_triton', or 'auto', which picks the "
            "Triton kernel."
        )
    return launch_tgmm(lhs, rhs, group_sizes, plan)


def launch_tgmm(lhs: Array, rhs: Array, group_sizes: Array, plan: TgmmPlan) -> Array:
    """The kernel on checked operands, as ``plan`` says: one CTA per SM."""
    plan.refuse()
    m, k = lhs.shape
    n = rhs.shape[1]
    num_groups = group_sizes.shape[0]
    cfg, out_dtype, interpret_params = plan.tiles, plan.out_dtype, plan.interpret_params
    if num_groups == 0:
        return jnp.zeros((0, k, n), out_dtype)
    offsets = group_offsets(group_sizes, m)
    group_order = largest_first(offsets[1:] - offsets[:-1])
    kernel = persistent_kernel(
        functools.partial(mosaic_tgmm_body, cfg=cfg),
        jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
        interpret_params,
        cluster_ctas=cluster_ctas(cfg),
    )
    return kernel(group_order, offsets, lhs, rhs)
