"""Compile the expert-parallel layer for several GPUs on one GPU (``jax_mock_gpu_topology``) and
read what XLA scheduled: memory per device and whether anything overlaps the exchanges.

For each variant, the DeepSeek-like layer (T=4096 tokens per GPU, H=7168, F=2048, E=32, K=8,
bf16, dropless) is lowered and compiled as a training step (y and every gradient from an input
cotangent) for a mock ``1 x ep x 1`` topology (ep hosts of one GPU each: jax refuses a mock
whose devices per host differ from the local GPU count), and the scheduled HLO of the entry
computation is scanned: for every async all-to-all, how many fusions, custom calls (the grouped
matmul kernels) and GEMMs XLA placed between its start and its done. Nothing is executed.

The reading of the scheduled HLO is :func:`jaxmoe.bench.hlo_schedule.exchange_report` (payload,
op_name scope and the classified ops between each start and done; the sync all-to-alls; the
loops); rerun it on the saved texts with ``python -m jaxmoe.bench.hlo_schedule --markdown``.

Status (H100, jax 0.11.2, 2026-11-24): with ``1x1x4`` jax refuses the topology; with ``1x4x1``
autotuning does not finish (it waits for the mock devices): set
``XLA_FLAGS=--xla_gpu_autotune_level=0`` and the full-size training step compiles in 17-33 s
at ep 4 and 8 (``benchmarks/results/ep-schedule-mock-h100.md``).

    XLA_FLAGS=--xla_gpu_autotune_level=0 PYTHONPATH=src python benchmarks/ep_mock_topology.py \
        --ep 4 --out-dir $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from jaxmoe.bench.hlo_schedule import exchange_report, markdown_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ep", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per GPU")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--variants", default="default,chunks2,worst_case_slots,fast_slots_alone")
    parser.add_argument("--tag", default="", help="suffix of the output files (e.g. the flags)")
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()

    import jax

    jax.config.update("jax_mock_gpu_topology", f"1x{args.ep}x1")  # one GPU per mock host
    import jax.numpy as jnp
    import numpy as np

    import jaxmoe

    started = time.perf_counter()
    devices = jax.devices()
    print(f"{len(devices)} devices in {time.perf_counter() - started:.1f} s: {devices}", flush=True)
    mesh = jax.sharding.Mesh(np.array(devices[: args.ep]), ("ep",))
    base = jaxmoe.MoEConfig(
        num_experts=32,
        top_k=8,
        hidden_size=args.hidden,
        ffn_size=args.ffn,
        score="sigmoid",
        use_expert_bias=True,
        dtype=jnp.bfloat16,
        param_dtype=jnp.bfloat16,
        ep_axis="ep",
    )
    variants = {
        "default": base,
        "chunks2": dataclasses.replace(base, ep_chunks=2),
        "chunks2_copies": dataclasses.replace(base, ep_chunks=2, ep_dispatch="copies"),
        "copies": dataclasses.replace(base, ep_dispatch="copies"),
        "worst_case_slots": dataclasses.replace(base, ep_fast_slot_factor=None),
        "fast_slots_alone": dataclasses.replace(base, ep_receive_factor=1.125),
    }
    params = jax.eval_shape(lambda: jaxmoe.init_params(jax.random.key(0), base))
    x = jax.ShapeDtypeStruct((args.ep * args.tokens, base.hidden_size), jnp.bfloat16)
    results = {
        "devices": [str(d) for d in devices],
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", *sys.argv]),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "variants": {},
    }
    for name in args.variants.split(","):
        cfg, row = variants[name], {}
        print(f"compiling {name}", flush=True)
        try:
            # A training step's shape: y and every gradient from a cotangent that is an input
            # (with sum(y) the cotangent is a constant, and XLA sends it before the forward).
            def step(p, x, dy, cfg=cfg):
                y, pullback = jax.vjp(lambda p, x: jaxmoe.moe(p, x, cfg, mesh=mesh)[0], p, x)
                return y, pullback(dy)

            started = time.perf_counter()
            compiled = jax.jit(step).lower(params, x, x).compile()
            row["compile_s"] = round(time.perf_counter() - started, 1)
            memory = compiled.memory_analysis()
            row["temp_gb"] = memory.temp_size_in_bytes / 1e9
            row["argument_gb"] = memory.argument_size_in_bytes / 1e9
            hlo = compiled.as_text()
            row.update(exchange_report(hlo))
            print(markdown_table(row), flush=True)
            with open(os.path.join(args.out_dir, f"hlo-{name}{args.tag}.txt"), "w") as f:
                f.write(hlo)
        except Exception as error:  # noqa: BLE001 - a variant's failure is a result
            row["error"] = f"{type(error).__name__}: {str(error)[:400]}"
        results["variants"][name] = row
        lists = ("exchanges", "sync_exchanges", "loops")
        print(name, json.dumps({k: v for k, v in row.items() if k not in lists}), flush=True)
    with open(os.path.join(args.out_dir, f"ep-mock-topology-ep{args.ep}{args.tag}.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
