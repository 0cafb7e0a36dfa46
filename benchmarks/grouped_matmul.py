"""Grouped-matmul benchmark on the GPU: jaxmoe Pallas vs jax.lax.ragged_dot vs torch._grouped_mm.

    python benchmarks/grouped_matmul.py --out-dir benchmarks/results
    python benchmarks/grouped_matmul.py --shapes mixtral-up,qwen3-down --impls jaxmoe,torch
    python benchmarks/grouped_matmul.py --tune --shapes dsv3-up   # tile sweep of the kernels

Writes ``{stem}.json`` and ``{stem}.md`` under ``--out-dir``; the library code is
``jaxmoe.bench.gemm``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Let torch and JAX share the GPU: JAX must not grab 75% of it up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from jaxmoe.bench import gemm  # noqa: E402
from jaxmoe.bench.presets import GEMM_SHAPES  # noqa: E402


def _tune_candidates(round_: str):
    """Tile configs tried by ``--tune`` (1: large shapes; 2: qwen3, swizzle; 3: qwen3 K/stages)."""
    from jaxmoe.ops.grouped_matmul.pallas_triton import TileConfig as T

    if round_ == "1":
        fwd = [T(128, 256, 64, 8, 4), T(128, 256, 64, 8, 3), T(128, 128, 64, 4, 4)]
        fwd += [T(256, 128, 64, 8, 4), T(128, 128, 128, 8, 3)]
        tg = [T(64, 256, 128, 8, 3), T(64, 128, 128, 4, 4), T(128, 128, 128, 8, 3)]
        tg += [T(64, 256, 128, 8, 4), T(32, 128, 256, 8, 4)]
        return {"gmm": fwd, "dgrad": fwd, "tgmm": tg}
    if round_ == "3":  # qwen3: short K or N (768), 128 groups of 512 rows
        fwd = [T(128, 256, 64, 8, 3, 4), T(128, 256, 64, 8, 4, 4), T(128, 256, 128, 8, 2, 4)]
        fwd += [T(256, 128, 64, 8, 3, 4), T(256, 128, 64, 8, 4, 4), T(256, 128, 128, 8, 2, 4)]
        fwd += [T(128, 128, 128, 4, 3, 4), T(128, 128, 64, 4, 3, 4), T(128, 128, 64, 8, 3, 4)]
        fwd += [T(128, 256, 64, 8, 3, 1), T(128, 256, 32, 8, 5, 4), T(64, 256, 128, 4, 3, 4)]
        tg = [T(64, 256, 128, 8, 4), T(64, 256, 128, 8, 3), T(32, 256, 128, 8, 4)]
        tg += [T(128, 128, 128, 8, 3), T(128, 256, 128, 8, 2)]
        return {"gmm": fwd, "dgrad": fwd, "tgmm": tg}
    fwd = [T(128, 256, 64, 8, 3), T(128, 256, 64, 8, 3, 4), T(128, 256, 64, 8, 3, 16)]
    fwd += [T(128, 128, 64, 8, 4), T(64, 256, 64, 4, 4)]
    tg = [T(64, 256, 128, 8, 4), T(128, 256, 128, 8, 3), T(128, 128, 128, 8, 4)]
    tg += [T(64, 256, 128, 8, 4, 4), T(64, 128, 256, 8, 4)]
    return {"gmm": fwd, "dgrad": fwd, "tgmm": tg}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_shapes = ",".join(k for k in GEMM_SHAPES if k != "tiny")
    parser.add_argument("--shapes", default=default_shapes, help="comma-separated GEMM_SHAPES keys")
    parser.add_argument("--impls", default=",".join(gemm.IMPLS))
    parser.add_argument("--routings", default=",".join(gemm.ROUTINGS))
    parser.add_argument("--passes", default=",".join(gemm.PASSES))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--stem", default="grouped_matmul")
    parser.add_argument(
        "--tune", default="", help="sweep Pallas tile configs instead (round: 1, 2, 3)"
    )
    parser.add_argument("--time-budget-s", type=float, default=1e9)
    args = parser.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    command = "python " + " ".join([os.path.relpath(__file__), *(argv or sys.argv[1:])])
    if args.tune:
        rows = gemm.sweep_pallas_tiles(
            shapes,
            _tune_candidates(args.tune),
            repeats=args.repeats,
            time_budget_s=args.time_budget_s,
        )
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, f"{args.stem}-tune.json"), "w") as f:
            json.dump({"header": gemm.benchmark_header(command), "rows": rows}, f, indent=1)
        return 0
    header = gemm.benchmark_header(command)
    done: list[dict] = []
    # Results are rewritten after every row, so that a run cut short still leaves what it measured.
    json_path, md_path = "", ""

    def save(rows):
        nonlocal json_path, md_path
        all_rows = done + list(rows)
        gemm.fill_ratios(all_rows)
        json_path, md_path = gemm.write_results(all_rows, header, args.out_dir, args.stem)

    # Shape by shape, every implementation back to back: peers are timed minutes apart at most,
    # under the same clocks and temperature (an impl-major order let the GPU drift between them).
    started = time.perf_counter()
    for shape in shapes:
        for impl in [i for i in args.impls.split(",") if i]:
            if time.perf_counter() - started > args.time_budget_s:
                print(f"time budget spent: skipping {shape} {impl}", flush=True)
                continue
            done += gemm.run_gemm_benchmark(
                [shape],
                impls=[impl],
                routings=[r for r in args.routings.split(",") if r],
                passes=[p for p in args.passes.split(",") if p],
                repeats=args.repeats,
                on_row=save,
            )
    rows = done
    save([])
    print(gemm.markdown_table(rows))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
