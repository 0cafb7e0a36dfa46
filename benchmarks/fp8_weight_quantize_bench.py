"""The rowwise FP8 weight quantization, two Pallas passes against XLA: bits first, then time.

For each expert weight shape ``[G, K, N]`` (bf16, normal values with per-row and per-column
magnitudes spread over ``exp(uniform(-3, 3))``), both paths produce the same four arrays
``(q_fwd_nk [G, N, K], scale_fwd [G, 1, N], q_dgrad [G, K, N], scale_dgrad [G, K, 1])``:

* ``pallas``: :func:`jaxmoe.ops.fp8.weight_quantize_pallas.quantize_weights_rowwise_pallas`;
* ``xla``: ``jax.jit`` of ``quantize(w, (1, None, 1))`` (then ``swapaxes`` to ``[G, N, K]``)
  and ``quantize(w, (1, 1, None))``, as the layer runs them today;
* ``pallas_ieee_div`` (GPU only): the Pallas path dividing with the correctly rounded PTX
  ``div.rn.f32`` instead of ``div.full.f32`` (Triton's ``/``, and XLA's on the GPU): its
  differing-element counts show which division XLA's bits come from.

It prints the number of differing elements of each output (bitwise), then times each path
(``time_jax``, median ms) and reports GB/s at 6 bytes per weight element (2 + 2 read, 1 + 1
written: the two-pass minimum), for both paths alike. Writes JSON to ``--out``.

    PYTHONPATH=src python3 benchmarks/fp8_weight_quantize_bench.py --out $OUT/wquant.json
    PYTHONPATH=src python3 benchmarks/fp8_weight_quantize_bench.py --tiny --out /tmp/w.json  # CPU
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp

from jaxmoe.bench.harness import differing_elements, results_header, write_results
from jaxmoe.bench.timing import time_jax
from jaxmoe.ops.fp8.weight_quantize_pallas import (
    WeightQuantizeTiles,
    quantize_weights_rowwise_pallas,
    quantize_weights_rowwise_xla,
)

SHAPES = {
    "mixtral-up": (8, 4096, 14336),
    "mixtral-down": (8, 14336, 4096),
    "dsv3-up": (32, 7168, 2048),
    "dsv3-down": (32, 2048, 7168),
}
TINY_SHAPES = {"tiny-a": (2, 64, 256), "tiny-b": (3, 256, 48)}
OUTPUT_NAMES = ("q_fwd_nk", "scale_fwd", "q_dgrad", "scale_dgrad")
BYTES_PER_ELEMENT = 6  # read w twice (2 + 2), write both FP8 copies (1 + 1)
TILE_SWEEP = {
    "default": WeightQuantizeTiles(),
    "cast64x128": WeightQuantizeTiles(cast_block_k=64, cast_block_n=128),
    "cast128x64": WeightQuantizeTiles(cast_block_k=128, cast_block_n=64),
    "cast128x256": WeightQuantizeTiles(cast_block_n=256),
    "amax256x256": WeightQuantizeTiles(amax_block_k=256),
    "warps4": WeightQuantizeTiles(amax_num_warps=4, cast_num_warps=4),
}


def spread_weight(shape, seed=0) -> jax.Array:
    """bf16 normal weights times per-row and per-column magnitudes ``exp(uniform(-3, 3))``."""
    groups, k, n = shape
    keys = jax.random.split(jax.random.key(seed), 3)
    base = jax.random.normal(keys[0], shape, jnp.float32)
    rows = jnp.exp(jax.random.uniform(keys[1], (groups, k, 1), minval=-3.0, maxval=3.0))
    cols = jnp.exp(jax.random.uniform(keys[2], (groups, 1, n), minval=-3.0, maxval=3.0))
    return (base * rows * cols).astype(jnp.bfloat16)


def compare(got, want) -> dict[str, int]:
    pairs = zip(OUTPUT_NAMES, got, want, strict=True)
    return {name: differing_elements(g, w) for name, g, w in pairs}


def paths(tiles: WeightQuantizeTiles, on_gpu: bool) -> dict:
    """The jitted callables to check and time, by name."""
    found = {
        "xla": jax.jit(quantize_weights_rowwise_xla),
        "pallas": jax.jit(lambda w: quantize_weights_rowwise_pallas(w, tiles=tiles)),
    }
    if on_gpu:
        found["pallas_ieee_div"] = jax.jit(
            lambda w: quantize_weights_rowwise_pallas(w, tiles=tiles, ieee_division=True)
        )
    return found


def run_shape(name, shape, tiles_name, tiles, *, on_gpu, repeats) -> list[dict]:
    weight = spread_weight(shape)
    calls = paths(tiles, on_gpu)
    want = jax.block_until_ready(calls["xla"](weight))
    rows = []
    for path, fn in calls.items():
        diffs = compare(jax.block_until_ready(fn(weight)), want)
        timing = time_jax(fn, weight, repeats=repeats)
        gbps = BYTES_PER_ELEMENT * weight.size / timing.median_ms / 1e6
        rows.append(
            {
                "shape": name,
                "gkn": list(shape),
                "path": path,
                "tiles": tiles_name if path != "xla" else "-",
                "median_ms": round(timing.median_ms, 4),
                "gbps_6B": round(gbps, 1),
                "bitwise_equal": not any(diffs.values()),
                "differing": diffs,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="fp8_weight_quantize.json")
    parser.add_argument("--tiny", action="store_true", help="small shapes (CPU interpreter)")
    parser.add_argument("--shapes", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--sweep", action="store_true", help="also time TILE_SWEEP's tiles")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    shapes = TINY_SHAPES if args.tiny else SHAPES
    if args.shapes:
        shapes = {name: shapes[name] for name in args.shapes.split(",")}
    sweep = TILE_SWEEP if args.sweep else {"default": TILE_SWEEP["default"]}
    if args.tiny:
        sweep = {"tiny": WeightQuantizeTiles(32, 32, 4, 32, 32, 4)}
    print(f"backend {jax.default_backend()}, jax {jax.__version__}, shapes {list(shapes)}")
    header = results_header(" ".join(["benchmarks/fp8_weight_quantize_bench.py", *sys.argv[1:]]))
    rows = []
    for name, shape in shapes.items():
        for tiles_name, tiles in sweep.items():
            print(f"-- {name} {shape} tiles {tiles_name}", flush=True)
            rows += run_shape(name, shape, tiles_name, tiles, on_gpu=on_gpu, repeats=args.repeats)
            write_results(args.out, header, rows)
    exact = all(row["bitwise_equal"] for row in rows if row["path"] == "pallas")
    print(f"pallas bitwise equal to xla on every shape: {exact}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
