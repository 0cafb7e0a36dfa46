"""Probe (issue 15): where a Mosaic GPU ``gmm`` kernel's time goes inside the kernel, from Mosaic
GPU's on-device profiler: each compute warpgroup's ``main_loop`` (its ``wgmma`` over a tile's K
steps, waits for the ring included) and ``epilogue`` (cast, stage, TMA store) per tile, with
timestamps, for every CTA. The kernel names those regions with ``jax.named_scope``; they are
recorded only when it is compiled with a ``profile_space`` (here: ``plgpu.CompilerParams`` patched
while the case is traced). The profiler keeps its ranges in shared memory (16 bytes each per
warpgroup), so ``--profile-space`` must cover two per tile of the busiest CTA, plus two (the
probe refuses less: an overflow is an illegal memory access on the device), and fit beside the
4-slot ring (~60 ranges at most). ``--rows`` shrinks a shape's ``M`` so that fewer tiles per
CTA leave room for more ranges per tile (``--ranges-per-tile``, with scopes added to the kernel
for an experiment); ``--changes`` (JSON) sets fields of the default tiles::

    PYTHONPATH=src python benchmarks/kernel_trace_probe.py --out-dir $OUT
    PYTHONPATH=src python benchmarks/kernel_trace_probe.py --out-dir $OUT \
      --cases mixtral-down:layer --changes '{"multicast_weights": true}'
    PYTHONPATH=src python benchmarks/kernel_trace_probe.py --out-dir $OUT --kernel gated \
      --cases mixtral-up:balanced --rows 2048 --changes '{"approx_math": true}'

``--kernel gated`` traces the fused gated kernel instead (``act(x Wg) * (x Wu)``, writing the
residuals as under differentiation, on its own default tiles; both weights are the shape's);
``--kernel down_dgrad`` the fused down dgrad (``fused_backward``): the shape ``(M, K, N)`` read
as the down projection ``[M, F] x [F, H]``, its dgrad ``dy [M, H] @ w[g]^T`` with ``x`` as both
``gate`` and ``up`` (``mixtral-down``: Mixtral's)::

    PYTHONPATH=src python benchmarks/kernel_trace_probe.py --out-dir $OUT --kernel down_dgrad \
      --cases mixtral-down:512/0/0/0/0/0/0/0 --rows 512 --profile-space 60 \
      --scopes epilogue_math,epilogue_store,operand_read,operand_wait

Since session 33 the down dgrad's epilogue is scoped (:mod:`jaxmoe.ops.grouped_matmul.\
pallas_mosaic_ring_operands`): 16 ranges a tile on the default tiles (``--ranges-per-tile``
defaults to the kernel's count), so few tiles per CTA fit; one group of 512 rows keeps every
tile whole. ``--scopes`` summarises those scopes too (per tile and per occurrence).

Per case (``shape:routing``, routing ``balanced``, ``layer``: multinomial loads on 7/8 of the
rows, each padded to 64, as the MoE layer's, or explicit sizes ``s0/s1/...``), the trace of
the last of ``--calls`` calls is kept (``<case>/...-trace.json``, Perfetto's format) and
summarised in ``kernel-trace.json``: the kernel's span, each compute warpgroup's time in
``main_loop``, ``epilogue`` and neither (between tiles, the tail's zeros), per-tile durations,
and how far apart the two compute warpgroups of a CTA start each tile's main loop.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import json
import os
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.bench.gemm import group_sizes_for, layer_group_sizes
from jaxmoe.bench.gemm_cases import jax_inputs
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as gated_mosaic
from jaxmoe.ops.grouped_matmul import (
    pallas_mosaic,
    pallas_mosaic_common,
    pallas_mosaic_tiles,
    work_list,
)
from jaxmoe.ops.grouped_matmul import pallas_mosaic_ring_operands as ring_operands

COMPUTE_WARPGROUPS = pallas_mosaic_common.NUM_COMPUTE_WARPGROUPS
WARPGROUPS = COMPUTE_WARPGROUPS + 1


REGIONS = ("main_loop", "epilogue")


def regions(trace: dict, names=REGIONS) -> dict:
    """``{(block, warpgroup): [(name, start_us, end_us), ...]}``, the regions ``names`` only, in
    order, from a Perfetto trace (regions nest: any enclosing named scope is one too)."""
    open_events, out = {}, {}
    for event in trace["traceEvents"]:
        tid = event["tid"] - 1
        key = (tid // WARPGROUPS, tid % WARPGROUPS)
        stack = open_events.setdefault(key, [])
        if event["ph"] == "B":
            stack.append((event["name"], event["ts"]))
            continue
        name, start = stack.pop()
        if name in names:
            out.setdefault(key, []).append((name, start, event["ts"]))
    return {key: sorted(spans, key=lambda span: span[1]) for key, spans in out.items()}


def summarize(trace: dict, scopes=()) -> dict:
    """The kernel's span, each compute warpgroup's share of it in the ``REGIONS`` and neither,
    their per-tile durations, the warpgroups' start skew; ``scopes``: more named scopes inside
    them (``--scopes``), each one's durations and share of the warpgroups' spans too."""
    by_warpgroup = regions(trace, REGIONS + tuple(scopes))
    starts = [r[1] for rs in by_warpgroup.values() for r in rs]
    ends = [r[2] for rs in by_warpgroup.values() for r in rs]
    shares = {name: [] for name in (*REGIONS, "neither", *scopes)}
    durations = {name: [] for name in (*REGIONS, *scopes)}
    for spans in by_warpgroup.values():
        span = max(end for _, _, end in spans) - spans[0][1]  # nested scopes end inside
        for name in (*REGIONS, *scopes):
            times = [end - start for n, start, end in spans if n == name]
            durations[name] += times
            shares[name].append(sum(times) / span)
        shares["neither"].append(1 - sum(shares[name][-1] for name in REGIONS))
    skews = []
    blocks = {block for block, _ in by_warpgroup}
    for block in blocks:
        loops = [
            [start for n, start, _ in by_warpgroup.get((block, wg), []) if n == "main_loop"]
            for wg in range(COMPUTE_WARPGROUPS)
        ]
        skews += [abs(a - b) for a, b in zip(*loops, strict=False)]

    def stats(values):
        values = np.asarray(values)
        return {
            "mean": float(values.mean()),
            "p50": float(np.median(values)),
            "p90": float(np.percentile(values, 90)),
            "max": float(values.max()),
        }

    tiles = len(durations["main_loop"])
    return {
        "kernel_span_us": max(ends) - min(starts),
        "warpgroups": len(by_warpgroup),
        "tiles_per_warpgroup": tiles / max(len(by_warpgroup), 1),
        "share": {name: float(np.mean(v)) for name, v in shares.items()},
        **{f"{name}_us": stats(values) for name, values in durations.items() if values},
        # A scope that runs several times a tile: its time per tile, over all of them.
        **{f"{name}_us_per_tile": sum(durations[name]) / max(tiles, 1) for name in scopes},
        "warpgroup_start_skew_us": stats(skews) if skews else None,
    }


def kernel_ranges_per_tile(kernel: str, tiles) -> int:
    """The profiler ranges a compute warpgroup records per tile: the ``REGIONS``, and in the
    fused down dgrad (bf16 operands) the ring operands' epilogue scopes (session 33)."""
    if kernel != "down_dgrad":
        return len(REGIONS)
    return len(REGIONS) + ring_operands.scopes_per_tile(tiles, jnp.dtype(jnp.bfloat16).itemsize)


