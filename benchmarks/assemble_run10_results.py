"""Builds the session-9 tables (``benchmarks/results/{grouped_matmul,layer,grouped_matmul-fp8}-
h100.{json,md}``) from the raw H100 run 10 files; no number is edited, rows are only selected
and labelled with the call they come from (``raw/h100-run10/README.md``):

* grouped matmul, bf16: Mixtral and DeepSeek-V3 rows (balanced and skewed) from call 4; Qwen3
  down balanced and both Qwen3 skewed from call 2; Qwen3 up balanced from run 9 call 9 (the same
  bf16 kernels and default tiles: nothing in them changed since).
* layer: call 5 (torch, torchtitan, jaxmoe bf16, FP8 rowwise per step and cached).
* FP8 grouped matmul: call 2 (the default tiles on the ring).

Usage: python benchmarks/assemble_run10_results.py (prints the grouped-matmul markdown table)
"""

from __future__ import annotations

import json
import math
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
RAW = RESULTS / "raw"


def _rows(path: str, run: str, keep=lambda row: True) -> list[dict]:
    data = json.loads((RAW / path).read_text())
    return [{**row, "run": run} for row in data["rows"] if keep(row)]


def _header(path: str) -> dict:
    return json.loads((RAW / path).read_text())["header"]


def gemm_rows() -> list[dict]:
    qwen3 = lambda row: row["shape"].startswith("qwen3")  # noqa: E731
    rows = []
    for routing in ("balanced", "skewed"):
        rows += _rows(f"h100-run10/call4/gemm-{routing}.json", "run10/call4")
    rows += _rows(
        "h100-run9/call9/gemm-balanced.json", "run9/call9", lambda r: r["shape"] == "qwen3-up"
    )
    rows += _rows("h100-run10/call2/gemm-balanced-qwen3-down.json", "run10/call2", qwen3)
    rows += _rows("h100-run10/call2/gemm-skewed-qwen3.json", "run10/call2", qwen3)
    return rows


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def gemm_markdown(rows) -> str:
    lines = [
        "| shape | routing | pass | torch ms | jaxmoe ms | jaxmoe TFLOP/s | vs torch | call |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_case = {}
    for row in rows:
        by_case.setdefault((row["shape"], row["routing"], row["pass"]), {})[row["impl"]] = row
    for (shape, routing, pass_), impls in by_case.items():
        torch, ours = impls["torch"], impls["jaxmoe"]
        lines.append(
            f"| {shape} | {routing} | {pass_} | {torch['ms']:.3f} | {ours['ms']:.3f} | "
            f"{ours['tflops']:.0f} | {ours['ratio_vs_torch']:.2f}x | {ours['run']} |"
        )
    return "\n".join(lines)


def main() -> None:
    rows = gemm_rows()
    ratios = {
        routing: geomean(
            r["ratio_vs_torch"] for r in rows if r["impl"] == "jaxmoe" and r["routing"] == routing
        )
        for routing in ("balanced", "skewed")
    }
    header = {**_header("h100-run10/call4/gemm-balanced.json"), "command": "see each row's run: "
              "benchmarks/results/raw/<run>/command.sh"}  # fmt: skip
    (RESULTS / "grouped_matmul-h100.json").write_text(
        json.dumps({"header": header, "rows": rows, "geomean_ratio_vs_torch": ratios}, indent=1)
    )
    layer = json.loads((RAW / "h100-run10/call5/layer.json").read_text())
    for row in layer["rows"]:
        row["run"] = "run10/call5"
    (RESULTS / "layer-h100.json").write_text(json.dumps(layer, indent=1))
    fp8 = json.loads((RAW / "h100-run10/call2/grouped_matmul-fp8.json").read_text())
    (RESULTS / "grouped_matmul-fp8-h100.json").write_text(json.dumps(fp8, indent=1))
    print(gemm_markdown(rows))  # the grouped-matmul table of grouped_matmul-h100.md
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
