"""Probe (issue 3): jaxmoe's Mosaic GPU ``gmm`` against its Triton ``gmm`` and torch, on one GPU.

For each benchmark shape (balanced groups) and each Mosaic tile config: the forward
``x @ w[g]`` and the dgrad ``dy @ w[g]^T`` are checked against the Triton kernel's result (itself
checked against a dense reference by ``benchmarks/grouped_matmul.py``) and timed, next to the
Triton kernel and ``torch._grouped_mm``'s forward. One shape is also checked with skewed groups
that leave 77 rows past the sum (tile-straddling groups, empty groups, the zero tail).

    python benchmarks/mosaic_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--shapes", default="qwen3-up,qwen3-down,dsv3-up,dsv3-down,mixtral-up,mixtral-down"
    )
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--time-budget-s", type=float, default=400)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    from jaxmoe.bench.gemm import group_sizes_for
    from jaxmoe.bench.presets import GEMM_SHAPES
    from jaxmoe.bench.timing import time_jax, time_torch
    from jaxmoe.ops.grouped_matmul import pallas_mosaic, pallas_triton

    start = time.time()
    rows: list[dict] = []
    path = os.path.join(args.out_dir, "mosaic-probe.json")

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(path, "w") as f:
            json.dump(
                {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "rows": rows},
                f,
                indent=1,
            )

    def mosaic_fn(transpose, tiles):
        return jax.jit(functools.partial(pallas_mosaic.gmm, transpose_rhs=transpose, tiles=tiles))

    def triton_fn(transpose):
        return jax.jit(functools.partial(pallas_triton.gmm, transpose_rhs=transpose))

    cfg = pallas_mosaic.MosaicTileConfig
    variants = {
        "s3": cfg(128, 256, 64, 3, 8),
        "s4e64": cfg(128, 256, 64, 4, 8, epilogue_rows=64),
        "s4e64chain": cfg(128, 256, 64, 4, 8, pipelined_tiles=True, epilogue_rows=64),
        "s4e32chain": cfg(128, 256, 64, 4, 8, pipelined_tiles=True, epilogue_rows=32),
        "s2chain": cfg(128, 256, 64, 2, 8, pipelined_tiles=True),
        "s3chain": cfg(128, 256, 64, 3, 8, pipelined_tiles=True),
    }

    def rel(a, b):
        a = jnp.asarray(a, jnp.float32)
        b = jnp.asarray(b, jnp.float32)
        return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))

    # Exactness on group boundaries: skewed sizes, some empty, 77 rows past the sum.
    shape = GEMM_SHAPES["qwen3-down"]
    sizes = group_sizes_for(shape, "skewed").astype(np.int64)
    sizes[np.argmax(sizes)] -= 77
    kx, kw = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (shape.m, shape.k), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (shape.groups, shape.k, shape.n)) / math.sqrt(shape.k)).astype(
        jnp.bfloat16
    )
    gs = jnp.asarray(sizes, jnp.int32)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for name, tiles in variants.items():
        for transpose in (False, True):
            try:
                rhs = w  # dgrad reads w[g] [K, N] as its transpose: dy[M, N] @ w[g]^T.
                lhs = (
                    jax.random.normal(kx, (shape.m, shape.n)).astype(jnp.bfloat16)
                    if transpose
                    else x
                )
                want = pallas_triton.gmm(lhs, rhs, gs, transpose_rhs=transpose)
                got = mosaic_fn(transpose, tiles)(lhs, rhs, gs)
                tail = float(jnp.max(jnp.abs(got[int(bounds[-1]) :].astype(jnp.float32))))
                emit(
                    {
                        "check": "skewed+tail",
                        "variant": name,
                        "transpose": transpose,
                        "rel_err_vs_triton": rel(got, want),
                        "tail_max_abs": tail,
                        "nonfinite": int(jnp.sum(~jnp.isfinite(got.astype(jnp.float32)))),
                    }
                )
            except Exception as e:  # noqa: BLE001 - a probe records every failure and goes on
                emit(
                    {
                        "check": "skewed+tail",
                        "variant": name,
                        "transpose": transpose,
                        "error": repr(e)[:400],
                    }
                )

    import torch

    for shape_name in args.shapes.split(","):
        shape = GEMM_SHAPES[shape_name]
        sizes = group_sizes_for(shape, "balanced")
        gs = jnp.asarray(sizes)
        x = jax.random.normal(kx, (shape.m, shape.k), jnp.float32).astype(jnp.bfloat16)
        dy = jax.random.normal(kx, (shape.m, shape.n), jnp.float32).astype(jnp.bfloat16)
        w = (jax.random.normal(kw, (shape.groups, shape.k, shape.n)) / math.sqrt(shape.k)).astype(
            jnp.bfloat16
        )
        flops = 2 * shape.m * shape.k * shape.n

        def row(impl, op, t, err=None, shape_name=shape_name, flops=flops):
            emit(
                {
                    "shape": shape_name,
                    "op": op,
                    "impl": impl,
                    "ms": t.median_ms,
                    "tflops": flops / t.median_ms / 1e9,
                    "rel_err_vs_triton": err,
                }
            )

        # torch forward, w as the transpose of [G, N, K].
        tx = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.bfloat16)
        tw = torch.randn(shape.groups, shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
        offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
        torch_fwd = functools.partial(torch._grouped_mm, tx, tw.transpose(-2, -1), offs=offs)
        row("torch", "fwd", time_torch(torch_fwd))
        del tx, tw, torch_fwd
        torch.cuda.empty_cache()

        for op in ("fwd", "dgrad"):
            transpose = op == "dgrad"
            lhs, rhs = (dy, w) if transpose else (x, w)
            fn = triton_fn(transpose)
            want = fn(lhs, rhs, gs)
            row("triton", op, time_jax(fn, lhs, rhs, gs))
            for name, tiles in variants.items():
                if time.time() - start > args.time_budget_s:
                    emit({"budget": "stopped", "at": [shape_name, op, name]})
                    return
                try:
                    fn = mosaic_fn(transpose, tiles)
                    err = rel(fn(lhs, rhs, gs), want)
                    row(name, op, time_jax(fn, lhs, rhs, gs), err)
                except Exception as e:  # noqa: BLE001
                    emit({"shape": shape_name, "op": op, "impl": name, "error": repr(e)[:400]})


if __name__ == "__main__":
    main()
