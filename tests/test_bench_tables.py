"""The curated-table builder (jaxmoe.bench.tables): a run's rows merged into a table's JSON, the
latest row of each case current, the markdown written from the JSON; and the tables checked in
under benchmarks/results/ are such tables, their markdown what the builder writes."""

import json
import pathlib

import pytest

from jaxmoe.bench import tables

RESULTS = pathlib.Path(__file__).parents[1] / "benchmarks" / "results"


def _table():
    return {
        "header": {
            "title": "Tiny gemm",
            "notes": "Two impls, one shape.",
            "key": ["shape", "impl"],
            "columns": [["shape", "shape", ""], ["impl", "impl", ""], ["ms", "ms", "{:.3f}"]],
            "runs": {},
        },
        "rows": [],
    }


def _results(rows, device="NVIDIA H200"):
    header = {
        "device": device,
        "num_devices": 1,
        "jax": "0.11.2",
        "torch": "2.11.0",
        "date": "2026-12-01 10:00 UTC",
        "command": "jaxmoe bench gemm --preset tiny",
    }
    return {"header": header, "rows": rows}


def test_a_run_is_merged_and_the_markdown_written(tmp_path):
    table_path = tmp_path / "gemm.json"
    table_path.write_text(json.dumps(_table()))
    first = tmp_path / "first.json"
    first.write_text(
        json.dumps(
            _results(
                [
                    {"shape": "a", "impl": "torch", "ms": 2.0},
                    {"shape": "a", "impl": "jaxmoe", "ms": 1.5},
                    {"shape": "b", "impl": "jaxmoe", "ms": None, "skipped": "budget"},
                ]
            )
        )
    )
    second = tmp_path / "second.json"
    second.write_text(json.dumps(_results([{"shape": "a", "impl": "jaxmoe", "ms": 1.25}])))
    args = [str(table_path), "--commit", "abc1234"]
    assert tables.main(args + ["--rows", str(first), "--run", "h200-run1/call1"]) == 0
    assert tables.main(args + ["--rows", str(second), "--run", "h200-run1/call2"]) == 0

    table = json.loads(table_path.read_text())
    got = [(r["shape"], r["impl"], r["ms"], r["run"], r["current"]) for r in table["rows"]]
    assert got == [
        ("a", "torch", 2.0, "h200-run1/call1", True),
        ("a", "jaxmoe", 1.5, "h200-run1/call1", False),  # superseded by call 2
        ("a", "jaxmoe", 1.25, "h200-run1/call2", True),
    ]
    assert table["header"]["runs"]["h200-run1/call2"] == {
        "device": "NVIDIA H200",
        "jax": "0.11.2",
        "torch": "2.11.0",
        "date": "2026-12-01 10:00 UTC",
        "command": "jaxmoe bench gemm --preset tiny",
        "commit": "abc1234",
    }
    md = table_path.with_suffix(".md").read_text()
    assert md.startswith("# Tiny gemm\n\nTwo impls, one shape.")
    assert "| a | jaxmoe | 1.250 | h200-run1/call2 |" in md
    assert "1.500" not in md  # history stays in the JSON only
    assert (
        "| h200-run1/call2 | NVIDIA H200 | 0.11.2 | 2.11.0 | 2026-12-01 10:00 UTC | `abc1234` |"
        in md
    )
    assert "1 earlier rows" in md


def test_bad_merges_are_refused_with_the_reason(tmp_path):
    table = _table()
    rows = [{"shape": "a", "impl": "torch", "ms": 2.0}]
    good = tables.provenance_of(_results(rows), "abc1234", None)
    with pytest.raises(ValueError, match=r"lacks \['commit'\]"):
        tables.merge_run(table, rows, "h200-run1/call1", {**good, "commit": None})
    with pytest.raises(ValueError, match="not a label"):
        tables.merge_run(table, rows, "run 1", good)
    with pytest.raises(ValueError, match="no row measured"):
        tables.merge_run(table, [{"shape": "a", "impl": "torch", "ms": None}], "r/c1", good)
    merged = tables.merge_run(table, rows, "h200-run1/call1", good)
    with pytest.raises(ValueError, match="already in the table"):
        tables.merge_run(merged, rows, "h200-run1/call1", good)
    with pytest.raises(ValueError, match="missing"):
        tables.check_table({"header": {"title": "x"}, "rows": []})
    with pytest.raises(ValueError, match="needs --run"):
        tables.main([str(RESULTS / "layer-h200.json"), "--rows", "x.json"])


def test_multi_gpu_provenance_names_the_count():
    results = _results([])
    results["header"]["num_devices"] = 4
    assert tables.provenance_of(results, "abc", None)["device"] == "4x NVIDIA H200"


CURATED = sorted(RESULTS.rglob("*.json"))


def test_the_results_folder_holds_curated_tables():
    assert len(CURATED) >= 10


@pytest.mark.parametrize("path", CURATED, ids=lambda p: p.name)
def test_each_checked_in_table_is_curated_and_its_markdown_current(path):
    table = tables.read_json(path)
    tables.check_table(table)
    for label, provenance in table["header"]["runs"].items():
        tables.check_provenance(label, provenance)
    assert path.with_suffix(".md").read_text() == tables.markdown(table)
