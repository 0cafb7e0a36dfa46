"""Curated benchmark tables: a run's result rows merged into a table's JSON, and its markdown.

A curated table is ``{"header": {...}, "rows": [...]}`` as JSON (the benches' own format) whose
header also says what the rows are and where each came from:

- ``title``, ``notes``: what the table measures and how (a sentence or two);
- ``key``: the row fields that name one case (e.g. shape, routing, pass, impl);
- ``columns``: what the markdown shows, ``[row key, heading, format]`` as in
  :func:`jaxmoe.bench.harness.format_table`;
- ``runs``: per run label (``<run id>/call5``, the run id as ``benchmarks/RUNS.md`` lists it),
  the provenance of its rows: device, jax, torch, date, command and the commit measured.

Every row carries its ``run`` label. Merging a run's rows appends them; for each case the row of
the latest merge is ``current`` and an earlier one is kept as history (``current: false``), so a
table can be brought up to date one call at a time and the markdown shows one row per case::

    python -m jaxmoe.bench.tables benchmarks/results/layer-h200.json --rows layer.json \\
        --run <run id>/call2 --commit 1a2b3c4

With no ``--rows`` the markdown is rewritten from the JSON alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxmoe.bench.harness import format_table

PROVENANCE = ("device", "jax", "torch", "date", "command", "commit")
REQUIRED_PROVENANCE = ("device", "jax", "date", "command", "commit")
SPEC_FIELDS = ("title", "key", "columns", "runs")


def check_table(table: dict[str, Any]) -> None:
    """Raises ValueError unless ``table`` is a curated table (see the module docstring)."""
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
        raise ValueError("table: expected a JSON object {'header': {...}, 'rows': [...]}")
    header = table.get("header") or {}
    missing = [field for field in SPEC_FIELDS if field not in header]
    if missing:
        raise ValueError(
            f"table header: missing {missing}; a curated table's header names its title, key "
            "(the fields of one case), columns ([key, heading, format]) and runs (provenance)"
        )
    for row in table["rows"]:
        label = row.get("run")
        if label not in header["runs"]:
            raise ValueError(
                f"table row {row!r}: run label {label!r} has no provenance in header['runs']"
            )


def check_provenance(run: str, provenance: dict[str, Any]) -> None:
    """Raises ValueError if a run's provenance lacks a required fact."""
    missing = [field for field in REQUIRED_PROVENANCE if not provenance.get(field)]
    if missing:
        raise ValueError(
            f"run {run!r}: provenance lacks {missing}; give each (e.g. --commit, --command) so "
            "the table says where its numbers come from"
        )


def case_of(row: dict[str, Any], key: Sequence[str]) -> tuple:
    return tuple(json.dumps(row.get(field), sort_keys=True) for field in key)


def mark_current(table: dict[str, Any]) -> None:
    """In place: the last row of each case is ``current``, every earlier one is not."""
    key = table["header"]["key"]
    last = {case_of(row, key): index for index, row in enumerate(table["rows"])}
    for index, row in enumerate(table["rows"]):
        row["current"] = last[case_of(row, key)] == index


def merge_run(
    table: dict[str, Any], rows: Sequence[dict[str, Any]], run: str, provenance: dict[str, Any]
) -> dict[str, Any]:
    """A copy of ``table`` with ``rows`` (one run's) appended, labelled ``run`` and current.

    Rows that measured nothing (``ms`` None and no ``ok`` verdict: skipped for the time budget
    or the platform) are left out. Raises ValueError on a label already in the table.
    """
    check_table(table)
    if not run or any(c.isspace() for c in run):
        raise ValueError(
            f"run: {run!r} is not a label; use the run id and call, e.g. h200-runN/call2"
        )
    if run in table["header"]["runs"]:
        raise ValueError(f"run {run!r} is already in the table; each call's rows merge once")
    check_provenance(run, provenance)
    measured = [{**row, "run": run} for row in rows if row.get("ms") is not None or "ok" in row]
    if not measured:
        raise ValueError(f"run {run!r}: no row measured anything (every 'ms' is None)")
    header = {**table["header"], "runs": {**table["header"]["runs"], run: dict(provenance)}}
    merged = {"header": header, "rows": [dict(row) for row in table["rows"]] + measured}
    mark_current(merged)
    return merged


