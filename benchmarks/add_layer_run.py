"""Adds one raw ``jaxmoe bench layer`` call to ``results/layer-h100.json`` (``--table``: another
table, created if missing): its rows, labelled with the call they come from (``run``), replace any
rows of that label; its header is kept under ``header["runs"][label]``. No number is edited.

Usage: python benchmarks/add_layer_run.py h100-run13/call3   (rows labelled ``run13/call3``)
       python benchmarks/add_layer_run.py h200-run32/call1 --file layer-mixtral.json \
           --table layer-h200
"""

from __future__ import annotations

import argparse
import json
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def add_layer_run(
    raw_call: str,
    header_key: str | None = None,
    *,
    file: str = "layer.json",
    table_stem: str = "layer-h100",
) -> str:
    """Adds ``results/raw/<raw_call>/<file>`` (``raw_call`` like ``h100-run13/call3``) to
    ``results/<table_stem>.json``; returns the rows' label (``run13/call3``: the run folder's
    device prefix dropped). ``header_key``: where the call's header goes in the table's header
    (default ``runs[label]``)."""
    label = raw_call.split("-", 1)[-1]
    path = RESULTS / f"{table_stem}.json"
    table = json.loads(path.read_text()) if path.exists() else {"header": {}, "rows": []}
    raw = json.loads((RESULTS / "raw" / raw_call / file).read_text())
    kept = [row for row in table["rows"] if row.get("run") != label]
    table["rows"] = kept + [{**row, "run": label} for row in raw["rows"]]
    if header_key is None:
        table["header"].setdefault("runs", {})[label] = raw["header"]
    else:
        table["header"][header_key] = raw["header"]
    path.write_text(json.dumps(table, indent=1) + "\n")
    return label


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("raw_call", help="e.g. h100-run13/call3")
    parser.add_argument("--file", default="layer.json", help="the call's bench output")
    parser.add_argument("--table", default="layer-h100", help="the results table's stem")
    args = parser.parse_args()
    print(add_layer_run(args.raw_call, file=args.file, table_stem=args.table))
