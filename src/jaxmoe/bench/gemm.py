"""Grouped-matmul benchmark: jaxmoe's Pallas kernel against ``jax.lax.ragged_dot`` and
``torch._grouped_mm``, forward and forward+backward, balanced and skewed routing.

Every implementation's outputs (and gradients) are checked against a per-group dense reference
before it is timed. TFLOP/s count useful FLOPs only: ``2*M*K*N`` forward, three times that for
forward+backward (dgrad and wgrad), whatever an implementation actually computes.

Typical use (what ``benchmarks/grouped_matmul.py`` does)::

    rows = run_gemm_benchmark(["mixtral-up"], impls=["jaxmoe", "torch"])
    write_results(rows, benchmark_header("..."), "benchmarks/results", "grouped_matmul-h100")
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from jaxmoe.bench.presets import GEMM_SHAPES, GemmShape
from jaxmoe.bench.timing import Timing, time_jax, time_torch

IMPLS = ("torch", "jaxmoe", "jaxmoe_triton", "xla_ragged_dot", "jax_mosaic")
IMPL_LABELS = {
    "jaxmoe": "jaxmoe backend='pallas' (Mosaic GPU fwd/dgrad, Triton wgrad)",
    "jaxmoe_triton": "jaxmoe backend='pallas_triton' (Triton kernels only)",
    "xla_ragged_dot": "jax.lax.ragged_dot (jaxmoe backend='xla')",
    "jax_mosaic": "jax's own Mosaic GPU ragged_dot kernels (peer, GPU only)",
    "torch": "torch._grouped_mm",
}
ROUTINGS = ("balanced", "skewed")
PASSES = ("fwd", "fwd+bwd")
SKEW_ALPHA = 0.3
# bf16 operands, float32 accumulation, bf16 result: rounding alone gives ~3e-3.
REL_TOL = {"bfloat16": 1e-2, "float32": 1e-4}


def group_sizes_for(shape: GemmShape, routing: str, seed: int = 0) -> np.ndarray:
    """``[G]`` int32 sizes summing to ``M``: equal (``balanced``) or Dirichlet(0.3) (``skewed``)."""
    m, g = shape.m, shape.groups
    if routing == "balanced":
        sizes = np.full(g, m // g, np.int64)
        sizes[: m % g] += 1
    elif routing == "skewed":
        rng = np.random.default_rng(seed)
        sizes = rng.multinomial(m, rng.dirichlet(np.full(g, SKEW_ALPHA)))
    else:
        raise ValueError(f"unknown `routing` {routing!r}; choose from {ROUTINGS}")
    assert sizes.sum() == m
    return sizes.astype(np.int32)


def _rel_err(out, ref) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


# --------------------------------------------------------------------------------------------------
# JAX cases.
# --------------------------------------------------------------------------------------------------


def _jax_inputs(shape: GemmShape, dtype, seed: int):
    import jax
    import jax.numpy as jnp

    kx, kw, kd = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (shape.m, shape.k), jnp.float32).astype(dtype)
    w = (jax.random.normal(kw, (shape.groups, shape.k, shape.n)) / math.sqrt(shape.k)).astype(dtype)
    dy = jax.random.normal(kd, (shape.m, shape.n), jnp.float32).astype(dtype)
    return x, w, dy


def _jax_reference(x, w, dy, sizes: np.ndarray):
    """Per-group dense products in float32 (group sizes static), plus zero rows past the end."""
    return _jax_reference_fn(tuple(int(s) for s in sizes))(x, w, dy)


@functools.lru_cache(maxsize=8)
def _jax_reference_fn(sizes: tuple[int, ...]):
    """Float32 per-group products as one batched einsum over groups padded to the largest.

    Group sizes are static here, so the padding is numpy index arithmetic; padded rows are zeros
    and add nothing to ``dw``. (One small dot per group compiled for minutes with 128 groups.)
    """
    import jax
    import jax.numpy as jnp

    sizes_np = np.asarray(sizes, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes_np)])
    num_groups, longest = len(sizes), max(1, int(sizes_np.max(initial=0)))
    position = np.arange(longest)
    padded_row = bounds[:-1, None] + position[None, :]  # [G, longest] source row
    padded_valid = position[None, :] < sizes_np[:, None]
    padded_row = np.where(padded_valid, padded_row, 0)

    @jax.jit
    def ref(x, w, dy):
        f32 = jnp.float32
        total = x.shape[0]
        # Each real row's (group, position) in the padded layout; tail rows read a zero.
        row_group = np.searchsorted(bounds[1:], np.arange(total), side="right")
        real = row_group < num_groups
        row_group = np.minimum(row_group, num_groups - 1)
        row_position = np.where(real, np.arange(total) - bounds[row_group], 0)

        def pad(a):
            return jnp.where(padded_valid[..., None], a[padded_row].astype(f32), 0.0)

        x_pad, dy_pad, w32 = pad(x), pad(dy), w.astype(f32)
        hi = jax.lax.Precision.HIGHEST
        out = jnp.einsum("gmk,gkn->gmn", x_pad, w32, precision=hi)
        dx = jnp.einsum("gmn,gkn->gmk", dy_pad, w32, precision=hi)
        dw = jnp.einsum("gmk,gmn->gkn", x_pad, dy_pad, precision=hi)

        def unpad(a):
            return jnp.where(real[:, None], a[row_group, row_position], 0.0)

        return unpad(out), unpad(dx), dw

    return ref


@functools.cache
def _jax_fn(backend, pass_: str):
    """One jitted function per (backend, pass): group sizes are traced, so routings share it."""
    import jax

    from jaxmoe.ops.grouped_matmul import api

    if pass_ == "fwd":
        return jax.jit(lambda x, w, gs: api.grouped_matmul(x, w, gs, backend=backend))

    def fwd_bwd(x, w, gs, dy):
        out, vjp = jax.vjp(lambda a, b: api.grouped_matmul(a, b, gs, backend=backend), x, w)
        dx, dw = vjp(dy)
        return out, dx, dw

    return jax.jit(fwd_bwd)


def _jax_case(impl: str, backend, shape: GemmShape, sizes: np.ndarray, pass_: str, dtype, seed):
    import jax.numpy as jnp

    if impl == "jaxmoe":
        backend = backend or "pallas"
    elif impl == "jaxmoe_triton":
        backend = "pallas_triton"
    elif impl == "xla_ragged_dot":
        backend = "xla"
    elif impl == "jax_mosaic":
        backend = _jax_mosaic_peer()
    else:
        raise ValueError(f"not a jax impl: {impl}")

    x, w, dy = _jax_inputs(shape, dtype, seed)
    gs = jnp.asarray(sizes)
    fn = _jax_fn(backend, pass_)
    args = (x, w, gs) if pass_ == "fwd" else (x, w, gs, dy)

    def check() -> float:
        got = fn(*args)
        ref = _jax_reference(x, w, dy, sizes)
        if pass_ == "fwd":
            return _rel_err(got.astype(jnp.float32), ref[0])
        return max(_rel_err(a.astype(jnp.float32), b) for a, b in zip(got, ref, strict=True))

    return fn, args, check, time_jax


def _jax_mosaic_peer():
    """A peer, not a jaxmoe backend: the Hopper Mosaic GPU kernels that ship with jax
    (``jax.experimental.pallas.ops.gpu.ragged_dot_mgpu`` / ``transposed_ragged_dot_mgpu``),
    wrapped in jaxmoe's backend interface so that the same custom VJP drives them. Fixed tiles
    (128x128x64, 4 stages); measured to see what Mosaic GPU reaches on these shapes."""
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu

    from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend

    def grid_block_n(n, block_n):
        tiles = n // block_n
        return 2 if tiles % 2 == 0 else 1

    @dataclasses.dataclass(frozen=True)
    class JaxMosaicPeer(GroupedMatmulBackend):
        name: str = dataclasses.field(default="jax_mosaic", init=False)

        def gmm(self, lhs, rhs, group_sizes, *, transpose_rhs, out_dtype):
            n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
            out = ragged_dot_mgpu.ragged_dot(
                lhs,
                rhs,
                group_sizes=group_sizes,
                block_m=128,
                block_n=128,
                block_k=64,
                max_concurrent_steps=4,
                grid_block_n=grid_block_n(n, 128),
                transpose_rhs=transpose_rhs,
            )
            return out.astype(out_dtype)

        def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
            out = transposed_ragged_dot_mgpu.transposed_ragged_dot(
                lhs,
                rhs,
                group_sizes=group_sizes,
                block_m=128,
                block_n=128,
                block_k=64,
                max_concurrent_steps=4,
                grid_block_n=grid_block_n(rhs.shape[1], 128),
            )
            return out.astype(out_dtype)

    return JaxMosaicPeer()


# --------------------------------------------------------------------------------------------------
# torch case.
# --------------------------------------------------------------------------------------------------


def _torch_case(shape: GemmShape, sizes: np.ndarray, pass_: str, dtype_name: str, seed: int):
    import torch

    torch.manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    dev = "cuda"
    x = torch.randn(shape.m, shape.k, device=dev, dtype=dtype)
    # w laid out [G, K, N] as the transpose of a [G, N, K] tensor (torch's fast layout).
    w_nk = (torch.randn(shape.groups, shape.n, shape.k, device=dev) / math.sqrt(shape.k)).to(dtype)
    dy = torch.randn(shape.m, shape.n, device=dev, dtype=dtype)
    offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device=dev)

    if pass_ == "fwd":

        def fn():
            return torch._grouped_mm(x, w_nk.transpose(-2, -1), offs=offs)
    else:
        x.requires_grad_(True)
        w_nk.requires_grad_(True)

        def fn():
            out = torch._grouped_mm(x, w_nk.transpose(-2, -1), offs=offs)
            dx, dw_nk = torch.autograd.grad(out, (x, w_nk), dy)
            return out, dx, dw_nk

    def check() -> float:
        got = fn()
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        with torch.no_grad():
            xf, wf, dyf = x.float(), w_nk.float().transpose(-2, -1), dy.float()
            ref_out = torch.cat(
                [
                    xf[s:e] @ wf[g]
                    for g, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
                ]
            )

            def err(a, b):
                return float(torch.linalg.norm(a.float() - b) / torch.linalg.norm(b))

            if pass_ == "fwd":
                return err(got, ref_out)
            out, dx, dw_nk = got
            ref_dx = torch.cat(
                [
                    dyf[s:e] @ wf[g].T
                    for g, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
                ]
            )
            ref_dw = torch.stack(
                [(xf[s:e].T @ dyf[s:e]).T for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
            )  # [G, N, K] like dw_nk
            return max(err(out, ref_out), err(dx, ref_dx), err(dw_nk, ref_dw))

    return fn, (), check, time_torch


# --------------------------------------------------------------------------------------------------
# The benchmark.
# --------------------------------------------------------------------------------------------------


def _release_torch_memory():
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - torch absent or without CUDA: nothing to release
        pass


def torch_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available()) and hasattr(torch, "_grouped_mm")
    except Exception:  # noqa: BLE001
        return False


def run_gemm_benchmark(
    shapes: Iterable[str | GemmShape] = tuple(k for k in GEMM_SHAPES if k != "tiny"),
    impls: Sequence[str] = IMPLS,
    routings: Sequence[str] = ROUTINGS,
    passes: Sequence[str] = PASSES,
    repeats: int = 10,
    *,
    dtype: str = "bfloat16",
    seed: int = 0,
    slow_impl_repeats: int = 3,
    jaxmoe_backend=None,
    log: Callable[[str], None] = print,
    on_row: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Checks then times every (shape, pass, routing, impl); returns one row per combination.

    Runs torch first over all shapes and frees its cache, then the JAX impls (so that the two
    frameworks' memory pools do not fight). A failure (e.g. out of memory) becomes a row with
    ``"error"`` and the run goes on. ``on_row(rows)`` is called after every row (e.g. to save
    partial results, so that a run cut short keeps what it measured). ``xla_ragged_dot`` gets
    ``slow_impl_repeats`` timed runs when one call takes over 50 ms.

    Returns:
      rows ``{"shape", "pass", "routing", "impl", "ms", "tflops", "ratio_vs_torch", ...}`` where
      ``ratio_vs_torch`` is torch's ms over this impl's ms for the same (shape, pass, routing).
    """
    import jax.numpy as jnp

    shapes = [GEMM_SHAPES[s] if isinstance(s, str) else s for s in shapes]
    for name in impls:
        if name not in IMPLS:
            raise ValueError(f"unknown `impls` entry {name!r}; choose from {IMPLS}")
    order = [i for i in IMPLS if i in impls]
    if "torch" in order and not torch_available():
        log("torch with CUDA and torch._grouped_mm not importable: skipping torch")
        order.remove("torch")
    rows: list[dict[str, Any]] = []
    for impl in order:
        for shape in shapes:
            for routing in routings:
                sizes = group_sizes_for(shape, routing, seed)
                for pass_ in passes:
                    row = {
                        "shape": shape.name,
                        "pass": pass_,
                        "routing": routing,
                        "impl": impl,
                        "m": shape.m,
                        "k": shape.k,
                        "n": shape.n,
                        "groups": shape.groups,
                        "ms": None,
                        "tflops": None,
                        "ratio_vs_torch": None,
                    }
                    flops = shape.flops * (1 if pass_ == "fwd" else 3)
                    fn = args = check = None
                    try:
                        if impl == "torch":
                            fn, args, check, timer = _torch_case(shape, sizes, pass_, dtype, seed)
                        else:
                            fn, args, check, timer = _jax_case(
                                impl, jaxmoe_backend, shape, sizes, pass_, jnp.dtype(dtype), seed
                            )
                        err = check()
                        row["rel_err"] = err
                        if not err <= REL_TOL[dtype]:
                            raise AssertionError(f"wrong result: rel err {err:.3g}")
                        n_rep = repeats
                        if impl == "xla_ragged_dot":
                            one = timer(fn, *args, warmup=1, repeats=1, max_inner=1)
                            if one.median_ms > 50:
                                n_rep = slow_impl_repeats
                        t: Timing = timer(fn, *args, repeats=n_rep, warmup=1 if n_rep < 10 else 3)
                        row["ms"] = t.median_ms
                        row["tflops"] = flops / (t.median_ms * 1e-3) / 1e12
                        row["timing"] = t.as_dict()
                    except Exception as e:  # noqa: BLE001 - record and go on (OOM, slow impls)
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    rows.append(row)
                    log(_row_line(row))
                    if on_row is not None:
                        on_row(rows)
                    del fn, args, check
        if impl == "torch":
            _release_torch_memory()
    fill_ratios(rows)
    return rows


