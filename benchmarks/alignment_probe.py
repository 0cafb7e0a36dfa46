"""Probe (issue 15): the MoE layer with its expert groups padded to 64 rows against 128, on one GPU.

Per preset and pass (fwd, fwd+bwd), the variants timed in interleaved rounds
(``jaxmoe.bench.timing.time_interleaved``), every output and gradient compared with the first's:
``a128`` (``MoEConfig(alignment=128)``) and ``a64`` (``alignment=64``). With 64-row padding the
forward and dgrad tiles (128 rows) cut by a group boundary run once per group, while the
wgrad, whose contraction blocks are 64 rows, multiplies half the padding. Also records, per
preset, the rows of the bench's routing: useful, and padded to 64 and to 128.

H100 run 14 call 5 ran this probe as ``half_tile_probe.py`` with a third variant, the ``gmm``
multiplying only the 64-row half of a tile that holds a group's last rows (0.92-0.98x
``a128``: removed).

    PYTHONPATH=src python benchmarks/alignment_probe.py --out-dir $OUT
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

    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "alignment-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    variants = {"a128": 128, "a64": 64}

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
        emit({"preset": name, "rows": rows})
        for pass_ in args.passes.split(","):
            if time.time() - start > args.time_budget_s:
                emit({"budget": "stopped", "at": [name, pass_]})
                return
            row = {"preset": name, "pass": pass_}
            try:
                calls, outs = {}, {}
                for variant, alignment in variants.items():
                    vcfg = dataclasses.replace(cfg, alignment=alignment)
                    layer = lambda p, x, vcfg=vcfg: jaxmoe.moe(p, x, vcfg)[0]  # noqa: E731
                    if pass_ == "fwd":
                        fn, fn_args = jax.jit(layer), (params, x)
                    else:
                        fn, fn_args = jax.jit(forward_backward(layer)), (params, x, dy)
                    outs[variant] = jax.tree.leaves(fn(*fn_args))
                    call = lambda fn=fn, fn_args=fn_args: fn(*fn_args)  # noqa: E731
                    calls[variant] = (call, jax_sync, warm_up(call, jax_sync))
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
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
