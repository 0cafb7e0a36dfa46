"""``jaxmoe bench layer-api``: the layer through the public API, timed the ways people write it,
to show why a user's own timing of :func:`jaxmoe.moe` can differ from ``jaxmoe bench layer``'s.

Cases, per preset (bf16 compute):

* ``fwd``: ``jit(lambda p, x: moe(p, x, cfg)[0])``;
* ``fwd_full_output``: the same returning ``(y, stats)`` as ``moe`` does;
* ``fwd_f32_params``: ``param_dtype`` float32 (the default) with bf16 compute: every call casts
  the expert weights;
* ``grad``: ``jit(grad(loss, argnums=(0, 1)))`` with ``loss = sum(y * dy)`` (no ``y`` returned);
* ``vjp_bench``: the layer bench's ``jit`` of the VJP returning ``y`` and all gradients.

Each is timed three ways: ``pipelined_ms`` (:func:`jaxmoe.bench.timing.time_jax`: calls back to
back, one sync per sample, as the layer bench and a training loop), ``per_call_sync_ms`` (each
call waited for before the next, :func:`~jaxmoe.bench.timing.per_call_median_ms`) and
``host_dispatch_ms`` (:func:`~jaxmoe.bench.timing.host_launch_ms`: host milliseconds for one
call to return while the device is idle). ``entry_ops`` counts the ops the compiled entry
computation launches.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe.bench.layer import forward_backward, layer_inputs
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.timing import host_launch_ms, jax_sync, per_call_median_ms, time_jax

CASES = ("fwd", "fwd_full_output", "fwd_f32_params", "grad", "vjp_bench")
PER_CALL_CALLS = 30
COLUMNS = (
    ("preset", "preset", ""),
    ("case", "case", ""),
    ("pipelined_ms", "ms (pipelined)", "{:.3f}"),
    ("per_call_sync_ms", "ms (per call)", "{:.3f}"),
    ("host_dispatch_ms", "host launch ms", "{:.3f}"),
    ("sync_over_pipelined", "per call / pipelined", "{:.2f}x"),
)
HEADER_FACTS = {
    "timing": "pipelined: jaxmoe.bench.timing.time_jax; per call: each call waited for "
    f"(median of {PER_CALL_CALLS}); host launch: host ms for a call to return, device idle",
}


def entry_op_counts(compiled_text: str) -> dict[str, int]:
    """How many of each op a compiled module's entry computation launches (fusions, custom
    calls, ...), most frequent first, from its HLO text."""
    entry = compiled_text[compiled_text.index("ENTRY") :]
    entry = entry[: entry.index("\n}")]
    ops = re.findall(r"= \S+ ([a-z][a-z0-9-]*)\(", entry)
    return dict(collections.Counter(ops).most_common())


def preset_cases(name: str) -> dict[str, tuple[Callable, tuple]]:
    """The jitted callables of :data:`CASES` and their arguments for one preset."""
    cfg, params, x, dy = layer_inputs(LAYER_PRESETS[name], jnp.bfloat16)
    cfg32 = dataclasses.replace(cfg, param_dtype=jnp.float32)
    params32 = jax.tree.map(lambda w: w.astype(jnp.float32), params)

    def forward(p, x, cfg=cfg):
        return jaxmoe.moe(p, x, cfg)[0]

    def loss(p, x):
        return jnp.sum(forward(p, x).astype(jnp.float32) * dy.astype(jnp.float32))

    return {
        "fwd": (jax.jit(forward), (params, x)),
        "fwd_full_output": (jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg)), (params, x)),
        "fwd_f32_params": (jax.jit(lambda p, x: forward(p, x, cfg32)), (params32, x)),
        "grad": (jax.jit(jax.grad(loss, argnums=(0, 1))), (params, x)),
        "vjp_bench": (jax.jit(forward_backward(forward)), (params, x, dy)),
    }


def run_layer_api_benchmark(
    presets: Sequence[str],
    cases: Sequence[str] = CASES,
    *,
    repeats: int = 10,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """One row per (preset, case), passed to ``on_row`` as it is made; a case that fails gets
    its ``error`` and the others still run."""
    rows: list[dict[str, Any]] = []
    for name in presets:
        callables = preset_cases(name)
        for case in cases:
            fn, args = callables[case]
            row: dict[str, Any] = {"preset": name, "case": case}
            try:
                pipelined = time_jax(fn, *args, repeats=repeats).median_ms
                call = functools.partial(fn, *args)
                synced = per_call_median_ms(call, jax_sync, calls=PER_CALL_CALLS)
                row |= {
                    "pipelined_ms": pipelined,
                    "per_call_sync_ms": synced,
                    "host_dispatch_ms": host_launch_ms(fn, *args),
                    "sync_over_pipelined": synced / pipelined,
                    "entry_ops": entry_op_counts(fn.lower(*args).compile().as_text()),
                }
            except Exception as error:  # noqa: BLE001 - recorded in the row, the others still run
                traceback.print_exc()
                row["error"] = f"{type(error).__name__}: {error}"[:300]
            rows.append(row)
            on_row(row)
    return rows
