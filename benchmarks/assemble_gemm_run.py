"""Builds ``results/grouped_matmul-h100.json`` from the raw gemm files of H100 runs; no number is
edited, rows are only selected and labelled with the call they come from (``run14/call2``).

The files are given in the order they ran: a later file's case (shape, routing, pass, impl)
supersedes an earlier one's. A file of another run is named from the run's folder
(``../h100-run22/call3/gemm-balanced-mixtral.json``) and labelled with its own run. The
latest call of each case is ``"current": true`` and makes the main table and the geometric
means (``geomean_ratio_vs_torch``); ``geomean_first_measure`` uses the first call of each case
instead (they differ when a case was measured again, chosen by its outcome). With
``--layer-call`` that call's ``layer.json`` joins ``layer-h100.json`` too.

Usage: python benchmarks/assemble_gemm_run.py h100-run14 call2/gemm-balanced.json \\
           call2/gemm-skewed-qwen3.json call3/gemm-skewed.json --layer-call call3
(prints the grouped-matmul markdown table and the geometric means)
"""

from __future__ import annotations

import argparse
import json
import pathlib

from add_layer_run import add_layer_run
from assemble_run10_results import gemm_markdown, geomean

from jaxmoe.bench.presets import GEMM_SHAPES

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def _case(row) -> tuple:
    return (row["shape"], row["routing"], row["pass"], row["impl"])


def gemm_rows(run: str, files: list[str]) -> list[dict]:
    """Every row of ``files`` (paths under ``results/raw/<run>``), labelled, ``current`` set."""
    rows = []
    for name in files:
        path = (RESULTS / "raw" / run / name).resolve()
        # Labelled by the folders under raw/: run23/call3, or run23/call3/gpu0 for one GPU's
        # file of a multi-GPU call.
        run_dir, *call_dirs = path.relative_to(RESULTS.resolve() / "raw").parts[:-1]
        call = "/".join([run_dir.split("h100-", 1)[-1], *call_dirs])
        rows += [
            {**row, "run": call}
            for row in _load(path)["rows"]
            if row.get("ms") is not None  # a row skipped for the time budget measured nothing
        ]
    latest = {_case(row): index for index, row in enumerate(rows)}
    for index, row in enumerate(rows):
        row["current"] = latest[_case(row)] == index
    return rows


def ratios(which) -> dict[str, float]:
    return {
        routing: geomean(
            row["ratio_vs_torch"]
            for row in which
            if row["impl"] == "jaxmoe" and row["routing"] == routing
        )
        for routing in ("balanced", "skewed")
    }


def first_measures(rows) -> list[dict]:
    seen, first = set(), []
    for row in rows:
        if _case(row) not in seen:
            seen.add(_case(row))
            first.append(row)
    return first


def assemble(
    run: str,
    files: list[str],
    layer_call: str | None = None,
    stem: str = "grouped_matmul-h100",
    **layer_kwargs,
) -> None:
    rows = gemm_rows(run, files)
    current = [row for row in rows if row["current"]]
    header = {
        **_load(RESULTS / "raw" / run / files[0])["header"],
        "command": "see each row's run: benchmarks/results/raw/h100-<run>/command.sh",
    }
    out = {
        "header": header,
        "rows": rows,
        "geomean_ratio_vs_torch": ratios(current),
        "geomean_first_measure": ratios(first_measures(rows)),
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=1) + "\n")
    if layer_call is not None:
        add_layer_run(f"{run}/{layer_call}", **layer_kwargs)
    order = {"balanced": 0, "skewed": 1}
    shapes = list(GEMM_SHAPES)
    current.sort(key=lambda row: (order[row["routing"]], shapes.index(row["shape"])))
    print(gemm_markdown(current))
    print(json.dumps({k: out[k] for k in ("geomean_ratio_vs_torch", "geomean_first_measure")}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", help="e.g. h100-run14")
    parser.add_argument("files", nargs="+", help="gemm JSON files under results/raw/<run>")
    parser.add_argument("--layer-call", help="e.g. call3: its layer.json joins layer-h100.json")
    parser.add_argument(
        "--stem",
        default="grouped_matmul-h100",
        help="the table written, results/<stem>.json (grouped_matmul-h200 for an H200 run)",
    )
    args = parser.parse_args()
    assemble(args.run, args.files, args.layer_call, stem=args.stem)
