"""Probe (issue 15): the gated FFN's input gradient ``gate_bar Wg^T + up_bar Wu^T`` as one Mosaic
kernel (``pallas_mosaic.gmm_pair``, transposed weights) against the two Mosaic dgrads and XLA's
sum, on one GPU.

Per layer preset (``M = tokens * top_k`` rows, ``[M, F] x [G, H, F]^T`` twice), balanced and
skewed (Dirichlet 0.3, two groups forced empty, 77 rows past the sum): both against a float32
reference (one float32 dot per group and weight); rows past the groups must be zero. Balanced:
both timed in interleaved rounds (settled). Rows go to ``<out-dir>/input-dgrad-probe.json``.
The layer with it: ``glu_dgrad_probe.py --phases layer --layer-variants unfused,input_dgrad``.

    PYTHONPATH=src python benchmarks/input_dgrad_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--presets", default="mixtral,dsv3,qwen3")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--time-budget-s", type=float, default=300)
    args = parser.parse_args()
    start = time.time()

    from jaxmoe.bench.gemm import hard_group_sizes
    from jaxmoe.bench.harness import relative_error, results_header, row_emitter
    from jaxmoe.bench.presets import LAYER_PRESETS
    from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
    from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as fused_mosaic
    from jaxmoe.ops.gated_grouped_matmul import primitives as gated_primitives
    from jaxmoe.ops.grouped_matmul import resolve_backend

    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "input-dgrad-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    kernel = fused_mosaic.PallasMosaicGatedGroupedMatmul(
        grouped=resolve_backend("auto"), fused_input_dgrad=True
    )
    variants = {
        "fused": jax.jit(kernel.input_dgrad),
        "unfused": jax.jit(lambda *a: gated_primitives.unfused_input_dgrad(*a, kernel=kernel)),
    }

    def reference(gate_bar, up_bar, gate_w, up_w, sizes):
        """float32, one dot per group and weight (static bounds)."""
        bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes))])

        @jax.jit
        def run(gate_bar, up_bar, gate_w, up_w):
            parts = [
                jnp.dot(gate_bar[lo:hi], gate_w[e].T, preferred_element_type=jnp.float32)
                + jnp.dot(up_bar[lo:hi], up_w[e].T, preferred_element_type=jnp.float32)
                for e, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
            ]
            return jnp.concatenate(parts)

        return run(gate_bar, up_bar, gate_w, up_w)

    for name in args.presets.split(","):
        preset = LAYER_PRESETS[name]
        m, h, f, g = (
            preset.tokens * preset.top_k,
            preset.hidden_size,
            preset.ffn_size,
            preset.num_experts,
        )
        keys = jax.random.split(jax.random.key(0), 4)
        gate_bar, up_bar = (jax.random.normal(key, (m, f), jnp.bfloat16) for key in keys[:2])
        gate_w, up_w = (
            (jax.random.normal(key, (g, h, f)) / np.sqrt(f)).astype(jnp.bfloat16)
            for key in keys[2:]
        )
        for routing in ("balanced", "skewed"):
            if time.time() - start > args.time_budget_s:
                emit({"budget": "stopped", "at": [name, routing]})
                return
            row = {"preset": name, "routing": routing, "m": m, "h": h, "f": f, "g": g}
            try:
                sizes = jnp.asarray(
                    np.full(g, m // g, np.int32)
                    if routing == "balanced"
                    else hard_group_sizes(m, g)
                )
                operands = (gate_bar, up_bar, gate_w, up_w, sizes)
                row["kernel_unsupported_reason"] = kernel.input_dgrad_unsupported_reason(
                    gate_bar, gate_w, sizes
                )
                end = int(sizes.sum())
                want = reference(*operands)
                for variant, fn in variants.items():
                    got = fn(*operands)
                    row[f"{variant}_rel_err"] = relative_error(got[:end], want)
                    row[f"{variant}_tail_zero"] = bool(jnp.all(got[end:] == 0))
                del want
                if routing == "balanced":
                    contenders = {}
                    for variant, fn in variants.items():
                        call = lambda fn=fn, operands=operands: fn(*operands)  # noqa: E731
                        contenders[variant] = (call, jax_sync, warm_up(call, jax_sync))
                    timings = time_interleaved(contenders, rounds=args.rounds)
                    for variant, timing in timings.items():
                        row[f"{variant}_ms"] = timing.median_ms
                        row[f"{variant}_tflops"] = 2 * 2 * m * h * f / timing.median_ms / 1e9
                    row["speedup"] = row["unfused_ms"] / row["fused_ms"]
            except Exception as error:  # noqa: BLE001 - a probe reports and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)


if __name__ == "__main__":
    main()
