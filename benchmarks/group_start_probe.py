"""Probe (issue 15): the MoE layer with every Mosaic kernel's tiles starting at each group's first
row (``MosaicTileConfig(group_start_tiles=True)``, the default since H100 run 18) against the
global 128-row grid.

The layer pads each expert's rows to 64, so on the grid about a quarter of the groups (those
starting 64 rows off a grid line with a multiple of 128 rows) take one tile more than from their
first row: ~3% more work in the forward and dgrad products (Mixtral and DeepSeek), ~6% on
Qwen3 (counted with ``jaxmoe.ops.grouped_matmul.work_list`` on multinomial routings).

Per preset and pass (``fwd``: ``jit(moe)``; ``fwd+bwd``: the layer bench's ``jit`` of the VJP):
both variants built by swapping the default-tile functions the layer reads (the plain gmm's,
the fused gated kernel's) and tracing afresh (jax's tracing caches cleared: run 18 call 1's
forward rows, before that, compared one trace with itself), outputs and gradients compared
(the same K order per row: expected bitwise equal), then timed in the same settled
interleaved rounds. Rows go to ``<out-dir>/<stem>.json`` (``group-start-probe``).

Other tile changes compare the same way (``--variants``, a JSON object of variant name to
``MosaicTileConfig`` changes; the speedup is the second's against the first). Session 19, the
weight block multicast in clusters of two CTAs::

    PYTHONPATH=src python benchmarks/group_start_probe.py --out-dir $OUT --stem multicast \
        --variants '{"default": {}, "multicast": {"multicast_weights": true}}'
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import jax

import jaxmoe
from jaxmoe.bench.harness import relative_error, results_header, row_emitter
from jaxmoe.bench.layer import expert_flops, forward_backward, layer_inputs
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.tile_variants import compile_variant, tile_sites
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--presets", default="mixtral,dsv3,qwen3")
    parser.add_argument("--passes", default="fwd,fwd+bwd")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--time-budget-s", type=float, default=400)
    parser.add_argument("--stem", default="group-start-probe")
    parser.add_argument(
        "--sites",
        default="gmm,gated",
        help="whose default tiles change: the plain gmm's (gmm), the fused gated kernel's (gated)",
    )
    parser.add_argument(
        "--variants",
        default='{"grid": {"group_start_tiles": false}, '
        '"group_start": {"group_start_tiles": true}}',
        help="JSON: variant name -> MosaicTileConfig changes applied to the --sites' defaults",
    )
    args = parser.parse_args()
    variants = json.loads(args.variants)
    sites = tile_sites(args.sites)
    base_name, variant_name = list(variants)[:2]
    start = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, f"{args.stem}.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    for preset_name in args.presets.split(","):
        preset = LAYER_PRESETS[preset_name]
        inputs = None  # the preset's config, parameters and data, built once for both passes
        for pass_ in args.passes.split(","):
            if time.time() - start > args.time_budget_s:
                emit({"budget": "stopped", "at": [preset_name, pass_]})
                return
            row = {"preset": preset_name, "pass": pass_}
            try:
                inputs = inputs or layer_inputs(preset, jax.numpy.bfloat16)
                cfg, params, x, dy = inputs
                layer = lambda p, x, cfg=cfg: jaxmoe.moe(p, x, cfg)[0]  # noqa: E731
                operands = (params, x) if pass_ == "fwd" else (params, x, dy)
                calls, outs = {}, {}
                for name, changes in variants.items():
                    fn, tiles_read = compile_variant(
                        layer if pass_ == "fwd" else forward_backward(layer),
                        operands,
                        sites,
                        changes,
                    )
                    outs[name] = jax.block_until_ready(fn(*operands))
                    row[f"{name}_tiles_read"] = len(tiles_read)
                    call = lambda fn=fn, args=operands: fn(*args)  # noqa: E731
                    calls[name] = (call, jax_sync, warm_up(call, jax_sync))
                # Every variant's outputs against the first's.
                leaves = zip(*(jax.tree.leaves(outs[name]) for name in variants), strict=True)
                row["max_rel_diff"] = max(
                    relative_error(first, other) for first, *others in leaves for other in others
                )
                flops = expert_flops(preset, pass_)
                for name, timing in time_interleaved(calls, rounds=args.rounds).items():
                    row[f"{name}_ms"] = timing.median_ms
                    row[f"{name}_tflops"] = flops / timing.median_ms / 1e9
                row["speedup"] = row[f"{base_name}_ms"] / row[f"{variant_name}_ms"]
            except Exception as error:  # noqa: BLE001 - the probe records failures and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)


if __name__ == "__main__":
    main()
