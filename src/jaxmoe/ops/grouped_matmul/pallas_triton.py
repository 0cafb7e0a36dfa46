"""Grouped matmul kernels in Pallas on the Triton backend: ``gmm`` (forward and dgrad) and ``tgmm``.

Layout of the work (``bm, bn, bk`` are the block sizes)::

    gmm:  out[M, N] = lhs[M, K] @ rhs[g]            rows of group g only
          work item = (m tile t, group g intersecting t), one per pair; at most
          cdiv(M, bm) + G of them (G real groups plus a "tail" group for the rows
          at or past sum(group_sizes), which are written as zeros).
          grid = work items x N tiles (1-D, swizzled so that neighbouring programs
          share lhs tiles and rhs[g] tiles in L2). Each program accumulates
          lhs[t] @ rhs[g][:, n] over K in float32 and stores only its group's rows
          (masked store), so a tile that two groups straddle is written by two
          programs, each its own rows.

    tgmm: out[g, K, N] = lhs_g^T @ rhs_g            over the rows of group g
          grid = G x K tiles x N tiles; each program loops over its group's rows
          in chunks of bm (trip count read from the group offsets in-kernel),
          masking rows outside the group. An empty group writes zeros.

The work metadata (group and m tile of each work item) is computed on the device with ``jnp`` ops,
so group sizes never leave the device and everything works under ``jit``. The transposed ``rhs`` of
dgrad is read as ``[bn, bk]`` blocks of ``rhs[g]`` and fed to the dot transposed; nothing is
materialised.

With ``interpret=None`` the kernels run in Pallas interpret mode when JAX's default backend is not a
GPU: the same kernel bodies, executed exactly (and slowly) on the CPU, which is what the tests use.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxmoe import compat
from jaxmoe.ops import work_list
from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend
from jaxmoe.ops.pallas_common import (
    check_gmm_operands,
    check_tgmm_operands,
    swizzle,
    use_interpret,
)

Array = jax.Array


# --------------------------------------------------------------------------------------------------
# Config: block sizes per kernel, and the measured heuristic that picks them.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Block sizes and Triton launch knobs of one kernel.

    For ``gmm`` the program computes a ``[block_m, block_n]`` output tile, stepping over K by
    ``block_k``. For ``tgmm`` it computes a ``[block_k, block_n]`` tile of ``out[g]``, stepping over
    the group's rows by ``block_m``. ``group_swizzle`` is how many neighbouring row tiles (gmm) or
    K tiles (tgmm) are walked together before moving along N, for L2 reuse.
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 8
    num_stages: int = 4
    group_swizzle: int = 8


def _pow2_at_most(limit: int, want: int, floor: int = 16) -> int:
    """The block size ``want``, shrunk to the next power of two covering ``limit`` (>= floor)."""
    cover = max(floor, 1 << max(0, (limit - 1).bit_length()))
    return max(floor, min(want, cover))


def _fit(cfg: TileConfig, m: int, k: int, n: int) -> TileConfig:
    """Shrinks a config's blocks for small dims (Triton blocks must be powers of two, >= 16)."""
    return dataclasses.replace(
        cfg,
        block_m=_pow2_at_most(m, cfg.block_m),
        block_k=_pow2_at_most(k, cfg.block_k),
        block_n=_pow2_at_most(n, cfg.block_n),
    )


def default_gmm_tiles(m: int, k: int, n: int, num_groups: int, dtype) -> TileConfig:
    """Block sizes of ``gmm`` for ``lhs[m, k] @ rhs[g, k, n]`` (dgrad passes its own k and n).

    A measured table, not a model: ``128x256x64``, 8 warps, 3 stages (4 stages for a short
    loop, ``min(k, n) <= 1024``) was the fastest, or within 2% of it, of the configs tried for
    the forward and dgrad of all six benchmark shapes (docs/kernels.md, 'Triton grouped matmul
    tiles'). Small ``n`` and float32 operands (no measurement: fp32 is exact IEEE here, far
    from the tensor-core rate) use smaller tiles.
    """
    del m, num_groups
    if jnp.dtype(dtype).itemsize >= 4:
        return TileConfig(block_m=64, block_n=128, block_k=32, num_warps=4, num_stages=3)
    if n <= 128:
        return TileConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4)
    stages = 4 if min(k, n) <= 1024 else 3
    return TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=stages)


