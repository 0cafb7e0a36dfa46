"""Probe (issue 15): where the time of the Mosaic ``gmm`` with ``stream_k`` goes, on one GPU.

Per gemm shape, on the layer's kind of groups (``layer_group_sizes``), fwd (and ``--ops
dgrad``): the default tiles, the same with ``stream_k`` (kernel and fix-up), the stream-K kernel
alone (the fix-up replaced by nothing: wrong results, timing only) and the default again (a
control), in settled interleaved rounds. Each stream-K program's optimized HLO goes to
``<out-dir>/hlo-<shape>-<op>.txt`` and its ops outside the kernel (copies, scatters, fusions)
are listed in the row, so a copy of the whole result shows. Rows go to
``<out-dir>/stream-k-probe.json``.

    PYTHONPATH=src python benchmarks/stream_k_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import re
import sys
import time
import traceback

import jax
import jax.numpy as jnp

from jaxmoe.bench.gemm import layer_group_sizes
from jaxmoe.bench.harness import relative_error, results_header, row_emitter
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
from jaxmoe.ops.grouped_matmul import pallas_mosaic, pallas_mosaic_schedule, pallas_mosaic_tiles


@contextlib.contextmanager
def without_fixup():
    """The stream-K kernel alone: its fix-up returns the kernel's result as it is."""
    saved = pallas_mosaic_schedule.stream_k_fixup
    pallas_mosaic_schedule.stream_k_fixup = lambda out, *args, **kwargs: out
    try:
        yield
    finally:
        pallas_mosaic_schedule.stream_k_fixup = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--shapes", default="mixtral-down,dsv3-up")
    parser.add_argument("--ops", default="fwd")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--time-budget-s", type=float, default=200)
    args = parser.parse_args()
    start = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "stream-k-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    for shape_name in args.shapes.split(","):
        shape = GEMM_SHAPES[shape_name]
        for op in args.ops.split(","):
            if time.time() - start > args.time_budget_s:
                emit({"budget": "stopped", "at": [shape_name, op]})
                return
            row = {"shape": shape_name, "op": op}
            try:
                transpose = op == "dgrad"
                k, n = (shape.n, shape.k) if transpose else (shape.k, shape.n)
                keys = jax.random.split(jax.random.key(0), 2)
                lhs = jax.random.normal(keys[0], (shape.m, k), jnp.bfloat16)
                rhs_shape = (shape.groups, n, k) if transpose else (shape.groups, k, n)
                rhs = (jax.random.normal(keys[1], rhs_shape) / k**0.5).astype(jnp.bfloat16)
                sizes = jnp.asarray(layer_group_sizes(shape))
                default = pallas_mosaic_tiles.default_mosaic_gmm_tiles(shape.m, k, n)
                variants = {
                    "default": (default, contextlib.nullcontext),
                    "stream_k": (
                        dataclasses.replace(default, stream_k=True),
                        contextlib.nullcontext,
                    ),
                    "kernel_only": (dataclasses.replace(default, stream_k=True), without_fixup),
                    "default_again": (default, contextlib.nullcontext),
                }
                calls, outs = {}, {}
                for name, (tiles, context) in variants.items():
                    fn = functools.partial(pallas_mosaic.gmm, transpose_rhs=transpose, tiles=tiles)
                    with context():
                        compiled = jax.jit(fn).lower(lhs, rhs, sizes).compile()
                    if name == "stream_k":
                        text = compiled.as_text()
                        with open(
                            os.path.join(args.out_dir, f"hlo-{shape_name}-{op}.txt"), "w"
                        ) as f:
                            f.write(text)
                        entry = text[text.find("ENTRY") :]
                        row["entry_ops"] = sorted(
                            set(re.findall(r"= \S+ (copy|scatter|fusion|custom-call)\(", entry))
                        )
                        row["entry_copies"] = re.findall(r"= (\S+) copy\(", entry)
                    outs[name] = jax.block_until_ready(compiled(lhs, rhs, sizes))
                    call = functools.partial(compiled, lhs, rhs, sizes)
                    calls[name] = (call, jax_sync, warm_up(call, jax_sync))
                end = int(sizes.sum())
                row["stream_k_rel_diff"] = relative_error(
                    outs["stream_k"][:end], outs["default"][:end]
                )
                row["kernel_only_rel_diff"] = relative_error(
                    outs["kernel_only"][:end], outs["default"][:end]
                )
                flops = 2 * end * k * n
                for name, timing in time_interleaved(calls, rounds=args.rounds).items():
                    row[f"{name}_ms"] = timing.median_ms
                    row[f"{name}_tflops"] = flops / timing.median_ms / 1e9
                base = (row["default_ms"] + row["default_again_ms"]) / 2
                row["stream_k_speedup"] = base / row["stream_k_ms"]
                row["kernel_only_speedup"] = base / row["kernel_only_ms"]
            except Exception as error:  # noqa: BLE001 - the probe records failures and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)


if __name__ == "__main__":
    main()
