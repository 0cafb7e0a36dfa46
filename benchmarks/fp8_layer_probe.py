"""Where the FP8 layer's time goes (issue 20): the Mixtral and DeepSeek layers with
``fp8_recipe="rowwise"``, forward and forward+backward, with the K-major FP8 weights written by a
separate bf16 transpose pass (``quantize_weights(k_major=True)``, the default on a GPU) and
without it (the kernel's own swap fused into the cast, as before session 7), next to the bf16
layer; all timed in interleaved rounds (:func:`jaxmoe.bench.timing.time_interleaved`).

H100 run 8 call 4 measured the first layout's Mixtral forward 8.16 ms (10.19 before) but its
forward+backward 18.85 ms (17.27 before): this probe tells the two layouts apart in one run.
Writes ``fp8-layer-probe.json`` under ``--out-dir``.
    PYTHONPATH=src python3 benchmarks/fp8_layer_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe.bench.harness import results_header
from jaxmoe.bench.layer import layer_config
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
from jaxmoe.ops.fp8.pallas_mosaic_backend import PallasMosaicScaledGroupedMatmul


def layer_fns(cfg, params, x, dy):
    def forward(params, x):
        return jaxmoe.moe(params, x, cfg)[0]

    def grads(params, x):
        return jax.grad(lambda p, x: jnp.sum(forward(p, x) * dy), argnums=(0, 1))(params, x)

    return {"fwd": jax.jit(forward), "fwd+bwd": jax.jit(grads)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", default="mixtral,dsv3")
    parser.add_argument("--out-dir", default="fp8-layer-probe")
    args = parser.parse_args()
    rows = []
    k_major = PallasMosaicScaledGroupedMatmul.k_major_weights
    for name in args.presets.split(","):
        preset = LAYER_PRESETS[name]
        bf16 = layer_config(preset, jnp.bfloat16)
        fp8 = dataclasses.replace(bf16, fp8_recipe="rowwise")
        params = jaxmoe.init_params(jax.random.key(0), bf16)
        x = jax.random.normal(jax.random.key(1), (preset.tokens, bf16.hidden_size), jnp.bfloat16)
        dy = jax.random.normal(jax.random.key(2), x.shape, jnp.bfloat16)
        variants = {"bf16": (bf16, True), "fp8_kmajor_pass": (fp8, True), "fp8_fused": (fp8, False)}
        for pass_ in ("fwd", "fwd+bwd"):
            contenders = {}
            for label, (cfg, separate_pass) in variants.items():
                # The property is read while tracing: compile each variant under its setting.
                PallasMosaicScaledGroupedMatmul.k_major_weights = property(
                    lambda self, on=separate_pass: on
                )
                fn = layer_fns(cfg, params, x, dy)[pass_]
                call = functools.partial(fn, params, x)
                contenders[label] = (call, jax_sync, warm_up(call, jax_sync))
            PallasMosaicScaledGroupedMatmul.k_major_weights = k_major
            for label, timing in time_interleaved(contenders, rounds=10).items():
                row = {"preset": name, "pass": pass_, "impl": label, "ms": timing.median_ms}
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8-layer-probe.json").write_text(
        json.dumps({**results_header(" ".join(["python3", *sys.argv])), "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