def default_tgmm_tiles(m: int, k: int, n: int, num_groups: int, dtype) -> TileConfig:
    """Block sizes of ``tgmm`` for ``out[g, k, n] = lhs[m, k]^T @ rhs[m, n]`` over groups.

    A measured table like :func:`default_gmm_tiles`: a ``[128, 256]`` output tile (K x N), 64
    rows per step, 8 warps, 4 stages (docs/kernels.md, 'Triton grouped matmul tiles').
    """
    del m, k, n, num_groups
    if jnp.dtype(dtype).itemsize >= 4:
        return TileConfig(block_m=32, block_n=64, block_k=64, num_warps=4, num_stages=3)
    return TileConfig(block_m=64, block_n=256, block_k=128, num_warps=8, num_stages=4)


# --------------------------------------------------------------------------------------------------
# Kernel bodies.
# --------------------------------------------------------------------------------------------------


def _dot_precision(dtype):
    # float32 operands: exact float32 products (no tf32), matching jax's "highest" behaviour.
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype).itemsize >= 4 else None


def _gmm_kernel(
    work_group_ref,
    work_first_row_ref,
    offsets_ref,
    lhs_ref,
    rhs_ref,
    out_ref,
    *,
    cfg: TileConfig,
    num_groups: int,
    num_work: int,
    num_n_tiles: int,
    transpose_rhs: bool,
):
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    m, k = lhs_ref.shape
    n = out_ref.shape[1]
    work, n_tile = swizzle(pl.program_id(0), num_work, num_n_tiles, cfg.group_swizzle)
    group = work_group_ref[work]
    row0 = work_list.tile_first_row(work_first_row_ref[work], bm, m)
    col0 = n_tile * bn
    rows = row0 + jnp.arange(bm, dtype=jnp.int32)
    cols = col0 + jnp.arange(bn, dtype=jnp.int32)
    start = offsets_ref[jnp.minimum(group, num_groups + 1)]
    end = offsets_ref[jnp.minimum(group + 1, num_groups + 1)]
    store_mask = ((rows >= start) & (rows < end))[:, None]
    if n % bn:
        store_mask = store_mask & (cols < n)[None, :]
    out_block = out_ref.at[pl.ds(row0, bm), pl.ds(col0, bn)]

    @pl.when(group < num_groups)
    def _compute():
        # Rows of other groups in this tile are computed and dropped by the store mask; only
        # rows past M must not be read.
        row_mask = (rows < m)[:, None] if m % bm else None

        def step(kb, acc):
            k0 = pl.multiple_of(kb * bk, bk)
            kcols = k0 + jnp.arange(bk, dtype=jnp.int32)
            lhs_mask = row_mask
            if k % bk:
                kmask = (kcols < k)[None, :]
                lhs_mask = kmask if lhs_mask is None else lhs_mask & kmask
            a = plgpu.load(
                lhs_ref.at[pl.ds(row0, bm), pl.ds(k0, bk)],
                mask=lhs_mask,
                other=0.0 if lhs_mask is not None else None,
            )
            if transpose_rhs:  # rhs is [G, N, K]: read a [bn, bk] block, contract its last dim.
                rhs_mask = None
                if n % bn:
                    rhs_mask = (cols < n)[:, None]
                if k % bk:
                    kmask = (kcols < k)[None, :]
                    rhs_mask = kmask if rhs_mask is None else rhs_mask & kmask
                b = plgpu.load(
                    rhs_ref.at[group, pl.ds(col0, bn), pl.ds(k0, bk)],
                    mask=rhs_mask,
                    other=0.0 if rhs_mask is not None else None,
                )
                prod = plgpu.dot(a, b, trans_b=True, precision=_dot_precision(a.dtype))
            else:  # rhs is [G, K, N]: a [bk, bn] block.
                rhs_mask = None
                if k % bk:
                    rhs_mask = (kcols < k)[:, None]
                if n % bn:
                    nmask = (cols < n)[None, :]
                    rhs_mask = nmask if rhs_mask is None else rhs_mask & nmask
                b = plgpu.load(
                    rhs_ref.at[group, pl.ds(k0, bk), pl.ds(col0, bn)],
                    mask=rhs_mask,
                    other=0.0 if rhs_mask is not None else None,
                )
                prod = plgpu.dot(a, b, precision=_dot_precision(a.dtype))
            return acc + prod

        acc = jax.lax.fori_loop(0, pl.cdiv(k, bk), step, jnp.zeros((bm, bn), jnp.float32))
        plgpu.store(out_block, acc.astype(out_ref.dtype), mask=store_mask)

    @pl.when(group == num_groups)
    def _zero_tail():  # rows at or past sum(group_sizes): GPU memory is uninitialised.
        plgpu.store(out_block, jnp.zeros((bm, bn), out_ref.dtype), mask=store_mask)


