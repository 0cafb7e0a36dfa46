"""Adds the session-10 FP8 rows to ``benchmarks/results/layer-h100.json`` and writes
``benchmarks/results/fp8-wgrad-h100.{json,md}``, from the raw H100 run 11 files; no number is
edited, rows are only selected and labelled with the call they come from:

* layer: call 2 (Mixtral, DeepSeek: torch and the FP8 recipes, interleaved in the same rounds)
  and call 3 (Qwen3: torch, jaxmoe bf16 and the FP8 recipes); every row keeps its own call's
  ``ratio_vs_torch``. The session-9 rows (run 10 call 5) stay as they are.
* FP8 wgrad kernel: call 3 (``benchmarks/fp8_wgrad_probe.py``, six shapes, balanced and skewed).

Usage: python benchmarks/assemble_run11_results.py
"""

from __future__ import annotations

import json
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
RAW = RESULTS / "raw" / "h100-run11"
CALLS = {"call2": "run11/call2", "call3": "run11/call3"}


def _load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def layer() -> None:
    path = RESULTS / "layer-h100.json"
    table = _load(path)
    rows = [row for row in table["rows"] if not str(row.get("run", "")).startswith("run11")]
    headers = {}
    for call, run in CALLS.items():
        raw = _load(RAW / call / "layer.json")
        headers[run] = raw["header"]
        rows += [{**row, "run": run} for row in raw["rows"]]
    table["rows"] = rows
    table["header"] = {**table["header"], "session10_runs": headers}
    path.write_text(json.dumps(table, indent=1) + "\n")


def fp8_wgrad() -> None:
    raw = _load(RAW / "call3" / "fp8-wgrad-probe.json")
    rows = [{**row, "run": "run11/call3"} for row in raw["rows"]]
    out = {"header": raw["header"], "rows": rows}
    (RESULTS / "fp8-wgrad-h100.json").write_text(json.dumps(out, indent=1) + "\n")
    text = (RAW / "call3" / "fp8-wgrad-probe.md").read_text()
    (RESULTS / "fp8-wgrad-h100.md").write_text(text)


if __name__ == "__main__":
    layer()
    fp8_wgrad()