def profile_space_needed(
    sizes, num_rows: int, out_cols: int, tiles, ranges_per_tile: int = len(REGIONS)
) -> int:
    """Profiler ranges one compute warpgroup needs room for: its ``REGIONS`` per tile of the
    CTA with the most tiles, the profiler's own ``Init`` and its header. More than
    ``profile_space`` is undefined behaviour in Mosaic GPU's profiler (H100 run 21: an illegal
    memory access)."""
    work_group, _, _ = work_list.work_items(
        sizes, num_rows, tiles.block_m, tile_align=pallas_mosaic_tiles.tile_align(tiles)
    )
    items = int(jnp.sum(work_group < sizes.shape[0]))
    workers = pallas_mosaic_common.num_sms(None)
    if tiles.multicast_weights:  # a cluster of two CTAs takes a pair of items per unit
        items, workers = -(-items // 2), workers // 2
    units = items * -(-out_cols // tiles.block_n)
    # One range more for the profiler's Init, and one for its 3-entry header (a range is 4).
    return ranges_per_tile * -(-units // workers) + 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument(
        "--cases", default="mixtral-down:balanced,mixtral-down:layer,dsv3-up:balanced"
    )
    parser.add_argument("--transpose", action="store_true", help="the dgrad (transposed rhs)")
    parser.add_argument("--kernel", choices=("gmm", "gated", "down_dgrad"), default="gmm")
    parser.add_argument("--profile-space", type=int, default=40)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument(
        "--changes", default="{}", help="JSON: fields of the default tiles to change"
    )
    parser.add_argument("--rows", type=int, default=0, help="M for the shape (0: the shape's)")
    parser.add_argument(
        "--settle-ms",
        type=float,
        default=0,
        help="run the kernel without the profiler this long, then trace one more call (the "
        "settled, power-limited clock; 0: trace the last of --calls)",
    )
    parser.add_argument(
        "--ranges-per-tile",
        type=int,
        default=0,
        help="profiler ranges a warpgroup records per tile, more with experimental scopes (0: "
        "the kernel's own: the REGIONS, and the down dgrad's epilogue scopes)",
    )
    parser.add_argument(
        "--scopes",
        default="",
        help="comma-separated named scopes inside the regions to summarise too, e.g. the ring "
        "operands' epilogue_math,epilogue_store,operand_read,operand_wait (count them in "
        "--ranges-per-tile)",
    )
    args = parser.parse_args()
    results = []
    original = pallas_mosaic_common.plgpu.CompilerParams
    for case in args.cases.split(","):
        shape_name, routing = case.split(":")
        shape = GEMM_SHAPES[shape_name]
        if args.rows:
            shape = dataclasses.replace(shape, m=args.rows)
        default_tiles = {
            "gmm": pallas_mosaic_tiles.default_mosaic_gmm_tiles,
            "gated": gated_mosaic.default_gated_tiles,
            "down_dgrad": lambda m, k, n: gated_mosaic.default_down_dgrad_tiles(m, n, k),
        }[args.kernel]
        tiles = dataclasses.replace(
            default_tiles(shape.m, shape.k, shape.n), **json.loads(args.changes)
        )
        case_dir = os.path.join(args.out_dir, case.replace(":", "-").replace("/", "_"))
        os.makedirs(case_dir, exist_ok=True)
        profiled = functools.partial(
            original, profile_space=args.profile_space, profile_dir=case_dir
        )
        # Traced afresh per case, so that its kernel is compiled with this case's profile_dir.
        jax.clear_caches()
        if args.kernel == "gated":

            def kernel(lhs, w, sizes, tiles=tiles):  # both weights the shape's, with residuals
                return gated_mosaic.fused_gmm(
                    lhs,
                    w,
                    w,
                    sizes,
                    activation="swiglu",
                    residuals=True,
                    tiles=tiles,
                    interpret=False,
                )

        elif args.kernel == "down_dgrad":

            def kernel(out_bar, w, sizes, gate, tiles=tiles):  # gate as up too
                return gated_mosaic.fused_down_dgrad(
                    out_bar,
                    gate,
                    gate,
                    w,
                    sizes,
                    activation="swiglu",
                    tiles=tiles,
                    interpret=False,
                )

        else:
            kernel = functools.partial(
                pallas_mosaic.gmm, transpose_rhs=args.transpose, tiles=tiles, interpret=False
            )
        fn = jax.jit(kernel)
        plain = jax.jit(functools.partial(kernel))  # its own cache: traced without the profiler
        row = {
            "case": case,
            "kernel": args.kernel,
            "transpose": args.transpose or args.kernel == "down_dgrad",
            "changes": args.changes,
            "profile_space": args.profile_space,
        }
        try:
            # The gemm bench's operands: x @ w[g], or dy @ w[g]^T for a dgrad.
            x, w, dy = jax_inputs(shape, jnp.bfloat16, 0)
            transposed = row["transpose"]
            lhs = dy if transposed else x
            if "/" in routing:  # explicit sizes, e.g. a layer bench's padded groups
                sizes = jnp.asarray([int(size) for size in routing.split("/")], jnp.int32)
            elif routing == "layer":
                sizes = jnp.asarray(layer_group_sizes(shape))
            else:
                sizes = jnp.asarray(group_sizes_for(shape, routing))
            # The down dgrad's gate (and up): x, shaped as its result.
            operands = (lhs, w, sizes) + ((x,) if args.kernel == "down_dgrad" else ())
            out_cols = shape.k if transposed else shape.n
            ranges = args.ranges_per_tile or kernel_ranges_per_tile(args.kernel, tiles)
            needed = profile_space_needed(sizes, shape.m, out_cols, tiles, ranges)
            if args.profile_space < needed:
                raise ValueError(
                    f"--profile-space {args.profile_space} is too small for this case: its "
                    f"busiest CTA records {needed} ranges per warpgroup (pass at least that; "
                    "each range takes 16 bytes of shared memory per warpgroup)"
                )
            with mock.patch.object(pallas_mosaic_common.plgpu, "CompilerParams", profiled):
                for _ in range(args.calls):
                    jax.block_until_ready(fn(*operands))
            if args.settle_ms:
                # The kernel without the profiler, back to back until the GPU's clock has
                # settled under the load (power-limited), then one profiled call at that clock.
                jax.effects_barrier()
                jax.block_until_ready(plain(*operands))
                deadline = time.perf_counter() + args.settle_ms / 1e3
                while time.perf_counter() < deadline:
                    outs = [plain(*operands) for _ in range(4)]
                jax.block_until_ready(outs)
                jax.block_until_ready(fn(*operands))
            jax.effects_barrier()  # the profile is written by a host callback
            newest = max(glob.glob(os.path.join(case_dir, "*-trace.json")), key=os.path.getmtime)
            with open(newest) as f:
                row.update(summarize(json.load(f), [n for n in args.scopes.split(",") if n]))
            row["trace"] = os.path.relpath(newest, args.out_dir)
        except Exception as error:  # noqa: BLE001 - the probe records failures and goes on
            row["error"] = f"{type(error).__name__}: {error}"[:1500]
        results.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(args.out_dir, "kernel-trace.json"), "w") as f:
        json.dump({"device": str(jax.devices()[0]), "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
