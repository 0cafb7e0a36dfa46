"""Probe (issue 15): the dispatch plan's ranks counted (one-hot ``cumsum``) or sorted (XLA's
stable argsort), on one GPU (:func:`jaxmoe.ranks.stable_ranks`).

1. ``plan`` rows: ``jaxmoe.plan_dispatch`` alone on each layer preset's routing (``[T, K]``
   random distinct experts, the layer's alignment) and on a DeepSeek-V3-sized one (256
   experts), both methods checked equal and timed in interleaved rounds.
2. ``layer`` rows: the layer preset's ``jit(moe)`` forward and fwd+bwd, each method compiled
   ahead of time (``COUNT_MAX_ELEMENTS`` set while tracing, jax's caches cleared first), their
   outputs compared, timed in settled interleaved rounds (:func:`layer_rows`, which
   ``row_gather_probe.py`` shares).

Rows go to ``<out-dir>/dispatch-plan-probe.json``::

    PYTHONPATH=src python benchmarks/dispatch_plan_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import time
import traceback

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe import ranks
from jaxmoe.bench.harness import relative_error, results_header, row_emitter
from jaxmoe.bench.layer import expert_flops, forward_backward, layer_config, layer_inputs
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
from jaxmoe.stages import resolve_alignment

# Each method by the largest one-hot size it counts at (0: always sort).
METHOD_LIMITS = {"count": ranks.COUNT_MAX_ELEMENTS, "sort": 0}


@contextlib.contextmanager
def rank_method(method: str):
    saved = ranks.COUNT_MAX_ELEMENTS
    ranks.COUNT_MAX_ELEMENTS = METHOD_LIMITS[method]
    try:
        yield
    finally:
        ranks.COUNT_MAX_ELEMENTS = saved


def compiled_under(patch, fn, *operands):
    """``jax.jit(fn)`` compiled ahead of time for ``operands`` inside the context ``patch()``,
    after clearing jax's tracing caches (a function traced under another patch is not reused;
    ahead of time, so that a later cache clearing cannot retrace it outside the patch)."""
    jax.clear_caches()
    with patch():
        return jax.jit(fn).lower(*operands).compile()


def layer_rows(presets, patches: dict, baseline: str, rounds: int):
    """A row per (preset, pass) of the layer's forward and fwd+bwd (``jit(moe)``, bf16), compiled
    under each of ``patches`` (name -> context manager factory, :func:`compiled_under`): the
    outputs' largest relative difference from ``baseline``'s, then ms and TFLOP/s of each in
    settled interleaved rounds, ``<name>_speedup = baseline ms / name ms``."""
    for preset in presets:
        for pass_ in ("fwd", "fwd+bwd"):
            row = {"phase": "layer", "preset": preset.name, "pass": pass_}
            try:
                cfg, params, x, dy = layer_inputs(preset, jnp.bfloat16)
                layer = lambda p, x, cfg=cfg: jaxmoe.moe(p, x, cfg)[0]  # noqa: E731
                fn, operands = (
                    (layer, (params, x))
                    if pass_ == "fwd"
                    else (forward_backward(layer), (params, x, dy))
                )
                calls, outs = {}, {}
                for name, patch in patches.items():
                    compiled = compiled_under(patch, fn, *operands)
                    outs[name] = compiled(*operands)
                    call = lambda c=compiled, operands=operands: c(*operands)  # noqa: E731
                    calls[name] = (call, jax_sync, warm_up(call, jax_sync))
                row["max_rel_diff"] = max(
                    relative_error(a, b)
                    for name in patches
                    for a, b in zip(
                        jax.tree.leaves(outs[baseline]), jax.tree.leaves(outs[name]), strict=True
                    )
                )
                flops = expert_flops(preset, pass_)
                for name, timing in time_interleaved(calls, rounds=rounds).items():
                    row[f"{name}_ms"] = timing.median_ms
                    row[f"{name}_tflops"] = flops / timing.median_ms / 1e9
                for name in patches:
                    row[f"{name}_speedup"] = row[f"{baseline}_ms"] / row[f"{name}_ms"]
            except Exception as error:  # noqa: BLE001 - a probe reports and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            yield row


def random_experts(num_tokens: int, top_k: int, num_experts: int, seed: int = 0) -> jax.Array:
    keys = jax.random.split(jax.random.key(seed), num_tokens)
    choose = jax.vmap(lambda key: jax.random.permutation(key, num_experts)[:top_k])
    return choose(keys).astype(jnp.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--presets", default="mixtral,dsv3,qwen3")
    parser.add_argument("--phases", default="plan,layer")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    start = time.time()
    emit = row_emitter(
        os.path.join(args.out_dir, "dispatch-plan-probe.json"),
        results_header("benchmarks/dispatch_plan_probe.py"),
    )
    presets = [LAYER_PRESETS[name] for name in args.presets.split(",")]
    phases = args.phases.split(",")

    if "plan" in phases:
        shapes = [(p.name, p.tokens, p.top_k, p.num_experts) for p in presets]
        shapes.append(("dsv3-256", 4096, 8, 256))
        for name, num_tokens, top_k, num_experts in shapes:
            row = {"phase": "plan", "shape": name, "tokens": num_tokens, "top_k": top_k}
            row["num_experts"] = num_experts
            try:
                experts = random_experts(num_tokens, top_k, num_experts)
                alignment = resolve_alignment(layer_config(presets[0], jnp.bfloat16))
                row["alignment"] = alignment

                def plan(experts, num_experts=num_experts, alignment=alignment):
                    return jaxmoe.plan_dispatch(experts, num_experts, alignment=alignment)

                calls, plans = {}, {}
                for method in METHOD_LIMITS:
                    fn = compiled_under(functools.partial(rank_method, method), plan, experts)
                    plans[method] = fn(experts)
                    call = lambda fn=fn, experts=experts: fn(experts)  # noqa: E731
                    calls[method] = (call, jax_sync, warm_up(call, jax_sync))
                row["equal"] = all(
                    bool(jnp.all(a == b))
                    for a, b in zip(plans["count"], plans["sort"], strict=True)
                )
                for method, timing in time_interleaved(calls, rounds=args.rounds).items():
                    row[f"{method}_us"] = timing.median_ms * 1e3
                row["count_speedup"] = row["sort_us"] / row["count_us"]
            except Exception as error:  # noqa: BLE001 - a probe reports and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)

    if "layer" in phases:
        patches = {method: functools.partial(rank_method, method) for method in METHOD_LIMITS}
        for row in layer_rows(presets, patches, baseline="sort", rounds=args.rounds):
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)
    emit({"done": True, "elapsed_s": round(time.time() - start, 1)})


if __name__ == "__main__":
    main()
