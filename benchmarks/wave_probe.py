"""Probe (issue 15): what the last, partly full wave of a long-K grouped matmul costs on the GPU.

The Mixtral down projection (``[M, 14336] x [8, 14336, 4096]``) has ``M / 128 * 16`` output tiles
of ``128 x 256`` on 132 SMs: ~1100 tiles, 8.3 waves, so its 9th wave runs ~30% full. This times
the Mosaic ``gmm`` (the default tiles) at row counts of whole 128-row tiles per group (no tile cut
by a group boundary) around 8 and 9 full waves, every count in the same settled interleaved
rounds. If the time steps with ``ceil(tiles / SMs)`` rather than growing with ``tiles``, a
stream-K or split-K last wave is worth building; the rows say how much (``ms_per_wave``,
``ms_per_tile``). Rows go to ``<out-dir>/wave-probe.json``.

    PYTHONPATH=src python benchmarks/wave_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--k", type=int, default=14336)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--m-tiles", default="64,66,67,68,70,72,74,75")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    start = time.time()

    from jaxmoe.bench.harness import results_header, row_emitter
    from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
    from jaxmoe.ops.grouped_matmul import pallas_mosaic

    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "wave-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    block_m, block_n = 128, 256
    sms = jax.devices()[0].core_count if hasattr(jax.devices()[0], "core_count") else 132
    m_tiles = [int(t) for t in args.m_tiles.split(",")]
    kx, kw = jax.random.split(jax.random.key(0))
    rhs = jax.random.normal(kw, (args.groups, args.k, args.n), jnp.bfloat16)
    lhs_all = jax.random.normal(kx, (max(m_tiles) * block_m, args.k), jnp.bfloat16)
    gmm = jax.jit(pallas_mosaic.gmm)
    contenders, shapes = {}, {}
    for tiles_m in m_tiles:
        base, extra = divmod(tiles_m, args.groups)
        per_group = [base + (g < extra) for g in range(args.groups)]
        sizes = jnp.asarray(np.asarray(per_group, np.int32) * block_m)
        lhs = lhs_all[: tiles_m * block_m]
        call = lambda lhs=lhs, sizes=sizes: gmm(lhs, rhs, sizes)  # noqa: E731
        name = f"m_tiles={tiles_m}"
        contenders[name] = (call, jax_sync, warm_up(call, jax_sync))
        tiles = tiles_m * (args.n // block_n)
        shapes[name] = (tiles_m, tiles)
    for name, timing in time_interleaved(contenders, rounds=args.rounds).items():
        tiles_m, tiles = shapes[name]
        waves = math.ceil(tiles / sms)
        emit(
            {
                "m": tiles_m * block_m,
                "k": args.k,
                "n": args.n,
                "tiles": tiles,
                "sms": sms,
                "waves": waves,
                "fill_of_last_wave": round(tiles / sms - (waves - 1), 3),
                "ms": timing.median_ms,
                "min_ms": timing.min_ms,
                "ms_per_wave": timing.median_ms / waves,
                "ms_per_tile": timing.median_ms / tiles,
                "tflops": 2 * tiles_m * block_m * args.k * args.n / timing.median_ms / 1e9,
            }
        )
    emit({"done": True, "elapsed_s": round(time.time() - start, 1)})


if __name__ == "__main__":
    main()
