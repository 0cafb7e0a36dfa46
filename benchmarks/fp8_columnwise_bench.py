"""The FP8 wgrad's columnwise quantization: the two Pallas passes against XLA, bits then time.

For each activation shape ``[M, K]`` of the benchmark layers (bf16 rows of spread magnitude,
Dirichlet-skewed group sizes with an empty group, NaN in the rows past the groups), both paths
make ``(x_t_q [K, Mp], scale [G, K], starts [G])``:

* ``pallas``: :func:`jaxmoe.ops.fp8.columnwise_pallas.quantize_columnwise_pallas`;
* ``xla``: :func:`jaxmoe.ops.fp8.columnwise.quantize_columnwise`, jitted.

It prints the number of differing elements of each output (bitwise), then times both
(``time_jax``, median ms) and reports GB/s at 5 bytes per element of ``x`` (2 + 2 read, 1
written). ``--tiny`` runs small shapes (the Pallas interpreter on a CPU).

    PYTHONPATH=src python3 benchmarks/fp8_columnwise_bench.py --out $OUT/columnwise.json
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.bench.harness import differing_elements, results_header, write_results
from jaxmoe.bench.timing import time_jax
from jaxmoe.ops.fp8.columnwise import quantize_columnwise
from jaxmoe.ops.fp8.columnwise_pallas import quantize_columnwise_pallas

# (rows, width, groups): the layers' wgrad operands (Mixtral: x, hidden; DeepSeek: x, hidden).
SHAPES = {
    "mixtral-x": (8192, 4096, 8),
    "mixtral-hidden": (8192, 14336, 8),
    "dsv3-x": (32768, 7168, 32),
    "dsv3-hidden": (32768, 2048, 32),
}
TINY_SHAPES = {"tiny": (700, 256, 4)}


def operands(rows, width, groups, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, width)) * np.exp(rng.uniform(-3, 3, (rows, 1)))
    sizes = np.floor(rng.dirichlet(np.full(groups, 0.3)) * (rows - 10)).astype(np.int32)
    sizes[1] = 0
    x[sizes.sum() :] = np.nan
    return jnp.asarray(x, jnp.bfloat16), jnp.asarray(sizes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="fp8_columnwise.json")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    header = results_header(" ".join(["benchmarks/fp8_columnwise_bench.py", *sys.argv[1:]]))
    paths = {
        "pallas": jax.jit(quantize_columnwise_pallas),
        "xla": jax.jit(quantize_columnwise),
    }
    rows, exact = [], True
    for name, (m, k, g) in (TINY_SHAPES if args.tiny else SHAPES).items():
        x, sizes = operands(m, k, g)
        want = paths["xla"](x, sizes)
        got = paths["pallas"](x, sizes)
        diff = {
            out: differing_elements(a, b)
            for out, a, b in zip(("x_t_q", "scale", "starts"), got, want, strict=True)
        }
        exact &= not any(diff.values())
        print(f"{name} {(m, k, g)}: differing elements {diff}", flush=True)
        for path, fn in paths.items():
            ms = time_jax(fn, x, sizes, repeats=args.repeats).median_ms
            gbps = 5 * m * k / ms / 1e6
            rows.append(
                {
                    "shape": name,
                    "m": m,
                    "k": k,
                    "g": g,
                    "path": path,
                    "ms": ms,
                    "gbps": gbps,
                    "differing": diff,
                }
            )
            print(f"  {path:7s} {ms:.3f} ms  {gbps:.0f} GB/s", flush=True)
        write_results(args.out, header, rows)
    print(f"pallas bitwise equal to xla on every shape: {exact}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
