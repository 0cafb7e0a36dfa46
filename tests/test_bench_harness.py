"""The probes' row sink: every row printed and the results file rewritten with all rows so far."""

import json

from jaxmoe.bench.harness import row_emitter


def test_row_emitter_rounds_prints_and_rewrites_the_file_after_every_row(tmp_path, capsys):
    path = tmp_path / "probe.json"
    emit = row_emitter(path, {"device": "cpu"})
    emit({"impl": "a", "ms": 1.23456789})
    assert json.loads(path.read_text()) == {
        "header": {"device": "cpu"},
        "rows": [{"impl": "a", "ms": 1.234568}],
    }
    emit({"impl": "b", "ms": 2.0, "n": 3})
    written = json.loads(path.read_text())
    assert [row["impl"] for row in written["rows"]] == ["a", "b"]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == written["rows"]
