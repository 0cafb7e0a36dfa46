"""Adds one raw ``jaxmoe bench layer`` call to ``results/layer-h100.json``: its rows, labelled with
the call they come from (``run``), replace any rows of that label; its header is kept under
``header["runs"][label]``. No number is edited.

Usage: python benchmarks/add_layer_run.py h100-run13/call3   (rows labelled ``run13/call3``)
"""

from __future__ import annotations

import argparse
import json
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def add_layer_run(raw_call: str, header_key: str | None = None) -> str:
    """Adds ``results/raw/<raw_call>/layer.json`` (``raw_call`` like ``h100-run13/call3``);
    returns the rows' label (``run13/call3``). ``header_key``: where the call's header goes in
    the table's header (default ``runs[label]``)."""
    label = raw_call.split("h100-", 1)[-1]
    path = RESULTS / "layer-h100.json"
    table = json.loads(path.read_text())
    raw = json.loads((RESULTS / "raw" / raw_call / "layer.json").read_text())
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
    print(add_layer_run(parser.parse_args().raw_call))
