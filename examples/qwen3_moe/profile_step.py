"""Where a training step's time goes: the device time of the MoE layers, attention, the head and
loss, the optimizer and the rest, and how long the device sat idle.

Takes ``examples.qwen3_moe.train``'s flags, compiles its step once, runs ``--warmup`` steps, then
traces ``--profile-steps`` steps with :func:`jax.profiler.trace`. Each kernel counts under the
named scope of the HLO op that launched it (the op's ``op_name`` metadata in the compiled HLO, the
backward's ops under their forward's scope): ``jaxmoe`` (the MoE blocks, forward and backward),
``attention`` (projections, norms, rotary, the fused attention: the decoder layer's attention
half), ``lm_head`` (final norm, head, cross-entropy), ``optimizer`` (clipping and AdamW), and
``other`` (embedding, the MLP's norm, residual adds). ``unattributed`` counts kernels whose op
the HLO does not name (e.g. inside a command buffer). Idle is the time between kernels over the
traced span (:func:`jaxmoe.bench.kernel_profile.idle_gaps`).

    python -m examples.qwen3_moe.profile_step --preset h200 --out h200-profile
"""

from __future__ import annotations

import glob
import json
import os
import re
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from jaxmoe.bench.kernel_profile import device_events, idle_gaps

from .data import Batches
from .step import adamw, init_state, make_train_step
from .train import build_parser, make_mesh, place_batch, run_from_flags

SCOPES = ("optimizer", "jaxmoe", "attention", "lm_head")
_OP_NAME = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?op_name="([^"]*)"')


def op_scopes(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> the first of :data:`SCOPES` in its ``op_name`` (else ``other``)."""
    scopes = {}
    for line in hlo_text.splitlines():
        match = _OP_NAME.match(line)
        if match:
            name, path = match.groups()
            scopes[name] = next((scope for scope in SCOPES if scope in path), "other")
    return scopes


def step_breakdown(events, scopes: dict[str, str], steps: int) -> dict:
    """Per-step milliseconds of device time by scope, the idle time and the traced span."""
    busy = dict.fromkeys((*SCOPES, "other", "unattributed"), 0.0)
    unnamed: dict[str, float] = {}
    for kernel, op, _, duration_ns in events:
        scope = scopes.get(op, "unattributed")
        busy[scope] += duration_ns / 1e6 / steps
        if scope == "unattributed":
            key = f"{op or '-'} / {kernel[:40]}"
            unnamed[key] = unnamed.get(key, 0.0) + duration_ns / 1e6 / steps
    span_ms = 0.0
    if events:
        start = min(event[2] for event in events)
        end = max(event[2] + event[3] for event in events)
        span_ms = (end - start) / 1e6 / steps
    idle = idle_gaps(events, steps, top=5)
    kernel_ms = sum(busy.values())
    return {
        "span_ms": span_ms,
        "kernel_ms": kernel_ms,
        "idle_ms": idle["idle_ms"],
        "idle_share": idle["idle_ms"] / span_ms if span_ms else None,
        "ms": busy,
        "share": {scope: ms / kernel_ms for scope, ms in busy.items()} if kernel_ms else {},
        "largest_gaps": idle["largest"],
        "unattributed_top": sorted(unnamed.items(), key=lambda item: -item[1])[:10],
    }


def main(argv=None) -> dict:
    parser = build_parser()
    parser.add_argument("--warmup", type=int, default=5, help="steps run before the trace")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps traced")
    args = parser.parse_args(argv)
    run = run_from_flags(args)
    mesh = make_mesh(run.mesh)
    graphdef, state, shardings = init_state(
        run.cfg, adamw(run.learning_rate, run.warmup_steps, run.steps), run.seed, mesh
    )
    batches = Batches(
        run.data, run.cfg.vocab_size, run.batch_size, run.seq_len, np.random.default_rng(0)
    )
    batch = place_batch(batches.next(), run.cfg, mesh)
    t0 = time.perf_counter()
    compiled = make_train_step(graphdef, shardings).lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    print(f"profile_step: compiled in {compile_s:.1f} s", flush=True)
    scopes = op_scopes(compiled.as_text())
    for _ in range(args.warmup):
        state, loss, *_ = compiled(state, batch)
    jax.block_until_ready(state)
    with tempfile.TemporaryDirectory() as log_dir:
        t0 = time.perf_counter()
        with jax.profiler.trace(log_dir):
            for _ in range(args.profile_steps):
                state, loss, *_ = compiled(state, batch)
            jax.block_until_ready(state)
        wall_ms = (time.perf_counter() - t0) * 1e3 / args.profile_steps
        paths = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
        events = device_events(max(paths, key=os.path.getmtime)) if paths else []
    result = step_breakdown(events, scopes, args.profile_steps)
    result.update(
        compile_seconds=compile_s,
        wall_ms_traced=wall_ms,
        preset=run.preset,
        fp8=run.cfg.moe.fp8_recipe,
    )
    out = Path(run.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(result, indent=1))
    shares = ", ".join(f"{scope} {100 * share:.1f}%" for scope, share in result["share"].items())
    print(
        f"profile_step: {result['span_ms']:.1f} ms a step on the device, kernels "
        f"{result['kernel_ms']:.1f} ms ({shares}); idle {result['idle_ms']:.2f} ms"
    )
    return result


if __name__ == "__main__":
    main()
