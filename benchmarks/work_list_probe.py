"""Probe (issue 15): the grouped matmul with its work list from one Pallas Triton kernel
(``work_list_pallas``, the default on a GPU since session 19) against the same kernels with the
list from XLA ops (``work_list.work_items``: 5-9 small launches, 8.5-17 us, run 19 call 6).

Per shape (balanced), ``fwd`` and ``fwd+bwd`` as the gemm bench builds them (public
``grouped_matmul``, backend ``auto``): both variants traced afresh (jax's caches cleared; the XLA
one with ``kernel_work_list`` patched to take the XLA ops on the GPU, its calls counted), results
compared (expected bitwise equal), then timed with torch in the same settled interleaved rounds.
Rows go to ``<out-dir>/work-list-probe.json``.

    PYTHONPATH=src python benchmarks/work_list_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp

from jaxmoe.bench.gemm import group_sizes_for
from jaxmoe.bench.gemm_cases import jax_inputs, torch_case
from jaxmoe.bench.harness import relative_error, results_header, row_emitter
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
from jaxmoe.ops.grouped_matmul import api, work_list_pallas


@contextlib.contextmanager
def xla_work_list(calls: list):
    """``kernel_work_list`` takes the XLA ops on the GPU too, while inside."""
    original = work_list_pallas.kernel_work_list

    def patched(*args, **kwargs):
        calls.append(kwargs.get("on_gpu"))
        return original(*args, **{**kwargs, "on_gpu": False})

    work_list_pallas.kernel_work_list = patched
    try:
        yield
    finally:
        work_list_pallas.kernel_work_list = original


def build(pass_: str):
    if pass_ == "fwd":
        return jax.jit(lambda x, w, gs: api.grouped_matmul(x, w, gs, backend="auto"))

    def fwd_bwd(x, w, gs, dy):
        out, vjp = jax.vjp(lambda a, b: api.grouped_matmul(a, b, gs, backend="auto"), x, w)
        return out, *vjp(dy)

    return jax.jit(fwd_bwd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--shapes", default="qwen3-up,qwen3-down,mixtral-down,dsv3-up")
    parser.add_argument("--passes", default="fwd,fwd+bwd")
    parser.add_argument("--routing", default="balanced")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--time-budget-s", type=float, default=400)
    args = parser.parse_args()
    start = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "work-list-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    for shape_name in args.shapes.split(","):
        shape = GEMM_SHAPES[shape_name]
        sizes = group_sizes_for(shape, args.routing)
        x, w, dy = jax_inputs(shape, jnp.bfloat16, 0)
        gs = jnp.asarray(sizes)
        for pass_ in args.passes.split(","):
            if time.time() - start > args.time_budget_s:
                emit({"budget": "stopped", "at": [shape_name, pass_]})
                return
            row = {"shape": shape_name, "routing": args.routing, "pass": pass_}
            try:
                operands = (x, w, gs) if pass_ == "fwd" else (x, w, gs, dy)
                contenders, outs = {}, {}
                for name in ("xla_list", "pallas_list"):
                    jax.clear_caches()
                    calls: list = []
                    patch = xla_work_list(calls) if name == "xla_list" else contextlib.nullcontext()
                    with patch:
                        fn = build(pass_)
                        outs[name] = jax.block_until_ready(fn(*operands))
                    if name == "xla_list":
                        row["xla_list_calls"] = len(calls)
                        if not calls:
                            raise RuntimeError("the XLA work list was not traced")
                    call = lambda fn=fn, operands=operands: fn(*operands)  # noqa: E731
                    contenders[name] = (call, jax_sync, warm_up(call, jax_sync))
                leaves = zip(*(jax.tree.leaves(outs[n]) for n in outs), strict=True)
                row["max_rel_diff"] = max(relative_error(a, b) for a, b in leaves)
                torch_fn, _, _, torch_sync = torch_case(shape, sizes, pass_, "bfloat16", 0)
                contenders["torch"] = (torch_fn, torch_sync, warm_up(torch_fn, torch_sync))
                flops = 2 * shape.m * shape.k * shape.n * (1 if pass_ == "fwd" else 3)
                for name, timing in time_interleaved(contenders, rounds=args.rounds).items():
                    row[f"{name}_ms"] = timing.median_ms
                    row[f"{name}_tflops"] = flops / timing.median_ms / 1e9
                row["speedup"] = row["xla_list_ms"] / row["pallas_list_ms"]
                row["pallas_vs_torch"] = row["torch_ms"] / row["pallas_list_ms"]
                row["xla_vs_torch"] = row["torch_ms"] / row["xla_list_ms"]
            except Exception as error:  # noqa: BLE001 - the probe records failures and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)


if __name__ == "__main__":
    main()
