"""The layer's per-call latency against its steady per-call time, as a user's loop sees them
(issue 15: session 8 found the old bench's fwd+bwd ``ms`` 2.5 ms above the kernels' own time;
one call alone is 14.5 ms on Mixtral, 16 in a row 15.6 ms each: the clock drops under load).

For each preset and pass, times ``n`` calls of the bench's jitted function launched back to back
and then waited for, for several ``n``: the slope of a least-squares line through (n, ms) is the
steady per-call time of a training loop; its intercept is the fixed latency a sync adds (the
host's launch of the first call plus the wait). Also the host's time for one call to return
(device idle before), and, from one profiled call, the longest host-side events (what the host
does before the device starts). Writes ``launch-latency.json`` under ``--out-dir``::

    PYTHONPATH=src python3 benchmarks/launch_latency_probe.py --out-dir /tmp/w
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe.bench.harness import results_header
from jaxmoe.bench.layer import forward_backward, layer_inputs
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.timing import host_launch_ms


def batch_ms(fn, args, n, repeats=5):
    """Median ms of ``n`` back-to-back calls then one sync."""
    samples = []
    for _ in range(repeats):
        jax.block_until_ready(fn(*args))
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def fit(points):
    xs, ys = zip(*points, strict=True)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def host_events(fn, args, top=15):
    """The longest host events of one profiled call, per name (ms summed)."""
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir):
            t0 = time.perf_counter_ns()
            jax.block_until_ready(fn(*args))
            wall_ms = (time.perf_counter_ns() - t0) / 1e6
        path = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)[0]
        data = jax.profiler.ProfileData.from_file(path)
        total = collections.defaultdict(float)
        first_kernel_ns, first_host_ns = None, None
        for plane in data.planes:
            for line in plane.lines:
                for event in line.events:
                    if plane.name.startswith("/device:"):
                        if line.name.startswith("Stream"):
                            start = event.start_ns
                            first_kernel_ns = min(first_kernel_ns or start, start)
                        continue
                    if plane.name.startswith("/host:CPU"):
                        total[f"{line.name[:24]}: {event.name[:90]}"] += event.duration_ns / 1e6
                        start = event.start_ns
                        first_host_ns = min(first_host_ns or start, start)
    ordered = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return {"wall_ms": wall_ms, "events_ms": ordered}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", default="mixtral,dsv3")
    parser.add_argument("--out-dir", default=".")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    rows = []
    for name in args.presets.split(","):
        preset = LAYER_PRESETS[name]
        cfg, params, x, dy = layer_inputs(preset, jnp.bfloat16)

        def forward(params, x, cfg=cfg):
            return jaxmoe.moe(params, x, cfg)[0]

        def loss_grad(params, x, dy):
            return jax.grad(lambda p, x: jnp.sum(forward(p, x) * dy), argnums=(0, 1))(params, x)  # noqa: B023

        cases = {
            "fwd": (jax.jit(forward), (params, x)),
            "fwd+bwd": (jax.jit(forward_backward(forward)), (params, x, dy)),
            "grad": (jax.jit(loss_grad), (params, x, dy)),
        }
        for pass_, (fn, operands) in cases.items():
            jax.block_until_ready(fn(*operands))
            points = [(n, batch_ms(fn, operands, n)) for n in (1, 2, 4, 8, 16)]
            slope, intercept = fit(points)
            row = {
                "preset": name,
                "pass": pass_,
                "tag": args.tag,
                "batch_ms": points,
                "steady_ms": slope,
                "latency_ms": intercept,
                "host_launch_ms": host_launch_ms(fn, *operands),
                "host_events": host_events(fn, operands),
            }
            rows.append(row)
            print(
                f"{name} {pass_} {args.tag}: steady {slope:.3f} ms/call, latency "
                f"{intercept:.3f} ms, host launch {row['host_launch_ms']:.3f} ms, "
                f"n=1 {points[0][1]:.3f} ms",
                flush=True,
            )
            for event, ms in row["host_events"]["events_ms"][:8]:
                print(f"    {ms:8.3f} ms  {event}")
    out = pathlib.Path(args.out_dir) / f"launch-latency{args.tag}.json"
    out.write_text(
        json.dumps({"header": results_header("launch_latency_probe.py"), "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
