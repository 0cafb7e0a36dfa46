"""Builds the session-11 tables from the raw H100 run 12 files (``raw/h100-run12/README.md``); no
number is edited, rows are only selected and labelled with the call they come from:

* grouped matmul, bf16 (``grouped_matmul-h100.json``): every row of calls 2, 3 and 4. Call 4
  measured again the cases call 2 left below the bar (chosen by their outcome, so the table
  shows both): the latest call of each case is ``"current": true`` and makes the main table and
  the geometric means; ``geomean_first_measure`` uses the first call of each case instead.
* layer (``layer-h100.json``): call 3's rows (torch, torchtitan, jaxmoe bf16) join the earlier
  runs' rows.

Usage: python benchmarks/assemble_run12_results.py (prints the grouped-matmul markdown table)
"""

from __future__ import annotations

import json
import pathlib

from add_layer_run import add_layer_run
from assemble_run10_results import gemm_markdown, geomean

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
RAW = RESULTS / "raw" / "h100-run12"
# In the order they ran: a later file's case supersedes an earlier one's.
GEMM_FILES = [
    "call2/gemm-balanced.json",
    "call2/gemm-skewed-qwen3.json",
    "call3/gemm-skewed.json",
    "call4/gemm-balanced.json",
    "call4/gemm-skewed-qwen3.json",
]


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def gemm_rows() -> list[dict]:
    rows = []
    for name in GEMM_FILES:
        run = "run12/" + name.split("/")[0]
        rows += [{**row, "run": run} for row in _load(RAW / name)["rows"]]
    latest = {}
    for index, row in enumerate(rows):
        latest[(row["shape"], row["routing"], row["pass"], row["impl"])] = index
    for index, row in enumerate(rows):
        key = (row["shape"], row["routing"], row["pass"], row["impl"])
        row["current"] = latest[key] == index
    return rows


def ratios(rows, which) -> dict[str, float]:
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
        key = (row["shape"], row["routing"], row["pass"], row["impl"])
        if key not in seen:
            seen.add(key)
            first.append(row)
    return first


def main() -> None:
    rows = gemm_rows()
    current = [row for row in rows if row["current"]]
    header = {
        **_load(RAW / GEMM_FILES[0])["header"],
        "command": "see each row's run: benchmarks/results/raw/h100-<run>/command.sh",
    }
    out = {
        "header": header,
        "rows": rows,
        "geomean_ratio_vs_torch": ratios(rows, current),
        "geomean_first_measure": ratios(rows, first_measures(rows)),
    }
    (RESULTS / "grouped_matmul-h100.json").write_text(json.dumps(out, indent=1) + "\n")
    add_layer_run("h100-run12/call3", header_key="session11_run")
    order = {"balanced": 0, "skewed": 1}
    current.sort(key=lambda row: order[row["routing"]])
    print(gemm_markdown(current))
    print(json.dumps({k: out[k] for k in ("geomean_ratio_vs_torch", "geomean_first_measure")}))


if __name__ == "__main__":
    main()
