"""Probe (issue 15): the Mosaic ``gmm`` with its last round cut into pieces of the K loop
(``split_last_round``) against the same tiles without the cut, on one GPU.

Per gemm shape (``--rows`` replaces its M), on the layer's kind of groups
(``layer_group_sizes``, or ``--sizes``), fwd (and ``--ops dgrad``, or ``pair``: the gated FFN's
input gradient ``gmm_pair`` with transposed weights, ``[M, K] x [G, N, K]^T`` twice): the
default tiles without the cut (``uncut``: ``split_last_round=False``), the same with it
(``split``: kernel and fix-up), with at most two pieces (``halves``: session 26's rule,
``MAX_PIECES = 2``), with ``--kernel-only`` its kernel alone (the fix-up replaced by nothing:
timing only), and ``uncut`` again (a control), in settled interleaved rounds; with
``--profile`` also each variant's launches from a profiler trace after a settling run (the
kernel's own time and the fix-up's, :mod:`jaxmoe.bench.kernel_profile`); each row says
how many units there are and how many the last round cuts, in how many pieces (both rules).
Each variant's first call writes into a freed NaN buffer of the result's size (as the
exactness checks of ``mosaic_probe.py``), so the kernel alone differs from ``uncut`` (NaN)
where it leaves cut tiles to the fix-up. Each split program's
optimized HLO goes to ``<out-dir>/hlo-<shape>-<op>.txt`` and its ops outside the kernel
(copies, scatters, fusions) are listed in the row, so a copy of the whole result shows. Rows go
to ``<out-dir>/split-last-round-probe.json``. (Session 26's calls 1-3 ran this probe's first
form, on stream-K: commit ``399c3bd``.)

    PYTHONPATH=src python benchmarks/split_last_round_probe.py --out-dir $OUT
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
from jaxmoe.bench.kernel_profile import kernel_breakdown
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
from jaxmoe.ops.grouped_matmul import (
    pallas_mosaic,
    pallas_mosaic_common,
    pallas_mosaic_schedule,
    pallas_mosaic_tiles,
)


@contextlib.contextmanager
def max_pieces(pieces: int):
    """The schedule with at most ``pieces`` pieces per cut unit while a program is traced."""
    saved = pallas_mosaic_schedule.MAX_PIECES
    pallas_mosaic_schedule.MAX_PIECES = pieces
    try:
        yield
    finally:
        pallas_mosaic_schedule.MAX_PIECES = saved


@contextlib.contextmanager
def without_fixup():
    """The split kernel alone: its fix-up returns the kernel's result as it is."""
    saved = pallas_mosaic_schedule.last_round_fixup
    pallas_mosaic_schedule.last_round_fixup = lambda out, *args, **kwargs: out
    try:
        yield
    finally:
        pallas_mosaic_schedule.last_round_fixup = saved


