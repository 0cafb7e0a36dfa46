"""Probe (issue 15): how an H100's clock follows the load, and what that does to timings.

H100 run 15 call 1 found the Mixtral layer's fwd+bwd kernels back to back with no idle time, the
GPU at its 700 W limit, and SM clock snapshots of 1200-1350 MHz under jaxmoe's kernels against
1515 MHz under torch's. A sample taken right after another load starts at that load's clock,
so timings interleaved in ~100 ms samples (the benches' rounds) may not be what a loop of one
function alone sees. Per contender:

- ``from_idle``: after ``--idle-s`` of sleep, ``--samples`` consecutive samples (each ~20 ms of
  calls back to back, then a wait): ms per call against the time since the load began;
- ``after_<peer>``: the same right after ``--load-s`` of the peer's calls;
- ``steady``: the median of samples taken after ``--load-s`` of its own load, and the clock.

Contenders: the Mixtral layer fwd+bwd (``layer-jaxmoe``, ``layer-torch``) and the Mixtral-up
forward product (``gemm-jaxmoe``, ``gemm-torch`` = ``torch._grouped_mm``, ``gemm-dense`` =
``jnp.dot`` of the same FLOPs on cuBLAS), balanced groups.

    PYTHONPATH=src python benchmarks/clock_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from idle_probe import gpu_clock  # noqa: E402 - the probes' one clock reader


def samples_after(call, sync, inner: int, count: int) -> list[tuple[float, float]]:
    """``count`` consecutive samples: ``(seconds since the first began, ms per call)``."""
    curve, start = [], time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = call()
        sync(out)
        t1 = time.perf_counter()
        curve.append((round(t0 - start, 4), round((t1 - t0) * 1e3 / inner, 4)))
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--idle-s", type=float, default=1.5)
    parser.add_argument("--load-s", type=float, default=2.0)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--preset", default="mixtral", help="the layer preset")
    parser.add_argument("--shape", default="mixtral-up", help="the gemm shape")
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    import jaxmoe
    from jaxmoe.bench.gemm import group_sizes_for
    from jaxmoe.bench.gemm_cases import jax_case, torch_case, torch_unavailable
    from jaxmoe.bench.harness import results_header, row_emitter
    from jaxmoe.bench.layer import _torch_case, forward_backward, layer_inputs
    from jaxmoe.bench.presets import GEMM_SHAPES, LAYER_PRESETS
    from jaxmoe.bench.timing import jax_sync, settle, warm_up

    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "clock-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )

    preset = LAYER_PRESETS[args.preset]
    cfg, params, x, dy = layer_inputs(preset, jnp.bfloat16)
    layer_fn = jax.jit(forward_backward(lambda p, x: jaxmoe.moe(p, x, cfg)[0]))
    shape = GEMM_SHAPES[args.shape]
    sizes = group_sizes_for(shape, "balanced")
    gemm_fn, gemm_args, _, _ = jax_case("jaxmoe", None, shape, sizes, "fwd", jnp.bfloat16, 0)
    dense_x = jnp.ones((shape.m, shape.k), jnp.bfloat16)
    dense_w = jnp.ones((shape.k, shape.n), jnp.bfloat16) / shape.k
    dense_fn = jax.jit(jnp.dot)
    calls = {
        "layer-jaxmoe": (lambda: layer_fn(params, x, dy), jax_sync),
        "gemm-jaxmoe": (lambda: gemm_fn(*gemm_args), jax_sync),
        "gemm-dense": (lambda: dense_fn(dense_x, dense_w), jax_sync),
    }
    if torch_unavailable() is None:
        layer_torch, torch_sync, _ = _torch_case(
            params, x, dy, preset.top_k, jnp.bfloat16, "fwd+bwd"
        )
        gemm_torch, _, _, _ = torch_case(shape, sizes, "fwd", "bfloat16", 0)
        calls.update(
            {"layer-torch": (layer_torch, torch_sync), "gemm-torch": (gemm_torch, torch_sync)}
        )
    peers = {
        "layer-jaxmoe": "layer-torch",
        "layer-torch": "layer-jaxmoe",
        "gemm-jaxmoe": "gemm-torch",
        "gemm-torch": "gemm-jaxmoe",
        "gemm-dense": "gemm-torch",
    }
    ready = {name: (call, sync, warm_up(call, sync)) for name, (call, sync) in calls.items()}
    for name, (call, sync, inner) in ready.items():
        row = {"contender": name, "inner": inner}
        try:
            settle(call, sync, inner, args.load_s * 1e3)
            steady = samples_after(call, sync, inner, 10)
            row["steady_ms"] = statistics.median(ms for _, ms in steady)
            row["steady_clock"] = gpu_clock()
            time.sleep(args.idle_s)
            row["from_idle"] = samples_after(call, sync, inner, args.samples)
            if peers[name] not in ready:  # no torch here
                emit(row)
                continue
            peer_call, peer_sync, peer_inner = ready[peers[name]]
            settle(peer_call, peer_sync, peer_inner, args.load_s * 1e3)
            row["peer_clock"] = gpu_clock()
            row[f"after_{peers[name]}"] = samples_after(call, sync, inner, args.samples)
            for key in ("from_idle", f"after_{peers[name]}"):
                first = [ms for _, ms in row[key][:5]]
                row[f"{key}_first5_over_steady"] = statistics.mean(first) / row["steady_ms"]
        except Exception as error:  # noqa: BLE001 - a probe row records the failure, goes on
            row["error"] = f"{type(error).__name__}: {error}"[:400]
            traceback.print_exc()
        emit(row)


if __name__ == "__main__":
    main()
