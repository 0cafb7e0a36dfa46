"""Which operands and block sizes the Mosaic GPU ``gmm`` (:mod:`.launch`) takes.

:class:`MosaicTileConfig` (its block sizes and pipeline knobs), the measured default
(:func:`default_mosaic_gmm_tiles`), and the checks that decide, before anything is traced,
whether the kernel can run a call (:func:`unsupported_reason`) and lower a config
(:func:`check_tiles`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.mosaic.warpgroups import (
    MULTICAST_CLUSTER_CTAS,
    NUM_COMPUTE_WARPGROUPS,
    STAGE_MAX_COLS,
    warpgroup_share,
)


@dataclasses.dataclass(frozen=True)
class MosaicTileConfig:
    """Block sizes and pipeline knobs of the Mosaic GPU ``gmm`` (:func:`check_tiles` says what
    lowers; docs/kernels.md, 'Tiles and shared memory', what each knob does and why).

    ``block_m x block_n`` is a CTA's tile, stepping over K by ``block_k``; ``stages``: the ring's
    depth; ``group_swizzle``: work items walked together along N (L2 reuse). ``ring``: one
    hand-written ring across a CTA's tiles, else jax's pipeline per tile (chained across tiles
    with ``pipelined_tiles``). ``epilogue_rows``: the staging slab's height (``None``:
    ``block_m``); ``swizzled_epilogue``: whole slabs through 128-byte-swizzled slots.
    ``split_rows``: the compute warpgroups split the tile's rows, not its columns.
    ``group_start_tiles``: each group's tiles start at its first row, not on the ``block_m``
    grid. ``multicast_weights``: clusters of two CTAs share a weight block by TMA multicast.
    ``split_last_round``: the last round's units cut along K. ``approx_math``: Mosaic GPU's
    approximate transcendental instructions.
    """

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 3
    group_swizzle: int = 8
    pipelined_tiles: bool = False
    epilogue_rows: int | None = None
    swizzled_epilogue: bool = False
    ring: bool = False
    split_rows: bool = False
    group_start_tiles: bool = False
    multicast_weights: bool = False
    split_last_round: bool = False
    approx_math: bool = False


# Rows each group is padded to where the bf16/fp16 experts run these kernels: the wgrad's 64-row
# contraction blocks then drop half the padding of 128 (measured: docs/kernels.md, 'Layer: expert
# row alignment').
MOSAIC_ALIGNMENT = 64

# With group_start_tiles a tile starts on this row grid: a TMA copy into a tiled shared buffer
# (8-row tiles) takes a first row that is a multiple of 8 only (Mosaic GPU's layout inference
# refuses others).
GROUP_START_ALIGN = 8


def swizzle_transforms(row_bytes: int, itemsize: int) -> tuple:
    """The shared-memory transforms of a block whose rows are ``row_bytes`` bytes of
    ``itemsize``-byte elements: the widest swizzle they allow, tiled in 8-row groups of one
    swizzle's width (every kernel's TMA blocks and epilogue slots)."""
    swizzle_bytes = plgpu.find_swizzle(row_bytes * 8)
    return (
        plgpu.TilingTransform((8, swizzle_bytes // itemsize)),
        plgpu.SwizzleTransform(swizzle_bytes),
    )


def tile_align(cfg: MosaicTileConfig) -> int | None:
    """The work list's ``tile_align`` (:mod:`.work_list`): ``None`` for the ``block_m`` grid."""
    return GROUP_START_ALIGN if cfg.group_start_tiles else None


def cluster_ctas(cfg: MosaicTileConfig) -> int:
    """CTAs per cluster: two with ``multicast_weights``, else one."""
    return MULTICAST_CLUSTER_CTAS if cfg.multicast_weights else 1


