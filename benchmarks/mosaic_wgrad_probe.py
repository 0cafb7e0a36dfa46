"""Probe (issue 15): jaxmoe's Mosaic GPU ``tgmm`` (wgrad) against its Triton ``tgmm`` and torch.

One device call, three phases, each row written to ``$OUT/mosaic-wgrad-probe.json`` as it comes:

1. smoke: every tile variant on a small problem (an empty group, boundaries inside row blocks,
   158 rows past the sum holding NaN) against a float32 reference; variants that fail are dropped
   (tracebacks in ``mosaic-wgrad-errors.log``);
2. exactness: the default tiles on all six shapes, balanced and skewed (Dirichlet 0.3, two groups
   forced empty, 77 rows past the sum, NaN in them), next to the Triton kernel's error. The
   reference: bf16 products accumulated in float32 by XLA, one dot per (group, 128-row tile),
   rows outside the group zeroed. The output buffer is poisoned (NaN) before each call; empty
   groups must come back exactly zero;
3. timing (balanced, then skewed): ``torch._grouped_mm`` with the contraction ragged (the weight
   gradient as torch's backward computes it) and each Mosaic variant, sampled in the same rounds
   (``time_interleaved``);
4. layer: the layer presets' fwd+bwd (``--presets``) with each variant as the wgrad's default
   tiles, sampled in the same rounds, and each variant's gradients against the first's.

    PYTHONPATH=src python benchmarks/mosaic_wgrad_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np

SHAPES = "qwen3-up,qwen3-down,dsv3-down,dsv3-up,mixtral-up,mixtral-down"


def main() -> None:  # noqa: PLR0915 - one straight-line probe
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--variants", default="all")
    parser.add_argument("--phases", default="smoke,exact,time")
    parser.add_argument("--routings", default="balanced,skewed")
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--time-budget-s", type=float, default=270)
    parser.add_argument("--presets", default="mixtral", help="the layer phase's presets")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--exact-variants",
        default="",
        help="comma-separated variants checked for exactness on every shape besides the default",
    )
    args = parser.parse_args()
    start = time.time()

    import jax
    import jax.numpy as jnp

    from jaxmoe.bench.gemm import group_sizes_for
    from jaxmoe.bench.harness import row_emitter, weight_gradient_errors
    from jaxmoe.bench.presets import GEMM_SHAPES
    from jaxmoe.bench.timing import jax_sync, time_interleaved, torch_sync, warm_up
    from jaxmoe.ops.grouped_matmul import pallas_mosaic_wgrad, pallas_triton, work_list

    try:
        import torch
    except ImportError:
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
    path = os.path.join(args.out_dir, "mosaic-wgrad-probe.json")
    err_path = os.path.join(args.out_dir, "mosaic-wgrad-errors.log")

    emit = row_emitter(path, meta)

    def record_error(where, e):
        with open(err_path, "a") as f:
            f.write(f"==== {where}\n{traceback.format_exc()}\n")
        return repr(e)[:300]

    cfg = pallas_mosaic_wgrad.MosaicTgmmTileConfig
    variants = {  # (block_m, block_k, block_n, stages)
        # Whole-tile epilogue slabs (epilogue_rows=None): the variants of runs 1-11.
        "m64k128n256s3": cfg(64, 128, 256, 3, epilogue_rows=None),
        "m64k128n128s4": cfg(64, 128, 128, 4, epilogue_rows=None),
        "m128k128n128s3": cfg(128, 128, 128, 3, epilogue_rows=None),
        "m64k64n256s4": cfg(64, 64, 256, 4, epilogue_rows=None),
        # A fourth ring slot, paid for by storing the result in two 64-row halves (session 11).
        "m64k128n256s4e64": cfg(64, 128, 256, 4, epilogue_rows=64),
        "m64k128n256s4e64g4": cfg(64, 128, 256, 4, 4, epilogue_rows=64),
        "m64k128n256s4e64g16": cfg(64, 128, 256, 4, 16, epilogue_rows=64),
        # The compute warpgroups split the output tile's rows (session 15; the gmm's default).
        "m64k128n256s4e64split": cfg(64, 128, 256, 4, epilogue_rows=64, split_rows=True),
        # Clusters of two CTAs at neighbouring K tiles, the rhs block multicast (session 22).
        "m64k128n256s4e64splitmc": cfg(
            64, 128, 256, 4, epilogue_rows=64, split_rows=True, multicast_rhs=True
        ),
    }
    if args.variants != "all":
        variants = {k: variants[k] for k in args.variants.split(",")}
    fns = {}

    def mosaic_fn(tiles):
        if tiles not in fns:
            fns[tiles] = jax.jit(functools.partial(pallas_mosaic_wgrad.tgmm, tiles=tiles))
        return fns[tiles]

    triton_fn = jax.jit(pallas_triton.tgmm)  # exactness peer (the timing leaves it out)

    @functools.partial(jax.jit, static_argnames=("bm",))
    def reference(lhs, rhs, group_sizes, bm=128):
        """float32 sums of exact bf16 products: one dot per (group, bm-row tile)."""
        num_groups = group_sizes.shape[0]
        work_group, first_row, offsets = work_list.work_items(group_sizes, lhs.shape[0], bm)

        def body(w, out):
            g = work_group[w]
            r0 = first_row[w] // bm * bm
            idx = r0 + jnp.arange(bm)[:, None]
            gg = jnp.minimum(g, num_groups - 1)
            keep = (g < num_groups) & (idx >= offsets[gg]) & (idx < offsets[gg + 1])
            a = jnp.where(keep, jax.lax.dynamic_slice_in_dim(lhs, r0, bm), 0)
            b = jnp.where(keep, jax.lax.dynamic_slice_in_dim(rhs, r0, bm), 0)
            prod = jax.lax.dot_general(
                a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            return out.at[gg].add(prod)

        zero = jnp.zeros((num_groups, lhs.shape[1], rhs.shape[1]), jnp.float32)
        return jax.lax.fori_loop(0, work_group.shape[0], body, zero)

    errors = jax.jit(weight_gradient_errors)

    def check(tag, fn, lhs, rhs, gs, want):
        g, k, n = want.shape
        jax.block_until_ready(jnp.full((g, k, n), jnp.nan, jnp.bfloat16))  # poison a buffer
        got = jax.block_until_ready(fn(lhs, rhs, gs))
        rel, group_max, nonfinite, empty_max = (float(v) for v in errors(got, want, gs))
        ok = rel < 1e-2 and group_max < 3e-2 and nonfinite == 0 and empty_max == 0
        return {
            **tag,
            "rel_err": rel,
            "group_max_rel_err": group_max,
            "nonfinite": int(nonfinite),
            "empty_groups": int(np.sum(np.asarray(gs) == 0)),
            "empty_max_abs": empty_max,
            "ok": bool(ok),
        }

    def inputs(m, k, n, seed, bound):
        kx, kd = jax.random.split(jax.random.key(seed))
        x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
        dy = jax.random.normal(kd, (m, n), jnp.float32).astype(jnp.bfloat16)
        # Rows past the sum hold NaN: a kernel that reads them into a group fails the check.
        return x.at[bound:].set(jnp.nan), dy.at[bound:].set(jnp.nan)

    def skewed_sizes(shape, seed=0):
        sizes = group_sizes_for(shape, "skewed", seed).astype(np.int64)
        order = np.argsort(sizes)
        for g in order[-3:-1] if shape.groups > 3 else order[:1]:
            sizes[order[-1]] += sizes[g]
            sizes[g] = 0
        sizes[order[-1]] -= 77
        return sizes.astype(np.int32)

    def sizes_for(shape, routing):
        return group_sizes_for(shape, "balanced") if routing == "balanced" else skewed_sizes(shape)

    phases = set(args.phases.split(","))
    working = dict(variants)
    if "smoke" in phases:
        m, k, n = 1024, 256, 512
        sizes = np.array([300, 0, 37, 129, 0, 400], np.int32)  # sum 866: 158 tail rows
        gs = jnp.asarray(sizes)
        x, dy = inputs(m, k, n, 7, int(sizes.sum()))
        want = reference(x, dy, gs)
        emit(check({"phase": "smoke", "impl": "triton"}, triton_fn, x, dy, gs, want))
        for name, tiles in variants.items():
            tag = {"phase": "smoke", "impl": name}
            t0 = time.time()
            try:
                row = check(tag, mosaic_fn(tiles), x, dy, gs, want)
                row["first_call_s"] = time.time() - t0
                emit(row)
                if not row["ok"]:
                    working.pop(name)
            except Exception as e:  # noqa: BLE001 - the probe records failures and goes on
                emit({**tag, "error": record_error(f"smoke {name}", e)})
                working.pop(name)
        if not working:
            emit({"stop": "no Mosaic variant compiled and passed the smoke check"})
            return

    shape_names = args.shapes.split(",")
    routings = args.routings.split(",")
    if "exact" in phases:
        default = pallas_mosaic_wgrad.default_mosaic_tgmm_tiles(0, 0, 0)
        for shape_name in shape_names:
            shape = GEMM_SHAPES[shape_name]
            for routing in routings:
                sizes = sizes_for(shape, routing)
                gs = jnp.asarray(sizes)
                x, dy = inputs(shape.m, shape.k, shape.n, 11, int(sizes.sum()))
                base = {"phase": "exact", "shape": shape_name, "routing": routing}
                try:
                    want = reference(x, dy, gs)
                    emit(check({**base, "impl": "triton"}, triton_fn, x, dy, gs, want))
                    emit(
                        check(
                            {**base, "impl": "mosaic-default"}, mosaic_fn(default), x, dy, gs, want
                        )
                    )
                    for name in filter(None, args.exact_variants.split(",")):
                        emit(
                            check(
                                {**base, "impl": name}, mosaic_fn(variants[name]), x, dy, gs, want
                            )
                        )
                    del want
                except Exception as e:  # noqa: BLE001
                    emit({**base, "error": record_error(f"exact {base}", e)})
                del x, dy

    for routing in routings if "time" in phases else ():
        for shape_name in shape_names:
            shape = GEMM_SHAPES[shape_name]
            sizes = sizes_for(shape, routing)
            gs = jnp.asarray(sizes)
            x, dy = inputs(shape.m, shape.k, shape.n, 3, shape.m)  # no NaN: timing only
            flops = 2 * shape.m * shape.k * shape.n

            def row(impl, t, extra=None, shape_name=shape_name, flops=flops, routing=routing):
                emit(
                    {
                        "phase": "time",
                        "routing": routing,
                        "shape": shape_name,
                        "impl": impl,
                        "ms": t.median_ms,
                        "min_ms": t.min_ms,
                        "tflops": flops / t.median_ms / 1e9,
                        **(extra or {}),
                    }
                )

            # Every contender sampled in the same rounds (time_interleaved): ratios between
            # them hold even as the clock drifts.
            contenders = {}
            if torch is not None:
                tx = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.bfloat16)
                tdy = torch.randn(shape.m, shape.n, device="cuda", dtype=torch.bfloat16)
                offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
                # dw_nk[g] = dy[rows of g]^T @ x[rows of g]: torch's weight gradient of
                # _grouped_mm(x, w_nk^T), contraction ragged.
                tfn = functools.partial(torch._grouped_mm, tdy.t(), tx, offs=offs)
                contenders["torch"] = (tfn, torch_sync, warm_up(tfn, torch_sync))
            for name, tiles in working.items():
                if time.time() - start > args.time_budget_s:
                    emit({"budget": "stopped", "at": [routing, shape_name, name]})
                    return
                try:
                    call = functools.partial(mosaic_fn(tiles), x, dy, gs)
                    contenders[name] = (call, jax_sync, warm_up(call, jax_sync))
                except Exception as e:  # noqa: BLE001
                    emit(
                        {
                            "phase": "time",
                            "shape": shape_name,
                            "impl": name,
                            "error": record_error(f"time {shape_name} {name}", e),
                        }
                    )
            for name, t in time_interleaved(contenders, rounds=args.rounds).items():
                row(name, t)
            contenders.clear()
            if torch is not None:
                tx = tdy = tfn = None
                torch.cuda.empty_cache()
            del x, dy

    if "layer" in phases:
        layer_phase(args, working, emit, record_error, start)
    emit({"done": True, "elapsed_s": time.time() - start, "smi_end": smi()})


def layer_phase(args, variants, emit, record_error, start) -> None:
    """The layer's fwd+bwd with each tile variant as the wgrad's default, timed in the same
    rounds; gradients compared with the first variant's. Each variant is compiled ahead of
    time inside its patch (``compile_variant``; before session 22 this phase jitted each
    variant without clearing jax's caches, where a custom VJP rule traced for the first
    variant could serve the others)."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    import jaxmoe
    from jaxmoe.bench.harness import relative_error
    from jaxmoe.bench.layer import expert_flops, forward_backward, layer_inputs
    from jaxmoe.bench.presets import LAYER_PRESETS
    from jaxmoe.bench.tile_variants import compile_variant, tile_sites
    from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up

    for preset_name in args.presets.split(","):
        if time.time() - start > args.time_budget_s:
            emit({"budget": "stopped", "at": ["layer", preset_name]})
            return
        preset = LAYER_PRESETS[preset_name]
        row = {"phase": "layer", "preset": preset_name, "pass": "fwd+bwd"}
        try:
            cfg, params, x, dy = layer_inputs(preset, jnp.bfloat16)
            layer = lambda p, x, cfg=cfg: jaxmoe.moe(p, x, cfg)[0]  # noqa: E731
            calls, grads = {}, {}
            for name, tiles in variants.items():
                # The wgrad reads its default tiles when traced: every field set to the
                # variant's.
                fn, reads = compile_variant(
                    forward_backward(layer),
                    (params, x, dy),
                    tile_sites("wgrad"),
                    dataclasses.asdict(tiles),
                )
                row[f"{name}_tile_reads"] = len(reads)
                grads[name] = jax.block_until_ready(fn(params, x, dy))
                call = lambda fn=fn, args=(params, x, dy): fn(*args)  # noqa: E731
                calls[name] = (call, jax_sync, warm_up(call, jax_sync))
            first = next(iter(variants))
            for name in variants:
                for w in ("w_gate", "w_up", "w_down"):
                    row[f"{name}_d_{w}_rel_diff"] = relative_error(
                        grads[name][1]["experts"][w], grads[first][1]["experts"][w]
                    )
            flops = expert_flops(preset, "fwd+bwd")
            for name, timing in time_interleaved(calls, rounds=args.rounds).items():
                row[f"{name}_ms"] = timing.median_ms
                row[f"{name}_tflops"] = flops / timing.median_ms / 1e9
                row[f"{name}_speedup"] = row[f"{first}_ms"] / timing.median_ms
        except Exception as e:  # noqa: BLE001
            row["error"] = record_error(f"layer {preset_name}", e)
        emit(row)


if __name__ == "__main__":
    main()
