"""Probe (issue 15): the MoE layer with its expert groups padded to 64 rows instead of 128 and the
Mosaic ``gmm``'s half tiles (a tile whose rows lie in one 64-row half multiplies only that half),
against today's default (128-row padding), on one GPU.

Per preset and pass (fwd, fwd+bwd), three variants timed in interleaved rounds
(``jaxmoe.bench.timing.time_interleaved``), every output and gradient compared with the
default's first:

* ``a128``: the default (``MoEConfig.alignment`` None: 128 rows on a GPU);
* ``a64``: ``alignment=64``, the default tiles (tiles cut by a group boundary run once per
  group; the wgrad's 64-row contraction blocks skip the padding saved);
* ``a64half``: ``alignment=64`` and ``MosaicTileConfig(half_tiles=True)`` for the ``gmm``.

Also prints, per preset, the rows the nine grouped matmuls multiply for the bench's routing
(useful rows, and with each padding and tile rule).

    PYTHONPATH=src python benchmarks/half_tile_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", default="mixtral,dsv3,qwen3")
    parser.add_argument("--passes", default="fwd+bwd,fwd")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--time-budget-s", type=float, default=480)
    args = parser.parse_args()
    start = time.time()

    import jax
    import jax.numpy as jnp

    import jaxmoe
    from jaxmoe import router
    from jaxmoe.bench.harness import relative_error, results_header, row_emitter
    from jaxmoe.bench.layer import expert_flops, forward_backward, layer_inputs
    from jaxmoe.bench.presets import LAYER_PRESETS
    from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
    from jaxmoe.ops.grouped_matmul import pallas_mosaic_backend

    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "half-tile-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    default_tiles = pallas_mosaic_backend.default_mosaic_gmm_tiles

    def half_tiles(m, k, n):
        return dataclasses.replace(default_tiles(m, k, n), half_tiles=True)

    variants = {
        "a128": (None, default_tiles),
        "a64": (64, default_tiles),
        "a64half": (64, half_tiles),
    }

    for name in args.presets.split(","):
        preset = LAYER_PRESETS[name]
        cfg, params, x, dy = layer_inputs(preset, jnp.bfloat16)
        logits = router.router_logits(x, params["router"]["kernel"])
        counts = np.bincount(
            np.asarray(router.route(logits, cfg).experts).ravel(), minlength=cfg.num_experts
        )
        rows = {"useful": int(counts.sum())}
        for align in (64, 128):
            padded = (counts + align - 1) // align * align
            rows[f"padded{align}"] = int(padded.sum())
        padded = (counts + 63) // 64 * 64
        rows["a64half_gmm"] = int(sum(p // 128 * 128 + 64 * (p % 128 > 0) for p in padded))
        emit({"preset": name, "rows": rows})
        for pass_ in args.passes.split(","):
            if time.time() - start > args.time_budget_s:
                emit({"budget": "stopped", "at": [name, pass_]})
                return
            row = {"preset": name, "pass": pass_}
            try:
                calls, outs = {}, {}
                for variant, (alignment, tiles) in variants.items():
                    pallas_mosaic_backend.default_mosaic_gmm_tiles = tiles
                    vcfg = dataclasses.replace(cfg, alignment=alignment)
                    layer = lambda p, x, vcfg=vcfg: jaxmoe.moe(p, x, vcfg)[0]  # noqa: E731
                    if pass_ == "fwd":
                        fn, fn_args = jax.jit(layer), (params, x)
                    else:
                        fn, fn_args = jax.jit(forward_backward(layer)), (params, x, dy)
                    outs[variant] = jax.tree.leaves(fn(*fn_args))
                    call = lambda fn=fn, fn_args=fn_args: fn(*fn_args)  # noqa: E731
                    calls[variant] = (call, jax_sync, warm_up(call, jax_sync))
                pallas_mosaic_backend.default_mosaic_gmm_tiles = default_tiles
                for variant in variants:
                    pairs = zip(outs[variant], outs["a128"], strict=True)
                    row[f"{variant}_max_rel_diff"] = max(relative_error(a, b) for a, b in pairs)
                timings = time_interleaved(calls, rounds=args.rounds)
                flops = expert_flops(preset, pass_)
                for variant, timing in timings.items():
                    row[f"{variant}_ms"] = timing.median_ms
                    row[f"{variant}_tflops"] = flops / timing.median_ms / 1e9
                    row[f"{variant}_speedup"] = timings["a128"].median_ms / timing.median_ms
            except Exception as error:  # noqa: BLE001 - the probe records failures and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            finally:
                pallas_mosaic_backend.default_mosaic_gmm_tiles = default_tiles
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