def last_round(shape, sizes, k: int, n: int, tiles, paired: bool) -> dict:
    """How many units the kernel runs on these groups, on how many workers, and how many of the
    last round's it cuts into how many pieces, also with at most two pieces
    (:mod:`jaxmoe.ops.grouped_matmul.pallas_mosaic_schedule`)."""
    work = pallas_mosaic_schedule.WorkList.of(sizes, shape.m, tiles)
    workers = pallas_mosaic_common.grid_size(None, pallas_mosaic_tiles.cluster_ctas(tiles))
    units = pallas_mosaic_schedule.num_units(work, n // tiles.block_n, tiles)
    steps = pallas_mosaic_schedule.unit_steps(k, tiles, paired)
    split = pallas_mosaic_schedule.LastRound.of(units, workers, steps)
    with max_pieces(2):
        halves = pallas_mosaic_schedule.LastRound.of(units, workers, steps)
    return {
        "units": int(units),
        "workers": workers,
        "cut_units": int(split.cut_units),
        "pieces": int(split.pieces),
        "halves_cut_units": int(halves.cut_units),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--shapes", default="mixtral-down,dsv3-up")
    parser.add_argument("--ops", default="fwd")
    parser.add_argument("--rows", type=int, default=0, help="M instead of the shape's (0: its)")
    parser.add_argument(
        "--sizes", default="", help="group sizes, comma-separated (default: layer_group_sizes)"
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--kernel-only", action="store_true", help="also the kernel alone")
    parser.add_argument(
        "--profile", action="store_true", help="also each variant's launches, profiled"
    )
    parser.add_argument("--time-budget-s", type=float, default=200)
    args = parser.parse_args()
    start = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "split-last-round-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    for shape_name in args.shapes.split(","):
        shape = GEMM_SHAPES[shape_name]
        if args.rows:
            shape = dataclasses.replace(shape, m=args.rows)
        for op in args.ops.split(","):
            if time.time() - start > args.time_budget_s:
                emit({"budget": "stopped", "at": [shape_name, op]})
                return
            row = {"shape": shape_name, "m": shape.m, "op": op}
            try:
                transpose = op in ("dgrad", "pair")
                k, n = (shape.n, shape.k) if op == "dgrad" else (shape.k, shape.n)
                keys = jax.random.split(jax.random.key(0), 4)
                rhs_shape = (shape.groups, n, k) if transpose else (shape.groups, k, n)
                operands = [
                    jax.random.normal(keys[0], (shape.m, k), jnp.bfloat16),
                    (jax.random.normal(keys[1], rhs_shape) / k**0.5).astype(jnp.bfloat16),
                ]
                if op == "pair":
                    operands += [
                        jax.random.normal(keys[2], (shape.m, k), jnp.bfloat16),
                        (jax.random.normal(keys[3], rhs_shape) / k**0.5).astype(jnp.bfloat16),
                    ]
                if args.sizes:
                    sizes = jnp.asarray([int(v) for v in args.sizes.split(",")], jnp.int32)
                else:
                    sizes = jnp.asarray(layer_group_sizes(shape))
                operands.append(sizes)
                product = pallas_mosaic.gmm_pair if op == "pair" else pallas_mosaic.gmm
                default = pallas_mosaic_tiles.default_mosaic_gmm_tiles(shape.m, k, n)
                uncut = dataclasses.replace(default, split_last_round=False)
                split = dataclasses.replace(default, split_last_round=True)
                row.update(last_round(shape, sizes, k, n, split, paired=op == "pair"))
                variants = {
                    "uncut": (uncut, contextlib.nullcontext),
                    "split": (split, contextlib.nullcontext),
                    "halves": (split, functools.partial(max_pieces, 2)),
                    "kernel_only": (split, without_fixup),
                    "uncut_again": (uncut, contextlib.nullcontext),
                }
                if not args.kernel_only:
                    del variants["kernel_only"]
                compared = [name for name in variants if name not in ("uncut", "uncut_again")]
                calls, outs = {}, {}
                for name, (tiles, context) in variants.items():
                    fn = functools.partial(product, transpose_rhs=transpose, tiles=tiles)
                    with context():
                        compiled = jax.jit(fn).lower(*operands).compile()
                    if name == "split":
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
                    # A freed NaN buffer for the allocator to hand back as the result.
                    jax.block_until_ready(jnp.full((shape.m, n), jnp.nan, jnp.bfloat16))
                    outs[name] = jax.block_until_ready(compiled(*operands))
                    call = functools.partial(compiled, *operands)
                    calls[name] = (call, jax_sync, warm_up(call, jax_sync))
                end = int(sizes.sum())
                for name in compared:
                    row[f"{name}_rel_diff"] = relative_error(outs[name][:end], outs["uncut"][:end])
                flops = 2 * end * k * n * (1 + (op == "pair"))
                for name, timing in time_interleaved(calls, rounds=args.rounds).items():
                    row[f"{name}_ms"] = timing.median_ms
                    row[f"{name}_tflops"] = flops / timing.median_ms / 1e9
                base = (row["uncut_ms"] + row["uncut_again_ms"]) / 2
                for name in compared:
                    row[f"{name}_speedup"] = base / row[f"{name}_ms"]
                if args.profile:
                    for name, (call, _, _) in calls.items():
                        profile = kernel_breakdown(call, calls=10, settle_s=1.0)
                        row[f"{name}_profile"] = {
                            "span_ms": profile["span_ms"],
                            "kernels_ms": profile["total_ms"],
                            "ops_us": {r["op"][:40]: 1e3 * r["ms"] for r in profile["rows"]},
                        }
            except Exception as error:  # noqa: BLE001 - the probe records failures and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)


if __name__ == "__main__":
    main()