def fill_ratios(rows):
    """Sets each row's ``ratio_vs_torch`` (torch ms / its ms) where torch has the same case."""
    torch_ms = {
        (r["shape"], r["pass"], r["routing"]): r["ms"]
        for r in rows
        if r["impl"] == "torch" and r["ms"]
    }
    for r in rows:
        base = torch_ms.get((r["shape"], r["pass"], r["routing"]))
        if base and r["ms"]:
            r["ratio_vs_torch"] = base / r["ms"]


def _row_line(r) -> str:
    if r.get("error"):
        return (
            f"{r['shape']:>13} {r['pass']:>8} {r['routing']:>9} {r['impl']:>15}  ERROR {r['error']}"
        )
    return (
        f"{r['shape']:>13} {r['pass']:>8} {r['routing']:>9} {r['impl']:>15} "
        f"{r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s  err {r.get('rel_err', 0):.1e}"
    )


def benchmark_header(command: str) -> dict[str, Any]:
    """Where and how the numbers were taken: device, versions, date, the command."""
    import jax

    header = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "torch": None,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "flops": "useful only: fwd 2*M*K*N, fwd+bwd 3x that",
        "timing": "median ms per call over >= 10 samples after warm-up (ragged_dot: 3 "
        "when one call > 50 ms); each sample = several back-to-back calls then a device sync",
        "impls": IMPL_LABELS,
    }
    try:
        import torch

        header["torch"] = torch.__version__
    except Exception:  # noqa: BLE001
        pass
    return header


