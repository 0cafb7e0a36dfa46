"""Probe (issue 15): what a row of zeros costs the Mosaic ``gmm`` at the H100's power limit,
against a row of data.

Why: sessions 28-30 found the settled kernels' time to be their energy per call (the clock
follows the power at the 700 W limit), and a tile's rows past its group (the next group's
data, multiplied and thrown away: ~4% of the layer's M-ragged products with 64-row padding)
cost full energy. Zero rows (the layer's padding) toggle far less of the tensor cores'
datapath. If they are much cheaper, padding the groups to the 128-row tile (zeros in the
tile's tail instead of a neighbour's rows) or loading the tail from zeros is a lever.

Per shape (``--shapes``, the gemm bench's) and ``--routing`` (``balanced``, or ``layer``: the
MoE layer's kind of groups, multinomial loads padded to 64 rows), ``lhs`` as the gemm bench's
(standard normal), the variants (``--variants``) in interleaved settled rounds
(``time_interleaved``), each against the first:

    data        no zeros
    zero_tail   the last 64 rows of every 128-row tile zero (half the rows)
    zero_all    all rows zero

Rows to ``<out-dir>/zero-rows-probe.json``::

    PYTHONPATH=src python benchmarks/zero_rows_probe.py --out-dir $OUT

H100 run 31 call 2: Mixtral down and up 1.14x faster with half the rows zero, 1.28x with all
zero. Call 3 ran this probe with a ``zero_foreign_halves`` variant (a tile option loading the
thrown-away halves of a group's last tiles from zeros, ``raw/h100-run31/call3``): 0.99-1.02x on
the layer's kind of groups, not adopted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp

from jaxmoe.bench.gemm import group_sizes_for, layer_group_sizes
from jaxmoe.bench.gemm_cases import jax_inputs
from jaxmoe.bench.harness import results_header, row_emitter
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
from jaxmoe.ops.grouped_matmul import pallas_mosaic


def zeroed(x, variant: str):
    """``x`` with the ``variant``'s rows set to zero."""
    if variant == "data":
        return x
    if variant == "zero_all":
        return jnp.zeros_like(x)
    rows = jnp.arange(x.shape[0])[:, None]
    return jnp.where(rows % 128 >= 64, jnp.zeros_like(x), x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--shapes", default="mixtral-down,mixtral-up")
    parser.add_argument("--variants", default="data,zero_tail,zero_all")
    parser.add_argument("--routing", choices=("balanced", "layer"), default="balanced")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "zero-rows-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    variants = args.variants.split(",")
    for shape_name in args.shapes.split(","):
        shape = GEMM_SHAPES[shape_name]
        x, w, _ = jax_inputs(shape, jnp.bfloat16, 0)
        if args.routing == "layer":
            sizes = jnp.asarray(layer_group_sizes(shape))
        else:
            sizes = jnp.asarray(group_sizes_for(shape, args.routing))
        gmm = jax.jit(functools.partial(pallas_mosaic.gmm, transpose_rhs=False, interpret=False))
        calls = {}
        for variant in variants:
            lhs = jax.block_until_ready(zeroed(x, variant))
            call = functools.partial(gmm, lhs, w, sizes)
            calls[variant] = (call, jax_sync, warm_up(call, jax_sync))
        timings = time_interleaved(calls, rounds=args.rounds)
        flops = 2 * shape.m * shape.k * shape.n
        row = {"shape": shape_name, "routing": args.routing}
        for variant, timing in timings.items():
            row[f"{variant}_ms"] = timing.median_ms
            row[f"{variant}_tflops"] = flops / timing.median_ms / 1e9
            row[f"{variant}_speedup"] = timings[variants[0]].median_ms / timing.median_ms
        emit(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