def _tgmm_kernel(
    offsets_ref,
    lhs_ref,
    rhs_ref,
    out_ref,
    *,
    cfg: TileConfig,
    num_k_tiles: int,
    num_n_tiles: int,
):
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    k = lhs_ref.shape[1]
    n = rhs_ref.shape[1]
    per_group = num_k_tiles * num_n_tiles
    pid = pl.program_id(0)
    group = pid // per_group
    k_tile, n_tile = swizzle(pid % per_group, num_k_tiles, num_n_tiles, cfg.group_swizzle)
    k0, col0 = k_tile * bk, n_tile * bn
    kcols = k0 + jnp.arange(bk, dtype=jnp.int32)
    cols = col0 + jnp.arange(bn, dtype=jnp.int32)
    start = offsets_ref[group]
    end = offsets_ref[group + 1]

    def step(i, acc):
        row0 = start + i * bm
        row_ok = (row0 + jnp.arange(bm, dtype=jnp.int32)) < end
        lhs_mask = row_ok[:, None]
        rhs_mask = row_ok[:, None]
        if k % bk:
            lhs_mask = lhs_mask & (kcols < k)[None, :]
        if n % bn:
            rhs_mask = rhs_mask & (cols < n)[None, :]
        a = plgpu.load(lhs_ref.at[pl.ds(row0, bm), pl.ds(k0, bk)], mask=lhs_mask, other=0.0)
        b = plgpu.load(rhs_ref.at[pl.ds(row0, bm), pl.ds(col0, bn)], mask=rhs_mask, other=0.0)
        return acc + plgpu.dot(a, b, trans_a=True, precision=_dot_precision(a.dtype))

    trips = pl.cdiv(end - start, bm)
    acc = jax.lax.fori_loop(0, trips, step, jnp.zeros((bk, bn), jnp.float32))
    out_mask = None
    if k % bk:
        out_mask = (kcols < k)[:, None]
    if n % bn:
        nmask = (cols < n)[None, :]
        out_mask = nmask if out_mask is None else out_mask & nmask
    plgpu.store(
        out_ref.at[group, pl.ds(k0, bk), pl.ds(col0, bn)], acc.astype(out_ref.dtype), mask=out_mask
    )


# --------------------------------------------------------------------------------------------------
# Wrappers: metadata, validation, pallas_call.
# --------------------------------------------------------------------------------------------------


# The operand dtypes the kernels take: Triton's dot with float32 accumulation. (A float64
# accumulator, under jax_enable_x64, does not lower.)
KERNEL_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def unsupported_reason(dtype) -> str | None:
    """Why the Triton kernels cannot take operands of ``dtype``, or ``None`` if they can. Any
    shape lowers: the blocks are powers of two (:func:`_fit`) and every edge is masked."""
    if jnp.dtype(dtype) not in KERNEL_DTYPES:
        names = ", ".join(str(d) for d in KERNEL_DTYPES)
        return f"operands are {jnp.dtype(dtype)}, not one of {names}"
    return None


def gmm(
    lhs: Array,
    rhs: Array,
    group_sizes: Array,
    *,
    transpose_rhs: bool = False,
    out_dtype=None,
    tiles: TileConfig | None = None,
    interpret: bool | None = None,
) -> Array:
    """``out[rows of g] = lhs[rows of g] @ rhs[g]`` (``rhs[g].T`` if transposed); zeros after.

    Args:
      lhs: ``[M, K]``.
      rhs: ``[G, K, N]``, or ``[G, N, K]`` with ``transpose_rhs``.
      group_sizes: ``[G]`` int32, summing to at most ``M``.
      transpose_rhs: read ``rhs[g]`` as ``[N, K]`` and use its transpose.
      out_dtype: result dtype (default ``lhs.dtype``).
      tiles: block sizes; default :func:`default_gmm_tiles`.
      interpret: run in Pallas interpret mode (default: when not on a GPU).

    Returns:
      ``[M, N]``.
    """
    check_gmm_operands(lhs, rhs, group_sizes, transpose_rhs, "gmm")
    return launch_gmm(
        lhs,
        rhs,
        group_sizes,
        transpose_rhs=transpose_rhs,
        out_dtype=out_dtype,
        tiles=tiles,
        interpret=interpret,
    )


