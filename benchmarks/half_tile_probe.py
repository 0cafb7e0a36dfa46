"""Probe (issue 15): what one compute warpgroup alone does with a tile. H100 run 20 found
``MosaicTileConfig(skip_empty_warpgroups=True)`` 0.94-0.96x the default on the layer's kind of
groups (a few tiles of 64 rows, multiplied by one warpgroup) and level with it on balanced groups
(no such tile). So: every work item a 64-row tile (``G`` groups of 64 rows) against every item
a whole 128-row tile (``G`` groups of 128), the default tiles and skip, settled, interleaved::

    PYTHONPATH=src python benchmarks/half_tile_probe.py --out-dir $OUT

If one warpgroup alone had the tensor cores to itself, ``skip`` on the 64-row groups would take
about half the 128-row groups' time; the default takes the same time on both (the same tiles).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
from jaxmoe.ops.grouped_matmul import pallas_mosaic, pallas_mosaic_tiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    g, k, n = args.groups, args.k, args.n
    m = 128 * g
    keys = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(keys[0], (m, k), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(keys[1], (g, k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
    default = pallas_mosaic_tiles.default_mosaic_gmm_tiles(m, k, n)
    tiles = {"default": default, "skip": dataclasses.replace(default, skip_empty_warpgroups=True)}
    contenders, rows = {}, []
    for rows_per_group in (64, 128):
        sizes = jnp.full((g,), rows_per_group, jnp.int32)
        for name, cfg in tiles.items():
            fn = jax.jit(functools.partial(pallas_mosaic.gmm, tiles=cfg))
            call = functools.partial(fn, x, w, sizes)
            contenders[f"{name}-{rows_per_group}"] = (call, jax_sync, warm_up(call, jax_sync))
    for name, timing in time_interleaved(contenders, rounds=args.rounds).items():
        rows.append({"case": name, "ms": timing.median_ms, "min_ms": timing.min_ms})
        print(rows[-1], flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "half-tile-probe.json"), "w") as f:
        json.dump({"device": str(jax.devices()[0]), "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
