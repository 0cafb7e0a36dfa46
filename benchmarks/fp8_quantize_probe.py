"""How long the FP8 layer's weight quantization takes on the GPU, and which layout is cheapest.

For one Mixtral-sized expert weight ``[G, K, N] = [8, 4096, 14336]`` bf16 (and the layer's
activations ``[8192, 4096]``), times under ``jit``: the rowwise quantization as
``fp8_grouped_matmul`` runs it for the Mosaic kernel (amax over K, cast, then the K-major copy
``[G, N, K]``), the same from a bf16 transpose first (amax over the last axis), and the amax and
the cast alone, with the bytes each moves and the GB/s that makes. Run 7 (H100, call5): the fused
quantize-and-transpose ran at 1.0 TB/s (2.34 ms) against 2.55 TB/s (0.92 ms) without the
transpose; the two ``barrier`` variants (added after it) keep the transpose in a pass of
its own. Writes
``fp8-quantize.json`` under ``--out-dir``.
    PYTHONPATH=src python3 benchmarks/fp8_quantize_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

from jaxmoe.bench.harness import results_header, write_results
from jaxmoe.bench.timing import time_jax
from jaxmoe.ops.fp8 import E4M3, quantize


def cases(groups=8, k=4096, n=14336, tokens=8192):
    weight = jax.random.normal(jax.random.key(0), (groups, k, n), jnp.bfloat16)
    acts = jax.random.normal(jax.random.key(1), (tokens, k), jnp.bfloat16)
    elements = weight.size

    def kmajor_after(w):  # what the layer runs today: quantize [G, K, N], then swap to K-major
        q, scale = quantize(w, (1, None, 1))
        return jnp.swapaxes(q, 1, 2), scale

    def kmajor_before(w):  # transpose in bf16 first, then amax along the (now last) K axis
        return quantize(jnp.swapaxes(w, 1, 2), (1, 1, None))

    def kmajor_barrier(w):  # the bf16 transpose kept out of the quantization's fusion
        return quantize(jax.lax.optimization_barrier(jnp.swapaxes(w, 1, 2)), (1, 1, None))

    def fp8_transpose_barrier(w):  # quantize in place, then a separate 1-byte transpose
        q, scale = quantize(w, (1, None, 1))
        return jnp.swapaxes(jax.lax.optimization_barrier(q), 1, 2), scale

    return {
        # (fn, args, bytes moved at best: reads + writes)
        "weight_transpose_barrier_quantize": (
            kmajor_barrier,
            (weight,),
            elements * (4 + 2 + 2 + 1),
        ),
        "weight_quantize_barrier_transpose": (
            fp8_transpose_barrier,
            (weight,),
            elements * (2 + 2 + 1 + 2),
        ),
        "weight_quantize_then_transpose": (kmajor_after, (weight,), elements * (2 + 2 + 1)),
        "weight_transpose_then_quantize": (kmajor_before, (weight,), elements * (2 + 2 + 1)),
        "weight_quantize_no_transpose": (
            lambda w: quantize(w, (1, None, 1)),
            (weight,),
            elements * (2 + 2 + 1),
        ),
        "weight_amax_only": (
            lambda w: jnp.max(jnp.abs(w), axis=1),
            (weight,),
            elements * 2,
        ),
        "weight_cast_only": (lambda w: w.astype(E4M3), (weight,), elements * 3),
        "weight_transpose_bf16_only": (
            lambda w: jnp.swapaxes(w, 1, 2),
            (weight,),
            elements * 4,
        ),
        "activation_quantize": (lambda a: quantize(a, (1, None)), (acts,), acts.size * 5),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="fp8-quantize-probe")
    args = parser.parse_args(argv)
    rows = []
    for name, (fn, fn_args, nbytes) in cases().items():
        ms = time_jax(jax.jit(fn), *fn_args).median_ms
        rows.append({"case": name, "ms": ms, "bytes": nbytes, "gbps": nbytes / ms / 1e6})
        print(json.dumps(rows[-1]), flush=True)
    write_results(
        pathlib.Path(args.out_dir) / "fp8-quantize.json",
        results_header("python3 benchmarks/fp8_quantize_probe.py"),
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