def launch_gmm(lhs, rhs, group_sizes, *, transpose_rhs, out_dtype, tiles, interpret) -> Array:
    """:func:`gmm` on operands already checked (by the op's entry point, or :func:`gmm`)."""
    m, k = lhs.shape
    num_groups = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if m == 0 or n == 0:
        return jnp.zeros((m, n), out_dtype)
    cfg = tiles or default_gmm_tiles(m, k, n, num_groups, lhs.dtype)
    cfg = _fit(cfg, m, k, n)
    work_group, work_first_row, offsets = work_list.work_items(group_sizes, m, cfg.block_m)
    num_work = work_group.shape[0]
    num_n_tiles = pl.cdiv(n, cfg.block_n)
    kernel = functools.partial(
        _gmm_kernel,
        cfg=cfg,
        num_groups=num_groups,
        num_work=num_work,
        num_n_tiles=num_n_tiles,
        transpose_rhs=transpose_rhs,
    )
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
        grid=(num_work * num_n_tiles,),
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=use_interpret(interpret),
        name="jaxmoe_gmm",
    )
    with compat.quiet_triton_deprecation():
        return call(work_group, work_first_row, offsets, lhs, rhs)


def tgmm(
    lhs: Array,
    rhs: Array,
    group_sizes: Array,
    *,
    out_dtype=None,
    tiles: TileConfig | None = None,
    interpret: bool | None = None,
) -> Array:
    """``out[g] = lhs[rows of g]^T @ rhs[rows of g]`` for every group; zeros for empty groups.

    Args:
      lhs: ``[M, K]``.
      rhs: ``[M, N]``.
      group_sizes: ``[G]`` int32, summing to at most ``M``.
      out_dtype: result dtype (default ``lhs.dtype``).
      tiles: block sizes; default :func:`default_tgmm_tiles`.
      interpret: run in Pallas interpret mode (default: when not on a GPU).

    Returns:
      ``[G, K, N]``.
    """
    check_tgmm_operands(lhs, rhs, group_sizes)
    return launch_tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype, tiles=tiles, interpret=interpret)


def launch_tgmm(lhs, rhs, group_sizes, *, out_dtype, tiles, interpret) -> Array:
    """:func:`tgmm` on operands already checked (by the op's entry point, or :func:`tgmm`)."""
    m, k = lhs.shape
    n = rhs.shape[1]
    num_groups = group_sizes.shape[0]
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if m == 0 or k == 0 or n == 0 or num_groups == 0:
        return jnp.zeros((num_groups, k, n), out_dtype)
    cfg = tiles or default_tgmm_tiles(m, k, n, num_groups, lhs.dtype)
    cfg = _fit(cfg, m, k, n)
    offsets = jnp.concatenate(
        [jnp.zeros((1,), jnp.int32), jnp.cumsum(group_sizes, dtype=jnp.int32)]
    )
    num_k_tiles, num_n_tiles = pl.cdiv(k, cfg.block_k), pl.cdiv(n, cfg.block_n)
    kernel = functools.partial(
        _tgmm_kernel, cfg=cfg, num_k_tiles=num_k_tiles, num_n_tiles=num_n_tiles
    )
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
        grid=(num_groups * num_k_tiles * num_n_tiles,),
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=use_interpret(interpret),
        name="jaxmoe_tgmm",
    )
    with compat.quiet_triton_deprecation():
        return call(offsets, lhs, rhs)


@dataclasses.dataclass(frozen=True)
class PallasTritonGroupedMatmul(GroupedMatmulBackend):
    """Grouped matmul by Pallas kernels on the Triton backend (GPU; interpret mode elsewhere).

    Attributes:
      gmm_tiles: block sizes of the forward/dgrad kernel; ``None`` picks them per shape with
        :func:`default_gmm_tiles` (a table measured on an H100).
      tgmm_tiles: block sizes of the weight-gradient kernel; ``None``: :func:`default_tgmm_tiles`.
      interpret: ``None`` runs interpret mode when JAX's default backend is not a GPU.
    """

    supports_check_vma: ClassVar[bool] = False  # Pallas outputs carry no vma types
    name: str = dataclasses.field(default="pallas_triton", init=False)
    gmm_tiles: TileConfig | None = None
    tgmm_tiles: TileConfig | None = None
    interpret: bool | None = None

    def _refuse(self, lhs, what: str) -> None:
        reason = unsupported_reason(lhs.dtype)
        if reason is not None:
            raise NotImplementedError(
                f"grouped_matmul backend 'pallas_triton' ({what}): {reason}. Use backend="
                "'xla', or 'auto', which takes XLA wherever the Pallas kernels do not apply."
            )

    def gmm(self, lhs, rhs, group_sizes, *, transpose_rhs, out_dtype):
        self._refuse(lhs, "gmm")
        return launch_gmm(
            lhs,
            rhs,
            group_sizes,
            transpose_rhs=transpose_rhs,
            out_dtype=out_dtype,
            tiles=self.gmm_tiles,
            interpret=self.interpret,
        )

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        self._refuse(lhs, "tgmm")
        return launch_tgmm(
            lhs,
            rhs,
            group_sizes,
            out_dtype=out_dtype,
            tiles=self.tgmm_tiles,
            interpret=self.interpret,
        )
