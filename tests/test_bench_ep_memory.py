"""``jaxmoe bench ep-memory`` on simulated CPU devices: the rows and JSON (two variants'
forwards, so that the test compiles twice; tests/test_memory.py bounds the numbers themselves)."""

from jaxmoe.bench import ep_memory
from tests.cli_run import bench_help, exit_code, one_error_line, results


def test_rows_per_variant_and_pass(tmp_path, monkeypatch):
    every = ep_memory.variants
    monkeypatch.setattr(ep_memory, "variants", lambda cfg: dict(list(every(cfg).items())[1:]))
    out = tmp_path / "epm.json"
    assert exit_code(["bench", "ep-memory", "--ep", "2", "--pass", "fwd", "--out", str(out)]) == 0
    header, rows = results(out)
    assert "memory_analysis" in header["measure"]
    assert [(r["variant"].split(" (")[0], r["pass"], r["ep"]) for r in rows] == [
        ("fast slots alone", "fwd", 2),
        ("worst-case slots", "fwd", 2),
    ]
    # Worst-case slots receive every token any rank could send: more temporaries.
    assert 0 < rows[0]["temp_mb"] < rows[1]["temp_mb"]


def test_more_devices_than_there_are_is_one_line(capsys):
    assert exit_code(["bench", "ep-memory", "--ep", "64"]) == 2
    assert "64 devices asked for" in one_error_line(capsys)


def test_help_shows_the_default_size():
    assert "(default: 8)" in bench_help("ep-memory")
