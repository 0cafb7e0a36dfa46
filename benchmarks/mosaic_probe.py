"""Probe (issue 15): jaxmoe's Mosaic GPU ``gmm`` against its Triton ``gmm`` and torch, on one GPU.

One device call, three phases, each row written to ``$OUT/mosaic-probe.json`` as it comes:

1. smoke: every tile variant, fwd and dgrad, on a small skewed problem against a float32
   reference (stops the call early if no variant compiles; tracebacks in ``mosaic-errors.log``);
2. exactness: the default tiles on all six shapes, balanced and skewed (Dirichlet 0.3, two groups
   forced empty, 77 rows past the sum), fwd and dgrad, against a float32 reference computed by
   XLA (HIGHEST precision, one dot per (group, 128-row tile)), next to the Triton kernel's error.
   The output buffer is poisoned (NaN) before each call; tail rows must be exactly zero;
3. timing (balanced; skewed with ``--time-routing skewed``): ``torch._grouped_mm``, the Triton
   ``gmm`` and each Mosaic tile variant, fwd (``x @ w[g]``) and dgrad (``dy @ w[g]^T``),
   interleaved per shape; torch's forward is timed again at the end of each shape to show the
   run's spread.

    PYTHONPATH=src python benchmarks/mosaic_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import subprocess
import sys
import time
import traceback

import numpy as np

SHAPES = "qwen3-up,qwen3-down,dsv3-down,dsv3-up,mixtral-up,mixtral-down"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--variants", default="all")
    parser.add_argument("--phases", default="smoke,exact,time")
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--time-budget-s", type=float, default=520)
    parser.add_argument(
        "--time-routing",
        choices=("balanced", "skewed", "layer"),
        default="balanced",
        help="group sizes of the timing phase (skewed: Dirichlet 0.3, as the gemm bench's; "
        "layer: as the MoE layer's, multinomial loads on 7/8 of the rows, each padded to 64, "
        "the rest tail rows)",
    )
    parser.add_argument(
        "--exact-swizzled",
        action="store_true",
        help="exactness phase: the default tiles with swizzled_epilogue=True as well",
    )
    parser.add_argument(
        "--exact-ring",
        action="store_true",
        help="also check the default tiles on the hand-written ring (ring=True) for exactness",
    )
    parser.add_argument(
        "--exact-variants",
        default="",
        help="exactness phase: these tile variants too (comma-separated names)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="timing phase: torch and the variants interleaved in this many rounds (one sample "
        "of each per round, jaxmoe.bench.timing.time_interleaved); 0 times them one by one",
    )
    args = parser.parse_args()
    start = time.time()

    import jax
    import jax.numpy as jnp
    from jax import lax

    from jaxmoe.bench.gemm import group_sizes_for, layer_group_sizes
    from jaxmoe.bench.harness import row_emitter
    from jaxmoe.bench.presets import GEMM_SHAPES
    from jaxmoe.bench.timing import (
        jax_sync,
        time_interleaved,
        time_jax,
        time_torch,
        torch_sync,
        warm_up,
    )
    from jaxmoe.ops.grouped_matmul import pallas_mosaic, pallas_mosaic_tiles, pallas_triton

    try:
        import torch
    except ImportError:  # the probe still checks and times the JAX kernels
        torch = None

    def smi():
        try:
            return subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
        except Exception as e:  # noqa: BLE001
            return repr(e)

    meta = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "jaxlib": getattr(__import__("jaxlib"), "__version__", None),
        "torch": getattr(torch, "__version__", None),
        "python": sys.version.split()[0],
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "smi_start": smi(),
    }
    print(json.dumps(meta), flush=True)
    path = os.path.join(args.out_dir, "mosaic-probe.json")
    err_path = os.path.join(args.out_dir, "mosaic-errors.log")

    emit = row_emitter(path, meta)

    def record_error(where, e):
        with open(err_path, "a") as f:
            f.write(f"==== {where}\n{traceback.format_exc()}\n")
        return repr(e)[:300]

    cfg = pallas_mosaic_tiles.MosaicTileConfig
    variants = {
        "s3": cfg(128, 256, 64, 3, 8),
        "s4e64": cfg(128, 256, 64, 4, 8, epilogue_rows=64),
        "s4e64chain": cfg(128, 256, 64, 4, 8, pipelined_tiles=True, epilogue_rows=64),
        "s2chain": cfg(128, 256, 64, 2, 8, pipelined_tiles=True),
        "n128s4": cfg(128, 128, 64, 4, 8),
        "n128s4chain": cfg(128, 128, 64, 4, 8, pipelined_tiles=True),
        # The L2 swizzle width (work items walked together along N), never swept before run 8.
        "s4e64g4": cfg(128, 256, 64, 4, 4, epilogue_rows=64),
        "s4e64g16": cfg(128, 256, 64, 4, 16, epilogue_rows=64),
        "s4e64g32": cfg(128, 256, 64, 4, 32, epilogue_rows=64),
        "s4e64chaing16": cfg(128, 256, 64, 4, 16, pipelined_tiles=True, epilogue_rows=64),
        # The swizzled, double-buffered epilogue (whole slabs through 128-byte-swizzled 64-column
        # chunks, one TMA store in flight; boundary slabs unswizzled), next to s4e64(chain).
        "s4e64swz": cfg(128, 256, 64, 4, 8, epilogue_rows=64, swizzled_epilogue=True),
        "s4e64chainswz": cfg(
            128, 256, 64, 4, 8, pipelined_tiles=True, epilogue_rows=64, swizzled_epilogue=True
        ),
        # The hand-written ring across a CTA's tiles, wgmma kept in flight (session 8).
        "s4e64ring": cfg(128, 256, 64, 4, 8, epilogue_rows=64, ring=True),
        "s3ring": cfg(128, 256, 64, 3, 8, ring=True),
        "s4e64ringswz": cfg(
            128, 256, 64, 4, 8, epilogue_rows=64, swizzled_epilogue=True, ring=True
        ),
        # (Ping-pong, session 13, measured 0.74-0.96x and removed in session 17.)
        # The compute warpgroups split a tile's rows, m64n256 each (session 15): three ring
        # slots next to a 64 x 256 slab, four with the slab staged 128 columns at a time.
        "split3swz": cfg(
            128, 256, 64, 3, 8, epilogue_rows=64, swizzled_epilogue=True, ring=True, split_rows=True
        ),
        "split4swz": cfg(
            128, 256, 64, 4, 8, epilogue_rows=64, swizzled_epilogue=True, ring=True, split_rows=True
        ),
        "split4": cfg(128, 256, 64, 4, 8, epilogue_rows=64, ring=True, split_rows=True),
        # The default walking 4 or 16 work items along N instead of 8 (L2 reuse of a weight
        # column block against reuse of the lhs rows; last swept on run 8's kernel, unsettled).
        "split4swzg4": cfg(
            128, 256, 64, 4, 4, epilogue_rows=64, swizzled_epilogue=True, ring=True, split_rows=True
        ),
        "split4swzg16": cfg(
            128,
            256,
            64,
            4,
            16,
            epilogue_rows=64,
            swizzled_epilogue=True,
            ring=True,
            split_rows=True,
        ),
        # Each group's tiles from its first row (session 16): fewer tiles on skewed groups.
        "split4swzgs": cfg(
            128,
            256,
            64,
            4,
            8,
            epilogue_rows=64,
            swizzled_epilogue=True,
            ring=True,
            split_rows=True,
            group_start_tiles=True,
        ),
    }
    # "default": the default tiles without the weight multicast (the default on small experts;
    # in run 22 call 1, before the K * N rule, it was the multicast on every shape). "mc",
    # "mcg4", "mcg16": with clusters of two CTAs multicasting the weight block (session 19; the
    # default on large experts since session 22), walking 8 (the default's group_swizzle: 16
    # work items), 4 or 16 pairs along N.
    default_tiles = dataclasses.replace(
        pallas_mosaic_tiles.default_mosaic_gmm_tiles(0, 0, 0), multicast_weights=False
    )
    variants["default"] = default_tiles
    for swizzle in (8, 4, 16):
        name = "mc" if swizzle == 8 else f"mcg{swizzle}"
        variants[name] = dataclasses.replace(
            default_tiles, multicast_weights=True, group_swizzle=swizzle
        )
    # "split", "mc_split": "default" and "mc" with the last round cut into K halves
    # (split_last_round, session 26).
    variants["split"] = dataclasses.replace(default_tiles, split_last_round=True)
    variants["mc_split"] = dataclasses.replace(variants["mc"], split_last_round=True)
    if args.variants != "all":
        variants = {k: variants[k] for k in args.variants.split(",")}

    fns = {}

    def mosaic_fn(transpose, tiles):
        key = ("mosaic", transpose, tiles)
        if key not in fns:
            fns[key] = jax.jit(
                functools.partial(pallas_mosaic.gmm, transpose_rhs=transpose, tiles=tiles)
            )
        return fns[key]

    def triton_fn(transpose, out_dtype=None):
        key = ("triton", transpose, out_dtype)
        if key not in fns:
            fns[key] = jax.jit(
                functools.partial(pallas_triton.gmm, transpose_rhs=transpose, out_dtype=out_dtype)
            )
        return fns[key]

    @functools.partial(jax.jit, static_argnames=("transpose", "bm"))
    def reference(lhs, rhs, group_sizes, transpose, bm=128):
        """float32 HIGHEST: one dot per (group, bm-row tile), rows outside the group masked."""
        m = lhs.shape[0]
        n = rhs.shape[1] if transpose else rhs.shape[2]
        lhs32 = lhs.astype(jnp.float32)
        ends = jnp.cumsum(group_sizes)
        starts = ends - group_sizes

        def group_body(g, out):
            w = rhs[g].astype(jnp.float32)
            w = w.T if transpose else w
            s, e = starts[g], ends[g]

            def tile_body(t, out):
                r0 = t * bm
                rows = lax.dynamic_slice_in_dim(lhs32, r0, bm)
                prod = jnp.dot(rows, w, precision=lax.Precision.HIGHEST)
                idx = r0 + jnp.arange(bm)[:, None]
                prod = jnp.where((idx >= s) & (idx < e), prod, 0.0)
                cur = lax.dynamic_slice_in_dim(out, r0, bm)
                return lax.dynamic_update_slice_in_dim(out, cur + prod, r0, 0)

            lo = s // bm
            hi = jnp.where(e > s, (e - 1) // bm + 1, lo)
            return lax.fori_loop(lo, hi, tile_body, out)

        return lax.fori_loop(0, rhs.shape[0], group_body, jnp.zeros((m, n), jnp.float32))

    @jax.jit
    def errors(got, want):
        got = got.astype(jnp.float32)
        diff = got - want
        row_ref = jnp.linalg.norm(want, axis=1)
        row_err = jnp.linalg.norm(diff, axis=1) / jnp.maximum(row_ref, 1e-6)
        return (
            jnp.linalg.norm(diff) / jnp.maximum(jnp.linalg.norm(want), 1e-30),
            jnp.max(jnp.where(row_ref > 0, row_err, 0.0)),
            jnp.sum(~jnp.isfinite(got)),
        )

    def poison(m, n, dtype=jnp.bfloat16):
        # Leaves a freed NaN buffer of the output's size for the allocator to hand back.
        jax.block_until_ready(jnp.full((m, n), jnp.nan, dtype))

    def check(tag, fn, lhs, rhs, gs, transpose, want, bound):
        m = lhs.shape[0]
        n = rhs.shape[1] if transpose else rhs.shape[2]
        poison(m, n)
        got = jax.block_until_ready(fn(lhs, rhs, gs))
        rel, row_max, nonfinite = (float(v) for v in errors(got, want))
        tail = got[bound:].astype(jnp.float32)
        tail_max = float(jnp.max(jnp.abs(tail))) if bound < m else 0.0
        tail_nonfinite = int(jnp.sum(~jnp.isfinite(tail))) if bound < m else 0
        ok = (
            rel < 1e-2 and row_max < 3e-2 and nonfinite == 0 and tail_max == 0
        ) and tail_nonfinite == 0
        return {
            **tag,
            "rel_err": rel,
            "row_max_rel_err": row_max,
            "nonfinite": int(nonfinite),
            "tail_rows": m - bound,
            "tail_max_abs": tail_max,
            "ok": bool(ok),
        }

    def inputs(m, k, n, g, seed):
        kx, kd, kw = jax.random.split(jax.random.key(seed), 3)
        x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
        dy = jax.random.normal(kd, (m, n), jnp.float32).astype(jnp.bfloat16)
        w = (jax.random.normal(kw, (g, k, n)) / math.sqrt(k)).astype(jnp.bfloat16)
        return x, dy, w

    def skewed_sizes(shape, seed=0):
        sizes = group_sizes_for(shape, "skewed", seed).astype(np.int64)
        order = np.argsort(sizes)
        # Two groups forced empty (rows moved to the largest), then 77 rows past the sum.
        for g in order[-3:-1] if shape.groups > 3 else order[:1]:
            sizes[order[-1]] += sizes[g]
            sizes[g] = 0
        sizes[order[-1]] -= 77
        return sizes.astype(np.int32)

    phases = set(args.phases.split(","))
    # ---------------------------------------------------------------- 1. smoke
    working = dict(variants)
    if "smoke" in phases:
        m, k, n, g = 1024, 512, 512, 6
        x, dy, w = inputs(m, k, n, g, 7)
        sizes = np.array([300, 0, 37, 129, 0, 400], np.int32)  # sum 866: 158 tail rows
        gs = jnp.asarray(sizes)
        for transpose in (False, True):
            lhs = dy if transpose else x
            want = reference(lhs, w, gs, transpose)
            tag = {"phase": "smoke", "impl": "triton", "op": "dgrad" if transpose else "fwd"}
            emit(check(tag, triton_fn(transpose), lhs, w, gs, transpose, want, int(sizes.sum())))
            for name, tiles in variants.items():
                tag = {"phase": "smoke", "impl": name, "op": "dgrad" if transpose else "fwd"}
                t0 = time.time()
                try:
                    row = check(tag, mosaic_fn(transpose, tiles), lhs, w, gs, transpose, want, 866)
                    row["first_call_s"] = time.time() - t0
                    emit(row)
                    if not row["ok"]:
                        working.pop(name, None)
                except Exception as e:  # noqa: BLE001 - the probe records failures and goes on
                    emit({**tag, "error": record_error(f"smoke {name} {tag['op']}", e)})
                    working.pop(name, None)
        if not working:
            emit({"stop": "no Mosaic variant compiled and passed the smoke check"})
            return

    # ---------------------------------------------------------------- 2. exactness, default tiles
    shape_names = args.shapes.split(",")
    if "exact" in phases:
        for shape_name in shape_names:
            shape = GEMM_SHAPES[shape_name]
            x, dy, w = inputs(shape.m, shape.k, shape.n, shape.groups, 11)
            for routing in ("balanced", "skewed"):
                if routing == "balanced":
                    sizes = group_sizes_for(shape, "balanced")
                else:
                    sizes = skewed_sizes(shape)
                gs = jnp.asarray(sizes)
                bound = int(sizes.sum())
                for transpose in (False, True):
                    op = "dgrad" if transpose else "fwd"
                    lhs = dy if transpose else x
                    n_out = shape.k if transpose else shape.n
                    tiles = pallas_mosaic_tiles.default_mosaic_gmm_tiles(
                        shape.m, lhs.shape[1], n_out
                    )
                    mosaic_tiles = {"mosaic-default": tiles}
                    if args.exact_swizzled:
                        mosaic_tiles["mosaic-default-swz"] = dataclasses.replace(
                            tiles, swizzled_epilogue=True
                        )
                    if args.exact_ring:
                        mosaic_tiles["mosaic-default-ring"] = dataclasses.replace(tiles, ring=True)
                    for name in filter(None, args.exact_variants.split(",")):
                        mosaic_tiles[name] = variants[name]
                    base = {
                        "phase": "exact",
                        "shape": shape_name,
                        "routing": routing,
                        "op": op,
                        "empty_groups": int(np.sum(sizes == 0)),
                    }
                    try:
                        want = reference(lhs, w, gs, transpose)
                        emit(
                            check(
                                {**base, "impl": "triton"},
                                triton_fn(transpose),
                                lhs,
                                w,
                                gs,
                                transpose,
                                want,
                                bound,
                            )
                        )
                        for impl, impl_tiles in mosaic_tiles.items():
                            emit(
                                check(
                                    {**base, "impl": impl, "tiles": repr(impl_tiles)},
                                    mosaic_fn(transpose, impl_tiles),
                                    lhs,
                                    w,
                                    gs,
                                    transpose,
                                    want,
                                    bound,
                                )
                            )
                        del want
                    except Exception as e:  # noqa: BLE001
                        emit({**base, "error": record_error(f"exact {base}", e)})
            del x, dy, w

    # ---------------------------------------------------------------- 3. timing
    if "time" not in phases:
        return
    for shape_name in shape_names:
        shape = GEMM_SHAPES[shape_name]
        if args.time_routing == "layer":
            sizes = layer_group_sizes(shape)
        else:
            sizes = group_sizes_for(shape, args.time_routing)
        gs = jnp.asarray(sizes)
        x, dy, w = inputs(shape.m, shape.k, shape.n, shape.groups, 3)
        flops = 2 * shape.m * shape.k * shape.n

        def row(impl, op, t, extra=None, shape_name=shape_name, flops=flops):
            emit(
                {
                    "phase": "time",
                    "routing": args.time_routing,
                    "shape": shape_name,
                    "op": op,
                    "impl": impl,
                    "ms": t.median_ms,
                    "min_ms": t.min_ms,
                    "tflops": flops / t.median_ms / 1e9,
                    **(extra or {}),
                }
            )

        tstate = {}
        if torch is not None:
            tx = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.bfloat16)
            tdy = torch.randn(shape.m, shape.n, device="cuda", dtype=torch.bfloat16)
            tw = torch.randn(shape.groups, shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
            offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
            # fwd: x @ w[g] with w[g] = tw[g]^T ([K, N]); dgrad: dy @ w[g]^T = dy @ tw[g].
            tstate["fwd"] = functools.partial(
                torch._grouped_mm, tx, tw.transpose(-2, -1), offs=offs
            )
            tstate["dgrad"] = functools.partial(torch._grouped_mm, tdy, tw, offs=offs)

        for op in ("fwd", "dgrad"):
            transpose = op == "dgrad"
            lhs = dy if transpose else x
            n_out = shape.k if transpose else shape.n
            default = pallas_mosaic_tiles.default_mosaic_gmm_tiles(shape.m, lhs.shape[1], n_out)
            if args.rounds:
                if time.time() - start > args.time_budget_s:
                    emit({"budget": "stopped", "at": [shape_name, op]})
                    return
                contenders = {}
                if op in tstate:
                    call = tstate[op]
                    contenders["torch"] = (call, torch_sync, warm_up(call, torch_sync))
                for name, tiles in working.items():
                    call = functools.partial(mosaic_fn(transpose, tiles), lhs, w, gs)
                    contenders[name] = (call, jax_sync, warm_up(call, jax_sync))
                timings = time_interleaved(contenders, rounds=args.rounds)
                for name, t in timings.items():
                    extra = {"rounds": args.rounds}
                    if name in working:
                        extra["is_default"] = working[name] == default
                    row(name, op, t, extra)
                continue
            if op in tstate:
                row("torch", op, time_torch(tstate[op]))
            row("triton", op, time_jax(triton_fn(transpose), lhs, w, gs))
            for name, tiles in working.items():
                if time.time() - start > args.time_budget_s:
                    emit({"budget": "stopped", "at": [shape_name, op, name]})
                    return
                try:
                    fn = mosaic_fn(transpose, tiles)
                    t = time_jax(fn, lhs, w, gs)
                    row(name, op, t, {"is_default": tiles == default})
                except Exception as e:  # noqa: BLE001
                    emit(
                        {
                            "phase": "time",
                            "shape": shape_name,
                            "op": op,
                            "impl": name,
                            "error": record_error(f"time {shape_name} {op} {name}", e),
                        }
                    )
        if "fwd" in tstate:
            row("torch-again", "fwd", time_torch(tstate["fwd"]))
        tstate.clear()
        if torch is not None:
            del tx, tdy, tw
            torch.cuda.empty_cache()
        del x, dy, w
    emit({"done": True, "elapsed_s": time.time() - start, "smi_end": smi()})


if __name__ == "__main__":
    main()
