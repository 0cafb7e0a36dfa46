"""Probe (issue 15): the SM clock and power of the MoE layer under tile variants, phase by phase.

At the 700 W limit a kernel's speed is its energy per unit of work: a variant that draws more
power runs every kernel of the layer at a lower clock, also those it did not change (run 21
call 13: with the weight multicast on the plain gmm, the profiled fwd+bwd had all its Mosaic
kernels 5-10% slower, the memory-bound XLA fusions not). Here each variant (its default tiles
changed on ``--sites``' kernels, :mod:`jaxmoe.bench.tile_variants`) runs the layer alone in
phases of ``--phase-s`` seconds, alternating (A, B, A, B, ...), while ``nvidia-smi`` is read
every ``--smi-period-s``: per phase, ms per call over its last two thirds, and the median SM
clock and power draw over the same span; then one row with each variant's median over its
phases and its speedup over the default's. Rows go to ``<out-dir>/variant-clock-probe.json``::

    PYTHONPATH=src python benchmarks/variant_clock_probe.py --out-dir $OUT \\
        --variants '{"multicast": {"multicast_weights": true}}' --sites gated --pass fwd

(the plain gmm's default multicasts on Mixtral since session 22; the fused gated kernel runs
in the forward only, since under ``jax.grad`` the gate and up projections are plain gmm calls
that keep their residuals; ``--sites wgrad`` with ``{"multicast_rhs": true}`` the wgrad's
clusters). ``--backend-variants`` (a JSON object of variant name to fields of the layer's gated
FFN backend, :func:`jaxmoe.bench.tile_variants.gated_backend_with`) adds variants of the
backend instead, e.g. without the fused down dgrad (on by default since session 31)::

    PYTHONPATH=src python benchmarks/variant_clock_probe.py --out-dir $OUT --variants '{}' \
        --backend-variants '{"unfused_backward": {"fused_backward": false}}' --phases 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import jax

import jaxmoe
from jaxmoe.bench.harness import results_header, row_emitter
from jaxmoe.bench.layer import forward_backward, layer_inputs
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.tile_variants import compile_variant, tile_sites

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from idle_probe import gpu_clock  # noqa: E402 - the probes' one clock reader


def smi_numbers(line: str) -> tuple[float, float] | None:
    """``(SM MHz, W)`` from a :func:`gpu_clock` line (``"1755 MHz, 698.12 W, 61"``)."""
    try:
        clock, power = line.split(",")[:2]
        return float(clock.split()[0]), float(power.split()[0])
    except (ValueError, IndexError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--preset", default="mixtral")
    parser.add_argument("--pass", dest="pass_", choices=("fwd", "fwd+bwd"), default="fwd+bwd")
    parser.add_argument("--variants", default='{"multicast": {"multicast_weights": true}}')
    parser.add_argument("--sites", default="gated")
    parser.add_argument(
        "--backend-variants",
        default="{}",
        help="JSON: variant name -> gated FFN backend fields (no tile changes)",
    )
    parser.add_argument("--phases", type=int, default=6, help="phases in all, variants alternating")
    parser.add_argument("--phase-s", type=float, default=3.0)
    parser.add_argument("--smi-period-s", type=float, default=0.2)
    args = parser.parse_args()
    variants = {"default": None, **json.loads(args.variants)}
    sites = tile_sites(args.sites)
    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "variant-clock-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    cfg, params, x, dy = layer_inputs(LAYER_PRESETS[args.preset], jax.numpy.bfloat16)
    layer = lambda p, x: jaxmoe.moe(p, x, cfg)[0]  # noqa: E731
    operands = (params, x) if args.pass_ == "fwd" else (params, x, dy)
    function = layer if args.pass_ == "fwd" else forward_backward(layer)
    functions = {}
    for name, changes in variants.items():
        functions[name], _ = compile_variant(function, operands, sites, changes)
        jax.block_until_ready(functions[name](*operands))
    for name, fields in json.loads(args.backend_variants).items():
        functions[name], _ = compile_variant(function, operands, backend_fields=fields)
        jax.block_until_ready(functions[name](*operands))

    rows = run_phases(
        {
            name: (lambda fn=fn: fn(*operands), jax.block_until_ready)
            for name, fn in functions.items()
        },
        args.phases,
        args.phase_s,
        args.smi_period_s,
        emit,
    )
    emit(summarize_phases(rows))


def summarize_phases(rows: list[dict]) -> dict:
    """Per variant, the median ms per call over its phases, leaving out the run's first phase
    (the clock still coming down from idle), and its speedup over the first variant's (run 31
    call 5: the default against itself 1.0009x this way)."""
    by_variant = {}
    for row in rows:
        by_variant.setdefault(row["variant"], [])
        if row["phase"] > 0:
            by_variant[row["variant"]].append(row["ms_per_call"])
    medians = {name: statistics.median(ms) for name, ms in by_variant.items() if ms}
    first = next(iter(medians.values()), None)
    return {
        "summary": {
            name: {"median_ms": ms, "speedup": first / ms, "phases": len(by_variant[name])}
            for name, ms in medians.items()
        }
    }


def run_phases(
    contenders: dict, phases: int, phase_s: float, smi_period_s: float, emit
) -> list[dict]:
    """Runs each contender alone in phases of ``phase_s`` seconds, alternating (A, B, ..., A,
    B, ...), while ``nvidia-smi`` is read every ``smi_period_s`` in a thread; emits per phase
    the ms per call over its last two thirds and the median SM clock and power over that span,
    and returns those rows. ``contenders``: name -> ``(call, sync)``, ``call()`` launching one
    call and ``sync(out)`` waiting for it."""
    readings, stop = [], threading.Event()

    def read_smi():
        while not stop.is_set():
            numbers = smi_numbers(gpu_clock())
            if numbers:
                readings.append((time.perf_counter(), *numbers))
            time.sleep(smi_period_s)

    reader = threading.Thread(target=read_smi, daemon=True)
    reader.start()
    names, rows = list(contenders), []
    try:
        for phase in range(phases):
            name = names[phase % len(names)]
            call, sync = contenders[name]
            start = time.perf_counter()
            end = start + phase_s
            steady_from = start + phase_s / 3
            calls, steady_calls, steady_start = 0, 0, None
            while time.perf_counter() < end:
                sync([call() for _ in range(4)][-1])
                now = time.perf_counter()
                calls += 4
                if now >= steady_from:
                    if steady_start is None:
                        steady_start = now
                    else:
                        steady_calls += 4
            steady_end = time.perf_counter()
            span = [r for r in readings if steady_start <= r[0] <= steady_end]
            rows.append(
                {
                    "phase": phase,
                    "variant": name,
                    "calls": calls,
                    "ms_per_call": (steady_end - steady_start) * 1e3 / max(steady_calls, 1),
                    "sm_mhz": statistics.median(r[1] for r in span) if span else None,
                    "power_w": statistics.median(r[2] for r in span) if span else None,
                    "smi_readings": len(span),
                }
            )
            emit(rows[-1])
    finally:
        stop.set()
        reader.join()
    return rows


if __name__ == "__main__":
    main()
