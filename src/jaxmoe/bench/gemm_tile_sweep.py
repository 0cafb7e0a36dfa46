"""Tile sweep of the Pallas Triton kernels: how the tile tables of ``pallas_triton.py`` came.

``jaxmoe bench gemm --tune ROUND`` times each candidate ``TileConfig`` of round ``ROUND`` (see
:data:`TUNE_ROUNDS`) on balanced groups, after checking it against the per-group reference.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxmoe.bench import gemm_cases
from jaxmoe.bench.gemm import REL_TOL, group_sizes_for
from jaxmoe.bench.harness import relative_error
from jaxmoe.bench.presets import GEMM_SHAPES, GemmShape
from jaxmoe.bench.timing import time_jax
from jaxmoe.ops.grouped_matmul import pallas_triton as pt

TUNE_ROUNDS = ("1", "2", "3")
COLUMNS = (
    ("shape", "shape", ""),
    ("kernel", "kernel", ""),
    ("tiles", "tiles", ""),
    ("ms", "ms", "{:.3f}"),
    ("tflops", "TFLOP/s", "{:.1f}"),
    ("rel_err", "rel err", "{:.1e}"),
)


def tune_candidates(round_: str) -> dict[str, list[pt.TileConfig]]:
    """Tile configs of a sweep round (1: large shapes; 2: qwen3, swizzle; 3: qwen3 K/stages)."""
    T = pt.TileConfig
    if round_ == "1":
        fwd = [T(128, 256, 64, 8, 4), T(128, 256, 64, 8, 3), T(128, 128, 64, 4, 4)]
        fwd += [T(256, 128, 64, 8, 4), T(128, 128, 128, 8, 3)]
        tg = [T(64, 256, 128, 8, 3), T(64, 128, 128, 4, 4), T(128, 128, 128, 8, 3)]
        tg += [T(64, 256, 128, 8, 4), T(32, 128, 256, 8, 4)]
        return {"gmm": fwd, "dgrad": fwd, "tgmm": tg}
    if round_ == "3":  # qwen3: short K or N (768), 128 groups of 512 rows
        fwd = [T(128, 256, 64, 8, 3, 4), T(128, 256, 64, 8, 4, 4), T(128, 256, 128, 8, 2, 4)]
        fwd += [T(256, 128, 64, 8, 3, 4), T(256, 128, 64, 8, 4, 4), T(256, 128, 128, 8, 2, 4)]
        fwd += [T(128, 128, 128, 4, 3, 4), T(128, 128, 64, 4, 3, 4), T(128, 128, 64, 8, 3, 4)]
        fwd += [T(128, 256, 64, 8, 3, 1), T(128, 256, 32, 8, 5, 4), T(64, 256, 128, 4, 3, 4)]
        tg = [T(64, 256, 128, 8, 4), T(64, 256, 128, 8, 3), T(32, 256, 128, 8, 4)]
        tg += [T(128, 128, 128, 8, 3), T(128, 256, 128, 8, 2)]
        return {"gmm": fwd, "dgrad": fwd, "tgmm": tg}
    fwd = [T(128, 256, 64, 8, 3), T(128, 256, 64, 8, 3, 4), T(128, 256, 64, 8, 3, 16)]
    fwd += [T(128, 128, 64, 8, 4), T(64, 256, 64, 4, 4)]
    tg = [T(64, 256, 128, 8, 4), T(128, 256, 128, 8, 3), T(128, 128, 128, 8, 4)]
    tg += [T(64, 256, 128, 8, 4, 4), T(64, 128, 256, 8, 4)]
    return {"gmm": fwd, "dgrad": fwd, "tgmm": tg}


def sweep_pallas_tiles(
    shapes: Iterable[str | GemmShape],
    candidates: dict[str, Sequence[Any]],
    *,
    dtype: str = "bfloat16",
    repeats: int = 10,
    time_budget_s: float = 1e9,
    log: Callable[[str], None] = print,
    on_row: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Times each candidate ``TileConfig`` of each Pallas kernel on balanced groups.

    ``candidates`` maps ``"gmm"`` (forward), ``"dgrad"`` (gmm with rhs transposed) and ``"tgmm"``
    to configs. Each result is checked against the per-group reference first.
    """
    t_start = time.perf_counter()
    rows = []
    for shape in [GEMM_SHAPES[s] if isinstance(s, str) else s for s in shapes]:
        sizes = group_sizes_for(shape, "balanced")
        x, w, dy = gemm_cases.jax_inputs(shape, jnp.dtype(dtype), 0)
        gs = jnp.asarray(sizes)
        ref = gemm_cases.jax_reference(x, w, dy, sizes)
        for kernel, cfgs in candidates.items():
            for cfg in cfgs:
                if time.perf_counter() - t_start > time_budget_s:
                    log("sweep: time budget spent, stopping")
                    return rows
                if kernel == "gmm":
                    fn = jax.jit(lambda x, w, gs, c=cfg: pt.gmm(x, w, gs, tiles=c))
                    args, want = (x, w, gs), ref[0]
                elif kernel == "dgrad":
                    fn = jax.jit(
                        lambda d, w, gs, c=cfg: pt.gmm(d, w, gs, transpose_rhs=True, tiles=c)
                    )
                    args, want = (dy, w, gs), ref[1]
                else:
                    fn = jax.jit(lambda x, d, gs, c=cfg: pt.tgmm(x, d, gs, tiles=c))
                    args, want = (x, dy, gs), ref[2]
                c = dataclasses.asdict(cfg)
                row = {
                    "shape": shape.name,
                    "kernel": kernel,
                    "config": c,
                    "tiles": f"{c['block_m']}x{c['block_n']}x{c['block_k']} "
                    f"w{c['num_warps']} s{c['num_stages']} g{c['group_swizzle']}",
                    "ms": None,
                }
                try:
                    err = relative_error(fn(*args).astype(jnp.float32), want)
                    row["rel_err"] = err
                    if not err <= REL_TOL[dtype]:
                        raise AssertionError(f"wrong result: rel err {err:.3g}")
                    t = time_jax(fn, *args, repeats=repeats)
                    row["ms"] = t.median_ms
                    row["tflops"] = shape.flops / (t.median_ms * 1e-3) / 1e12
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                res = row.get("error") or f"{row['ms']:.3f} ms {row['tflops']:.0f} TF"
                log(f"{shape.name:>13} {kernel:>6} {row['tiles']:>28}  {res}")
                if on_row is not None:
                    on_row(rows)
        del x, w, dy, ref
    return rows
