"""``jaxmoe bench layer-api`` on the CPU, tiny preset: one row per case with the three timings
and the compiled entry computation's op counts."""

import pytest

from jaxmoe.bench import layer_api
from tests.cli_run import bench_help, exit_code, one_error_line, results


def test_tiny_fwd_and_grad_rows(tmp_path):
    out = tmp_path / "api.json"
    argv = ["bench", "layer-api", "--preset", "tiny", "--cases", "fwd,grad", "--repeats", "2"]
    assert exit_code([*argv, "--out", str(out)]) == 0
    header, rows = results(out)
    assert "per call" in header["timing"]
    assert [(r["preset"], r["case"]) for r in rows] == [("tiny", "fwd"), ("tiny", "grad")]
    for row in rows:
        assert row["pipelined_ms"] > 0 and row["per_call_sync_ms"] > 0
        assert row["host_dispatch_ms"] > 0
        ratio = row["per_call_sync_ms"] / row["pipelined_ms"]
        assert row["sync_over_pipelined"] == pytest.approx(ratio, rel=1e-3)
        assert sum(row["entry_ops"].values()) > 0
    assert "| tiny | grad |" in out.with_suffix(".md").read_text()


def test_entry_op_counts_reads_the_entry_computation_only():
    text = (
        "HloModule m\n\nf {\n  a = f32[] add(x, y)\n}\n\nENTRY main {\n"
        "  p = f32[2] parameter(0)\n  b = f32[2] fusion(p), calls=f\n"
        "  c = f32[2] fusion(b), calls=f\n  ROOT d = f32[2] custom-call(c)\n}\n"
    )
    assert layer_api.entry_op_counts(text) == {"fusion": 2, "parameter": 1, "custom-call": 1}


def test_help_lists_every_case():
    assert f"(default: {','.join(layer_api.CASES)})" in bench_help("layer-api")


def test_unknown_case_is_one_line(capsys):
    assert exit_code(["bench", "layer-api", "--cases", "bwd"]) == 2
    assert "bwd" in one_error_line(capsys)