def markdown_table(rows: Sequence[dict[str, Any]], header: dict[str, Any] | None = None) -> str:
    """One table per routing: shape x pass, TFLOP/s per impl and jaxmoe's ratio against torch."""
    lines = []
    if header:
        lines.append(
            f"Device: {header['device']}; jax {header['jax']}; torch {header['torch']}; "
            f"{header['date']}."
        )
        lines.append(f"Command: `{header['command']}`")
        lines.append(f"FLOPs: {header['flops']}. Timing: {header['timing']}.")
        if header.get("note"):
            lines.append(f"Note: {header['note']}")
        lines.append("")
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    for routing in [r for r in ROUTINGS if any(x["routing"] == r for x in rows)]:
        lines.append(f"### {routing} groups")
        lines.append("")
        cols = " | ".join(f"{IMPL_LABELS[i]} ms (TFLOP/s)" for i in impls)
        lines.append(f"| shape (M, K, N, G) | pass | {cols} | jaxmoe / torch |")
        lines.append("|---" * (3 + len(impls)) + "|")
        keys = []
        for r in rows:
            if r["routing"] == routing and (r["shape"], r["pass"]) not in keys:
                keys.append((r["shape"], r["pass"]))
        for shape, pass_ in keys:
            cells = []
            ratio = ""
            dims = ""
            for i in impls:
                match = [
                    r
                    for r in rows
                    if (r["shape"], r["pass"], r["routing"], r["impl"])
                    == (shape, pass_, routing, i)
                ]
                if not match:
                    cells.append("-")
                    continue
                r = match[0]
                dims = f"({r['m']}, {r['k']}, {r['n']}, {r['groups']})"
                if r.get("error"):
                    cells.append(f"error: {r['error'][:60]}")
                else:
                    cells.append(f"{r['ms']:.3f} ({r['tflops']:.0f})")
                if i == "jaxmoe" and r.get("ratio_vs_torch"):
                    ratio = f"{r['ratio_vs_torch']:.2f}x"
            lines.append(f"| {shape} {dims} | {pass_} | " + " | ".join(cells) + f" | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def write_results(
    rows: Sequence[dict[str, Any]], header: dict[str, Any], out_dir: str, stem: str
) -> tuple[str, str]:
    """Writes ``{stem}.json`` (``{"header": ..., "rows": [...]}``) and ``{stem}.md``."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, f"{stem}.json")
    md_path = os.path.join(out_dir, f"{stem}.md")
    with open(json_path, "w") as f:
        json.dump({"header": header, "rows": list(rows)}, f, indent=1)
    with open(md_path, "w") as f:
        f.write(f"# Grouped matmul benchmark ({header['device']})\n\n")
        f.write(markdown_table(rows, header))
    return json_path, md_path


# --------------------------------------------------------------------------------------------------
# Tile sweep (how the tables in pallas_triton.py were measured).
# --------------------------------------------------------------------------------------------------


def sweep_pallas_tiles(
    shapes: Iterable[str | GemmShape],
    candidates: dict[str, Sequence[Any]],
    *,
    dtype: str = "bfloat16",
    repeats: int = 10,
    time_budget_s: float = 1e9,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Times each candidate ``TileConfig`` of each Pallas kernel on balanced groups.

    ``candidates`` maps ``"gmm"`` (forward), ``"dgrad"`` (gmm with rhs transposed) and ``"tgmm"``
    to configs. Each result is checked against the per-group reference first.
    """
    import jax
    import jax.numpy as jnp

    from jaxmoe.ops.grouped_matmul import pallas_triton as pt

    t_start = time.perf_counter()
    rows = []
    for shape in [GEMM_SHAPES[s] if isinstance(s, str) else s for s in shapes]:
        sizes = group_sizes_for(shape, "balanced")
        x, w, dy = _jax_inputs(shape, jnp.dtype(dtype), 0)
        gs = jnp.asarray(sizes)
        ref = _jax_reference(x, w, dy, sizes)
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
                row = {"shape": shape.name, "kernel": kernel, "config": dataclasses.asdict(cfg)}
                try:
                    err = _rel_err(fn(*args).astype(jnp.float32), want)
                    row["rel_err"] = err
                    if not err <= REL_TOL[dtype]:
                        raise AssertionError(f"wrong result: rel err {err:.3g}")
                    t = time_jax(fn, *args, repeats=repeats)
                    row["ms"] = t.median_ms
                    row["tflops"] = shape.flops / (t.median_ms * 1e-3) / 1e12
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                c = row["config"]
                desc = (
                    f"{c['block_m']}x{c['block_n']}x{c['block_k']} w{c['num_warps']} "
                    f"s{c['num_stages']} g{c['group_swizzle']}"
                )
                res = row.get("error") or f"{row['ms']:.3f} ms {row['tflops']:.0f} TF"
                log(f"{shape.name:>13} {kernel:>6} {desc:>28}  {res}")
        del x, w, dy, ref
    return rows
