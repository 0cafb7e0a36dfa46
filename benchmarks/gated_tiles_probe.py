"""Probe (issue 15): the fused gate/up Mosaic kernel's tile variants on one GPU, then the layer's
forward with each as the default.

The fused gated kernel is the forward's largest op (~55% of the Mixtral layer's forward).
Variants: the default, jax's pipeline per tile (the default before run 16), the ring without
the swizzled epilogue, the compute warpgroups splitting a tile's rows (``split_rows``,
``m64n128`` products) with and without the swizzled epilogue, ``exact`` (the activation without
``approx_math``, the default before session 30) and ``swizzled`` (the swizzled epilogue). Per
variant and layer preset (``M = tokens * top_k`` rows, balanced): ``h`` against the default
variant's (max relative difference; the same K order, so expected 0), then all variants timed
in the same settled interleaved rounds; then the layer's forward (``jit(moe)``) with each
variant as ``default_gated_tiles``. Rows go to ``<out-dir>/gated-tiles-probe.json``.

    PYTHONPATH=src python benchmarks/gated_tiles_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--presets", default="mixtral,dsv3,qwen3")
    parser.add_argument("--phases", default="kernel,layer")
    parser.add_argument("--variants", default="default,split,split_unswizzled")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--time-budget-s", type=float, default=300)
    args = parser.parse_args()
    start = time.time()

    import jaxmoe
    from jaxmoe.bench.harness import relative_error, results_header, row_emitter
    from jaxmoe.bench.layer import expert_flops, layer_inputs
    from jaxmoe.bench.presets import LAYER_PRESETS
    from jaxmoe.bench.tile_variants import compile_variant, tile_sites
    from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
    from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as fused_mosaic

    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "gated-tiles-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    default_tiles = fused_mosaic.default_gated_tiles

    # Each variant: changes to the default tiles.
    variant_changes = {
        "default": {},
        "pipeline": dict(ring=False, swizzled_epilogue=False),  # the default before run 16
        "ring": dict(swizzled_epilogue=False),
        "split": dict(split_rows=True),
        "split_unswizzled": dict(split_rows=True, swizzled_epilogue=False),
        # The activation's exact math (the default before session 30, when approx_math came).
        "exact": dict(approx_math=False),
        "swizzled": dict(swizzled_epilogue=True),
    }

    def variant_tiles(name, m, k, n):
        return dataclasses.replace(default_tiles(m, k, n), **variant_changes[name])

    variants = args.variants.split(",")
    presets = [LAYER_PRESETS[name] for name in args.presets.split(",")]

    def out_of_time() -> bool:
        return time.time() - start > args.time_budget_s

    if "kernel" in args.phases:
        for preset in presets:
            if out_of_time():
                break
            m, h, f, g = (
                preset.tokens * preset.top_k,
                preset.hidden_size,
                preset.ffn_size,
                preset.num_experts,
            )
            row = {"phase": "kernel", "preset": preset.name, "m": m, "k": h, "n": f, "g": g}
            try:
                keys = jax.random.split(jax.random.key(0), 3)
                x = jax.random.normal(keys[0], (m, h), jnp.bfloat16)
                w_gate, w_up = (
                    (jax.random.normal(key, (g, h, f)) / np.sqrt(h)).astype(jnp.bfloat16)
                    for key in keys[1:]
                )
                sizes = jnp.full((g,), m // g, jnp.int32)
                calls, outs = {}, {}
                for name in variants:
                    cfg = variant_tiles(name, m, h, f)
                    fn = jax.jit(
                        lambda *a, cfg=cfg: fused_mosaic.fused_gmm(
                            *a, activation="swiglu", tiles=cfg
                        )[0]
                    )
                    outs[name] = fn(x, w_gate, w_up, sizes)
                    call = functools.partial(fn, x, w_gate, w_up, sizes)
                    calls[name] = (call, jax_sync, warm_up(call, jax_sync))
                for name in variants:
                    row[f"{name}_rel_diff"] = relative_error(outs[name], outs[variants[0]])
                outs.clear()
                flops = 2 * 2 * m * h * f
                for name, timing in time_interleaved(calls, rounds=args.rounds).items():
                    row[f"{name}_ms"] = timing.median_ms
                    row[f"{name}_tflops"] = flops / timing.median_ms / 1e9
                for name in variants:
                    row[f"{name}_speedup"] = row[f"{variants[0]}_ms"] / row[f"{name}_ms"]
            except Exception as error:  # noqa: BLE001 - a probe reports and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)

    if "layer" in args.phases:
        for preset in presets:
            if out_of_time():
                break
            row = {"phase": "layer", "preset": preset.name, "pass": "fwd"}
            try:
                cfg, params, x, _ = layer_inputs(preset, jnp.bfloat16)
                shape = (preset.tokens * preset.top_k, preset.hidden_size, preset.ffn_size)
                calls, outs = {}, {}
                for name in variants:
                    # Compiled ahead of time inside the patch, after clearing jax's caches
                    # (compile_variant): a variant jitted otherwise may run the tiles traced for
                    # an earlier one. Every field is given, so the variant is its tiles whole.
                    fn, _ = compile_variant(
                        lambda p, x, cfg=cfg: jaxmoe.moe(p, x, cfg)[0],
                        (params, x),
                        tile_sites("gated"),
                        dataclasses.asdict(variant_tiles(name, *shape)),
                    )
                    outs[name] = fn(params, x)
                    call = functools.partial(fn, params, x)
                    calls[name] = (call, jax_sync, warm_up(call, jax_sync))
                for name in variants:
                    row[f"{name}_rel_diff"] = relative_error(outs[name], outs[variants[0]])
                flops = expert_flops(preset, "fwd")
                for name, timing in time_interleaved(calls, rounds=args.rounds).items():
                    row[f"{name}_ms"] = timing.median_ms
                    row[f"{name}_min_ms"] = timing.min_ms
                    row[f"{name}_tflops"] = flops / timing.median_ms / 1e9
                for name in variants:
                    row[f"{name}_speedup"] = row[f"{variants[0]}_ms"] / row[f"{name}_ms"]
            except Exception as error:  # noqa: BLE001
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)
    emit({"done": True, "elapsed_s": round(time.time() - start, 1)})


if __name__ == "__main__":
    main()