def warpgroup_tile(cfg: MosaicTileConfig) -> tuple[int, int]:
    """The ``(rows, columns)`` of a tile one compute warpgroup multiplies: half its rows with
    ``split_rows``, otherwise half its columns."""
    return warpgroup_share(cfg.block_m, cfg.block_n, cfg.split_rows)


# Hopper's opt-in shared memory per block (227 KiB); the barriers use a few hundred bytes more.
SMEM_LIMIT_BYTES = 227 * 1024
# The swizzled epilogue's column chunk: one 128-byte row, the widest TMA swizzle.
SWIZZLE_BYTES = 128


def epilogue_layout(
    cfg: MosaicTileConfig, out_bytes: int = 2, slab_cols: int | None = None
) -> dict[str, int]:
    """The epilogue's shared-memory buffers (sizes in elements, per compute warpgroup).

    ``rows``: the slab's height; ``wg_m``, ``wg_n``: a compute warpgroup's rows and columns of a
    tile; ``slab_cols``: the unswizzled slab's width (``[rows, slab_cols]``; a wider warpgroup
    tile, ``split_rows`` at ``block_n`` 256, is staged ``slab_cols`` columns at a time, which
    leaves room for a fourth ring slot; narrower if ``slab_cols`` says so, for a kernel that
    stores narrower results); with ``swizzled_epilogue``, ``chunk_cols`` (one
    swizzled row), ``chunks`` (column chunks per slab), ``stores`` (swizzled stores per result)
    and ``slots`` (buffers per warpgroup: two, or one when a result is a single store).

    ``slab_rows``: the rows allocated per warpgroup for the unswizzled slab (its first ``rows``
    are used). With ``swizzled_epilogue`` the two buffers alias one region, so each warpgroup's
    slab must cover exactly its own swizzled slots: where the slots are larger (``block_n``
    128: two 64-column slots against a 64-column slab) the slab is padded, or warpgroup 1's
    slab would lie on warpgroup 0's second slot (found: docs/kernels.md, 'Mosaic epilogue: the
    slab under the swizzled buffers').
    """
    wg_m, wg_n = warpgroup_tile(cfg)
    rows = min(cfg.epilogue_rows or cfg.block_m, wg_m)
    slab_cols = min(wg_n, slab_cols or STAGE_MAX_COLS)
    chunk_cols = min(wg_n, SWIZZLE_BYTES // out_bytes)
    chunks = wg_n // chunk_cols
    stores = (wg_m // rows) * chunks
    slots = min(2, stores)
    slab_rows = rows
    # split_last_round's float32 partial sums are staged [rows, partial_cols] at a time.
    partial_cols = min(wg_n, SWIZZLE_BYTES // 2)
    if cfg.swizzled_epilogue:
        slab_rows = max(rows, slots * rows * chunk_cols // slab_cols)
    return dict(
        rows=rows,
        wg_m=wg_m,
        wg_n=wg_n,
        slab_cols=slab_cols,
        chunk_cols=chunk_cols,
        chunks=chunks,
        stores=stores,
        slots=slots,
        slab_rows=slab_rows,
        partial_cols=partial_cols,
    )


def epilogue_smem_bytes(cfg: MosaicTileConfig, out_bytes: int = 2) -> int:
    """Shared memory of the epilogue's staging buffers (the largest: they are aliased)."""
    lay = epilogue_layout(cfg, out_bytes)
    unswizzled = lay["slab_rows"] * lay["slab_cols"] * out_bytes
    swizzled = lay["slots"] * lay["rows"] * lay["chunk_cols"] * out_bytes
    partial = lay["rows"] * lay["partial_cols"] * 4  # split_last_round's partial sums
    return NUM_COMPUTE_WARPGROUPS * max(
        unswizzled, swizzled if cfg.swizzled_epilogue else 0, partial if cfg.split_last_round else 0
    )


def smem_bytes(cfg: MosaicTileConfig, operand_bytes: int = 2, num_rhs: int = 1) -> int:
    """Shared memory of the kernel's buffers: the TMA ring (``stages`` slots of one ``lhs``
    block and ``num_rhs`` weight blocks) and the epilogue's staging."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    ring = cfg.stages * (bm * bk + num_rhs * bk * bn) * operand_bytes
    return ring + epilogue_smem_bytes(cfg)


# The default cuts the last round along K (``split_last_round``) from this contraction length
# up, where the share of a unit's K loop it saves outweighs the fix-up (measured:
# docs/kernels.md, 'Mosaic gmm: default tiles').
SPLIT_LAST_ROUND_MIN_K = 8192
# The default multicasts the weights from this many elements per expert (K * N) up: between
# DeepSeek's 14.7 M (no gain) and Mixtral's 58.7 M (3-5%; docs/kernels.md, 'Mosaic gmm:
# default tiles').
MULTICAST_MIN_WEIGHT_ELEMENTS = 32 * 1024 * 1024


def default_mosaic_gmm_tiles(m: int, k: int, n: int) -> MosaicTileConfig:
    """Block sizes of the Mosaic ``gmm``: ``128 x 256 x 64`` tiles, a 4-deep ring made to fit in
    shared memory by a 64-row epilogue slab, the hand-written ring across a CTA's tiles and the
    swizzled epilogue, on every shape; the weight multicast on large experts and the last round
    cut along K on long contractions.

    Each choice was measured against the alternatives on the six benchmark shapes (fwd and
    dgrad, balanced and skewed groups): docs/kernels.md, 'Mosaic gmm: default tiles'.
    """
    del m
    return MosaicTileConfig(
        stages=4,
        epilogue_rows=64,
        swizzled_epilogue=True,
        ring=True,
        split_rows=True,
        group_start_tiles=True,
        multicast_weights=k * n >= MULTICAST_MIN_WEIGHT_ELEMENTS,
        split_last_round=k >= SPLIT_LAST_ROUND_MIN_K,
    )


def supports(
    lhs_shape,
    rhs_shape,
    dtype,
    out_dtype,
    transpose_rhs,
    cfg: MosaicTileConfig,
    interpret: bool = False,
) -> bool:
    """Whether the Mosaic ``gmm`` takes these operands: :func:`unsupported_reason` is ``None``."""
    return (
        unsupported_reason(lhs_shape, rhs_shape, dtype, out_dtype, transpose_rhs, cfg, interpret)
        is None
    )


def unsupported_reason(
    lhs_shape,
    rhs_shape,
    dtype,
    out_dtype,
    transpose_rhs,
    cfg: MosaicTileConfig,
    interpret: bool = False,
) -> str | None:
    """Why the Mosaic ``gmm`` cannot take these operands, or ``None`` if it can.

    ``interpret``: whether it would run in Mosaic GPU's interpreter, which has no transposed
    ``wgmma`` operand (so no dgrad there); otherwise the GPU must be a Hopper (9.x).
    """
    m, k = lhs_shape
    n = rhs_shape[1] if transpose_rhs else rhs_shape[2]
    reasons = []
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        reasons.append(f"operands are {jnp.dtype(dtype)}, not bf16/fp16")
    reasons += tile_shape_reasons(m, k, n, cfg, out_dtype, interpret)
    if interpret and transpose_rhs:
        reasons.append("Mosaic GPU's interpreter has no transposed wgmma operand (dgrad)")
    return "; ".join(reasons) or None


def tile_shape_reasons(m: int, k: int, n: int, cfg, out_dtype, interpret: bool) -> list[str]:
    """What every Mosaic kernel here needs of an ``[M, K] x [K, N]`` problem tiled by ``cfg``
    (``block_m``, ``block_k``, ``block_n``): whole TMA boxes (no box crosses an array edge), a
    2-byte result, and, unless interpreted, a Hopper GPU (``wgmma``)."""
    reasons = []
    if jnp.dtype(out_dtype).itemsize != 2:
        reasons.append(f"the result is {jnp.dtype(out_dtype)}, not a 2-byte type")
    if m == 0 or m % cfg.block_m:
        reasons.append(f"M={m} is not a positive multiple of block_m={cfg.block_m}")
    if k % cfg.block_k:
        reasons.append(f"K={k} is not a multiple of block_k={cfg.block_k}")
    if n % cfg.block_n:
        reasons.append(f"N={n} is not a multiple of block_n={cfg.block_n}")
    if not interpret:
        cc = _compute_capability()
        if cc is not None and not cc.startswith("9."):
            reasons.append(f"the GPU has compute capability {cc}; wgmma needs 9.x (Hopper)")
    return reasons


def hopper_gpu() -> bool:
    """Whether JAX's first device is a Hopper GPU (compute capability 9.x), where ``auto`` runs
    the Mosaic kernels."""
    cc = _compute_capability()
    return cc is not None and cc.startswith("9.")


def _compute_capability() -> str | None:
    """The first device's CUDA compute capability (``"9.0"``), ``None`` when not a GPU."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        return None  # lowering for a GPU from a CPU host (the tests): nothing to ask
    return getattr(device, "compute_capability", None)


def check_tiles(cfg: MosaicTileConfig, operand_bytes: int = 2, num_rhs: int = 1) -> None:
    """Raises ``ValueError`` for block sizes the kernel cannot lower (``operand_bytes``: 2 for
    bf16/fp16, 1 for FP8; ``num_rhs``: weights sharing each lhs block, 2 for the fused gated
    kernel), or whose buffers do not fit in shared memory."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    problems = []
    if bm not in (64, 128):
        problems.append(f"block_m={bm} must be 64 or 128 (one wgmma M tile per warpgroup)")
    if bn not in (128, 256):
        problems.append(f"block_n={bn} must be 128 or 256")
    if bk * operand_bytes != 128:
        problems.append(
            f"block_k={bk} must be {128 // operand_bytes} (one 128-byte swizzled row of "
            f"{operand_bytes}-byte operands)"
        )
    if cfg.stages < 2:
        problems.append(f"stages={cfg.stages} must be >= 2")
    if cfg.group_swizzle < 1:
        problems.append(f"group_swizzle={cfg.group_swizzle} must be >= 1")
    if cfg.multicast_weights and not cfg.ring:
        problems.append("multicast_weights=True needs ring=True (its releases span the cluster)")
    if cfg.split_last_round and not cfg.ring:
        problems.append("split_last_round=True needs ring=True (the pieces run on the ring)")
    if cfg.split_rows and bm != 128:
        problems.append("split_rows=True needs block_m=128 (one 64-row wgmma M tile per warpgroup)")
    if cfg.epilogue_rows not in (None, bm) and not (
        cfg.epilogue_rows == bm // 2 and cfg.epilogue_rows >= 64
    ):
        problems.append(
            f"epilogue_rows={cfg.epilogue_rows} must be None, block_m or block_m // 2 >= 64 "
            "(smaller slabs fail Mosaic's layout inference)"
        )
    if not problems:
        need = smem_bytes(cfg, operand_bytes, num_rhs)
        if need > SMEM_LIMIT_BYTES:
            ring = need - epilogue_smem_bytes(cfg)
            problems.append(
                f"shared memory: stages={cfg.stages} ring ({ring // 1024} KiB) + epilogue "
                f"staging ({epilogue_smem_bytes(cfg) // 1024} KiB, epilogue_rows="
                f"{cfg.epilogue_rows}, swizzled_epilogue={cfg.swizzled_epilogue}) = "
                f"{need // 1024} KiB does not fit in {SMEM_LIMIT_BYTES // 1024} KiB; use fewer "
                "stages or epilogue_rows=block_m // 2"
            )
    if problems:
        raise ValueError("MosaicTileConfig: " + "; ".join(problems) + ".")
