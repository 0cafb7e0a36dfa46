"""Why a user's own timing of ``jaxmoe.moe`` can differ from ``jaxmoe bench layer`` (issue 15).

Times the public API the ways people write it, for each layer preset, in one process:

* ``pipelined``: the bench's timer (``jaxmoe.bench.timing.time_jax``: calls back to back, one
  sync per sample), ``jit(lambda p, x: moe(p, x, cfg)[0])``;
* ``per_call_sync``: ``fn(...).block_until_ready()`` around every call (median of 30);
* ``full_output``: pipelined, but the jitted function returns ``(y, stats)`` as ``moe`` does;
* ``grad``: ``jit(grad(loss, argnums=(0, 1)))`` with ``loss = sum(y * dy)`` (no ``y`` returned),
  against the bench's ``jit(vjp)`` returning ``y`` and all gradients;
* ``fwd_f32_params``: ``param_dtype`` float32 (the default) with bf16 compute;
* ``host_dispatch``: host milliseconds for one ``fn(...)`` call to return (no sync) while the
  device is idle: the launch cost a per-call sync adds, as far as the host sees it.

Writes ``layer-timing.json`` under ``--out-dir``.
    PYTHONPATH=src python3 benchmarks/layer_timing_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe.bench.harness import results_header
from jaxmoe.bench.layer import layer_config
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.timing import host_launch_ms, time_jax


def per_call_sync_ms(fn, *args, repeats=30):
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def entry_op_counts(fn, fn_args) -> dict:
    """How many of each op the compiled entry computation launches (fusions, custom calls, ...)."""
    text = fn.lower(*fn_args).compile().as_text()
    entry = text[text.index("ENTRY") :]
    entry = entry[: entry.index("\n}")]
    ops = re.findall(r"= \S+ ([a-z][a-z0-9-]*)\(", entry)
    return dict(collections.Counter(ops).most_common())


def preset_cases(name: str) -> dict:
    """The jitted callables and their arguments for one preset."""
    preset = LAYER_PRESETS[name]
    cfg = layer_config(preset, jnp.bfloat16)
    kp, kx, kd = jax.random.split(jax.random.key(0), 3)
    params = jaxmoe.init_params(kp, cfg)
    x = jax.random.normal(kx, (preset.tokens, preset.hidden_size), jnp.float32)
    x = x.astype(jnp.bfloat16)
    dy = jax.random.normal(kd, x.shape, jnp.float32).astype(jnp.bfloat16)

    forward = jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg)[0])
    # A config that says dtype=bf16 but leaves param_dtype at its float32 default: every call
    # casts the expert weights.
    cfg32 = dataclasses.replace(cfg, param_dtype=jnp.float32)
    params32 = jax.tree.map(lambda w: w.astype(jnp.float32), params)
    forward32 = jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg32)[0])
    full = jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg))

    def loss(p, x):
        return jnp.sum(jaxmoe.moe(p, x, cfg)[0].astype(jnp.float32) * dy.astype(jnp.float32))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))

    def fwd_bwd(p, x, dy):
        y, vjp = jax.vjp(lambda p, x: jaxmoe.moe(p, x, cfg)[0], p, x)
        return y, *vjp(dy)

    vjp_fn = jax.jit(fwd_bwd)
    cases = {
        "fwd": (forward, (params, x)),
        "fwd_full_output": (full, (params, x)),
        "fwd_f32_params": (forward32, (params32, x)),
        "grad": (grad, (params, x)),
        "vjp_bench": (vjp_fn, (params, x, dy)),
    }
    return cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="timing-probe")
    parser.add_argument("--presets", default="qwen3,mixtral,dsv3")
    parser.add_argument("--cases", default="", help="comma list of case names (default: all)")
    parser.add_argument(
        "--tag", default="", help="names the output file and rows (e.g. the XLA_FLAGS)"
    )
    args = parser.parse_args(argv)
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []

    def record(**row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        payload = {**results_header("python3 benchmarks/layer_timing_probe.py"), "rows": rows}
        stem = f"layer-timing{'-' + args.tag if args.tag else ''}"
        (out_dir / f"{stem}.json").write_text(json.dumps(payload, indent=1))

    for name in args.presets.split(","):
        cases = preset_cases(name)
        for case, (fn, fn_args) in cases.items():
            if args.cases and case not in args.cases.split(","):
                continue
            try:
                pipelined = time_jax(fn, *fn_args).median_ms
                synced = per_call_sync_ms(fn, *fn_args)
                dispatch = host_launch_ms(fn, *fn_args)
                record(
                    preset=name,
                    case=case,
                    tag=args.tag,
                    xla_flags=os.environ.get("XLA_FLAGS", ""),
                    entry_ops=entry_op_counts(fn, fn_args),
                    pipelined_ms=pipelined,
                    per_call_sync_ms=synced,
                    host_dispatch_ms=dispatch,
                    sync_over_pipelined=synced / pipelined,
                )
            except Exception as error:  # noqa: BLE001 - record and go on
                record(preset=name, case=case, error=f"{type(error).__name__}: {error}"[:300])
    return 0


if __name__ == "__main__":
    sys.exit(main())