def current_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The current rows, those of one comparison together: grouped (in order of first appearance)
    by the key fields before ``impl`` (all but the last field where the key has no ``impl``)."""
    key = table["header"]["key"]
    group = key[: key.index("impl")] if "impl" in key else key[:-1]
    order: dict[tuple, int] = {}
    for row in table["rows"]:
        order.setdefault(case_of(row, group), len(order))
    rows = [row for row in table["rows"] if row.get("current", True)]
    return sorted(rows, key=lambda row: order[case_of(row, group)])


def markdown(table: dict[str, Any]) -> str:
    """The table's markdown: title, notes, the provenance of its current rows, their table."""
    check_table(table)
    header = table["header"]
    rows = current_rows(table)
    columns = [tuple(column) for column in header["columns"]]
    if "run" not in [column[0] for column in columns]:
        columns.append(("run", "run", ""))
    used = list(dict.fromkeys(row["run"] for row in rows))
    runs = header["runs"]
    provenance = "\n".join(
        [
            "| run | device | jax | torch | date | commit | command |",
            "|---|---|---|---|---|---|---|",
        ]
        + [
            "| "
            + " | ".join(
                [label]
                + [str(runs[label].get(field) or "-") for field in PROVENANCE[:4]]
                + [f"`{runs[label]['commit']}`", f"`{runs[label]['command']}`"]
            )
            + " |"
            for label in used
        ]
    )
    history = len(table["rows"]) - len(rows)
    parts = [f"# {header['title']}", ""]
    if header.get("notes"):
        parts += [header["notes"], ""]
    parts += [
        "Where each row comes from (run ids: `benchmarks/RUNS.md`):",
        "",
        provenance,
        "",
        format_table(rows, columns, markdown=True),
        "",
    ]
    if history:
        parts.append(
            f"{history} earlier rows, superseded by a later run of the same case, stay in the "
            "JSON (`current: false`)."
        )
    parts.append(
        "Written by `python -m jaxmoe.bench.tables` from the JSON beside it; edit the JSON's "
        "rows only through it."
    )
    return "\n".join(parts) + "\n"


def read_json(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{str(path)!r}: no such file") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{str(path)!r} is not JSON: {error}") from None


def provenance_of(results: dict[str, Any], commit: str, command: str | None) -> dict[str, Any]:
    """A run's provenance from a bench's results header, with the commit (and command) given."""
    header = results.get("header") or {}
    device = header.get("device")
    if device and int(header.get("num_devices") or 1) > 1:
        device = f"{header['num_devices']}x {device}"
    return {
        "device": device,
        "jax": header.get("jax"),
        "torch": header.get("torch"),
        "date": header.get("date"),
        "command": command or header.get("command"),
        "commit": commit,
    }


def write_table(path: str | Path, table: dict[str, Any]) -> list[Path]:
    """Writes the table's JSON to ``path`` and its markdown beside it; returns both paths."""
    path = Path(path)
    text = markdown(table)
    path.write_text(json.dumps(table, indent=1, default=str) + "\n")
    md = path.with_suffix(".md")
    md.write_text(text)
    return [path, md]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jaxmoe.bench.tables",
        description="Merge one run's result rows into a curated table (benchmarks/results/"
        "*.json) and rewrite its markdown; without --rows, rewrite the markdown only.",
    )
    parser.add_argument("table", help="the curated table's JSON file")
    parser.add_argument(
        "--rows", nargs="+", default=[], help="the run's results JSON files ({'header', 'rows'})"
    )
    parser.add_argument("--run", help="the rows' run label: run id and call, e.g. <run id>/call2")
    parser.add_argument("--commit", help="the commit the run measured")
    parser.add_argument("--command", help="the command that made the rows (default: the file's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    table = read_json(args.table)
    if args.rows:
        if not args.run or not args.commit:
            raise ValueError("--rows needs --run (the label, e.g. <run id>/call2) and --commit")
        for path in args.rows:
            results = read_json(path)
            label = args.run if len(args.rows) == 1 else f"{args.run}/{Path(path).stem}"
            provenance = provenance_of(results, args.commit, args.command)
            table = merge_run(table, results.get("rows") or [], label, provenance)
    for path in write_table(args.table, table):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
