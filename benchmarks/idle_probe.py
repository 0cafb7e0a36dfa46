"""Probe (issue 15): is the MoE layer's wall time its kernels' time, or does the GPU sit idle?

The Mixtral layer's fwd+bwd takes 14.4-14.7 ms per call back to back in the layer table, while
a profile of the same function (``layer_profile.py``) sums 13.0 ms of kernels; its forward 4.87
against 4.29 ms. Either the kernels run slower under sustained load (the clock drops at the
power limit, for torch too), or the device idles between kernels (host launches, a wait). Per
preset and pass, after ``--sustain-s`` of calls back to back (the clock settled):

- ``wall_ms``: ms per call of ``--calls`` calls launched back to back, then one wait;
- ``kernels_ms``, ``span_ms``, ``idle_ms`` and the largest gaps: the same calls under the JAX
  profiler (``kernel_profile.summarize`` / ``idle_gaps``);
- ``clock``: ``nvidia-smi``'s SM clock, power and temperature read while calls are queued;
- the plain torch layer's wall time and clock the same way (``--torch``), for the peer's clock.

    PYTHONPATH=src python benchmarks/idle_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
import traceback

from jaxmoe.bench.timing import settle


def gpu_clock() -> str:
    """``nvidia-smi``'s SM clock, power draw and temperature now (empty where there is none)."""
    try:
        return subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def sustained(call, sync, seconds: float, calls: int) -> dict:
    """Runs ``call`` back to back for ``seconds``, then times ``calls`` more launched back to
    back with one wait, reading the clock while they are queued."""
    settle(call, sync, calls, seconds * 1e3)
    t0 = time.perf_counter()
    for _ in range(calls):
        out = call()
    clock = gpu_clock()
    sync(out)
    return {"wall_ms": (time.perf_counter() - t0) * 1e3 / calls, "clock": clock}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", default="mixtral,qwen3")
    parser.add_argument("--passes", default="fwd+bwd,fwd")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--sustain-s", type=float, default=2.0)
    parser.add_argument("--torch", action="store_true", help="also the plain torch layer")
    parser.add_argument("--tag", default="", help="a name for this process's XLA flags")
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    import jaxmoe
    from jaxmoe.bench import kernel_profile
    from jaxmoe.bench.harness import results_header, row_emitter
    from jaxmoe.bench.layer import _torch_case, forward_backward, layer_inputs
    from jaxmoe.bench.presets import LAYER_PRESETS
    from jaxmoe.bench.timing import jax_sync

    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, f"idle-probe{'-' + args.tag if args.tag else ''}.json"),
        results_header(
            " ".join(sys.argv),
            device=str(jax.devices()[0]),
            xla_flags=os.environ.get("XLA_FLAGS", ""),
        ),
    )
    cases = []
    for name in args.presets.split(","):
        preset = LAYER_PRESETS[name]
        cfg, params, x, dy = layer_inputs(preset, jnp.bfloat16)

        def layer(p, x, cfg=cfg):
            return jaxmoe.moe(p, x, cfg)[0]

        for pass_ in args.passes.split(","):
            if pass_ == "fwd":
                fn, fn_args = jax.jit(layer), (params, x)
            else:
                fn, fn_args = jax.jit(forward_backward(layer)), (params, x, dy)
            cases.append((name, pass_, preset, params, x, dy, fn, fn_args))

    for name, pass_, _, _, _, _, fn, fn_args in cases:
        row = {"preset": name, "pass": pass_, "impl": "jaxmoe", "tag": args.tag}
        call = functools.partial(fn, *fn_args)
        try:
            jax.block_until_ready(call())
            row.update(sustained(call, jax_sync, args.sustain_s, args.calls))
            events = kernel_profile.traced_events(fn, *fn_args, calls=args.calls)
            summary = kernel_profile.summarize(events, args.calls, top=8)
            row.update(
                kernels_ms=summary["total_ms"],
                span_ms=summary["span_ms"],
                launches=summary["kernels"],
                **kernel_profile.idle_gaps(events, args.calls, top=8),
                top_ops=[(r["op"], round(r["ms"], 3)) for r in summary["rows"]],
            )
            # The clock right after the trace, and the wall time again (the trace's own cost).
            row["after"] = sustained(call, jax_sync, 0.5, args.calls)
        except Exception as error:  # noqa: BLE001 - a probe row records the failure, goes on
            row["error"] = f"{type(error).__name__}: {error}"[:400]
            traceback.print_exc()
        emit(row)

    if args.torch:
        # Last: once torch has run, the JAX profiler is no longer needed in this process.
        for name, pass_, preset, params, x, dy, _, _ in cases:
            row = {"preset": name, "pass": pass_, "impl": "torch", "tag": args.tag}
            try:
                call, sync, _ = _torch_case(params, x, dy, preset.top_k, jnp.bfloat16, pass_)
                sync(call())
                row.update(sustained(call, sync, args.sustain_s, args.calls))
            except Exception as error:  # noqa: BLE001
                row["error"] = f"{type(error).__name__}: {error}"[:400]
                traceback.print_exc()
            emit(row)


if __name__ == "__main__":
    main()
