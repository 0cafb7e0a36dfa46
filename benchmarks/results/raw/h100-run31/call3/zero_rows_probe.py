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

    data                  the default tiles
    zero_tail             the last 64 rows of every 128-row tile zero (half the rows)
    zero_all              all rows zero
    zero_foreign_halves   the default tiles with ``zero_foreign_halves``: the halves of a tile
                          that hold none of its group's rows loaded from zeros (the same
                          results, checked equal to ``data``'s)

Rows to ``<out-dir>/zero-rows-probe.json``::

    PYTHONPATH=src python benchmarks/zero_rows_probe.py --out-dir $OUT
    PYTHONPATH=src python benchmarks/zero_rows_probe.py --out-dir $OUT --routing layer \
        --variants data,zero_foreign_halves
"""

from __future__ import annotations

import argparse
import dataclasses
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
from jaxmoe.ops.grouped_matmul import pallas_mosaic, pallas_mosaic_tiles


def zeroed(x, variant: str):
    """``x`` with the ``variant``'s rows set to zero."""
    if variant in ("data", "zero_foreign_halves"):
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
        default = pallas_mosaic_tiles.default_mosaic_gmm_tiles(shape.m, shape.k, shape.n)
        calls, outs = {}, {}
        for variant in variants:
            tiles = dataclasses.replace(
                default, zero_foreign_halves=variant == "zero_foreign_halves"
            )
            gmm = jax.jit(
                functools.partial(
                    pallas_mosaic.gmm, transpose_rhs=False, tiles=tiles, interpret=False
                )
            )
            lhs = jax.block_until_ready(zeroed(x, variant))
            call = functools.partial(gmm, lhs, w, sizes)
            outs[variant] = call()
            calls[variant] = (call, jax_sync, warm_up(call, jax_sync))
        timings = time_interleaved(calls, rounds=args.rounds)
        flops = 2 * shape.m * shape.k * shape.n
        row = {"shape": shape_name, "routing": args.routing}
        if "zero_foreign_halves" in outs and "data" in outs:
            row["zero_foreign_halves_equal"] = bool(
                jnp.array_equal(outs["zero_foreign_halves"], outs["data"])
            )
        for variant, timing in timings.items():
            row[f"{variant}_ms"] = timing.median_ms
            row[f"{variant}_tflops"] = flops / timing.median_ms / 1e9
            row[f"{variant}_speedup"] = timings[variants[0]].median_ms / timing.median_ms
        emit(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
