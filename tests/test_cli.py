"""Smoke tests of the ``jaxmoe`` command line: demo, bench layer, bench gemm, errors.

They run the commands in-process (``main([...])``), which shares the test session's JAX start-up,
and keep each run tiny (a few steps, the ``tiny`` preset, few timing samples).
"""

import json
import math
import subprocess
import sys

import pytest

from jaxmoe.cli.main import main


def test_module_entry_point_prints_help():
    result = subprocess.run(
        [sys.executable, "-m", "jaxmoe", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout and "bench" in result.stdout


def test_demo_writes_metrics_and_plot(tmp_path, capsys):
    assert main(["demo", "--steps", "5", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["step"] == [1, 2, 3, 4, 5]
    assert len(metrics["loss"]) == 5
    assert all(math.isfinite(v) for v in metrics["loss"])
    load = metrics["tokens_per_expert"]
    assert len(load) == 5 and len(load[0]) == 2 and len(load[0][0]) == 8  # steps, layers, E
    # Dropless top-2: every token is routed twice in every layer.
    tokens = metrics["config"]["batch_size"] * metrics["config"]["seq_len"]
    assert all(sum(layer) == 2 * tokens for step in load for layer in step)
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "max/mean expert load" in out and "sample:" in out


def test_demo_expert_bias_needs_a_non_softmax_score(tmp_path, capsys):
    code = main(["demo", "--expert-bias-rate", "0.01", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "--expert-bias-rate" in err and "--score sigmoid" in err
    assert not (tmp_path / "metrics.json").exists()


def test_demo_expert_bias_updates_with_sigmoid(tmp_path):
    from jaxmoe.cli.demo import DemoConfig, run_demo

    cfg = DemoConfig(
        steps=3,
        score="sigmoid",
        expert_bias_rate=0.01,
        aux_loss=0.0,
        width=32,
        ffn_size=32,
        seq_len=16,
        batch_size=4,
        sample_chars=8,
        out=str(tmp_path),
    )
    metrics = run_demo(cfg)
    assert all(math.isfinite(v) for v in metrics["loss"])


def test_demo_expert_parallel_on_two_devices(tmp_path):
    pytest.importorskip("jaxmoe.parallel")
    from jaxmoe.cli.demo import DemoConfig, run_demo

    cfg = DemoConfig(
        steps=2,
        devices=2,
        width=32,
        ffn_size=32,
        seq_len=16,
        batch_size=4,
        sample_chars=4,
        out=str(tmp_path),
    )
    metrics = run_demo(cfg)
    assert all(math.isfinite(v) for v in metrics["loss"])
    assert sum(metrics["tokens_per_expert"][-1][0]) == 2 * 4 * 16


def _bench_rows(path):
    data = json.loads(path.read_text())
    assert {"device", "jax", "torch", "date", "command"} <= set(data["header"])
    return data["rows"]


def test_bench_layer_tiny(tmp_path):
    out = tmp_path / "layer.json"
    code = main(["bench", "layer", "--preset", "tiny", "--repeats", "3", "--out", str(out)])
    assert code == 0
    rows = _bench_rows(out)
    assert {(r["impl"], r["pass"]) for r in rows} >= {
        ("jaxmoe", "fwd"),
        ("jaxmoe", "fwd+bwd"),
        ("jaxmoe-xla", "fwd"),
        ("dense", "fwd+bwd"),
    }
    for row in rows:
        assert {"preset", "pass", "impl", "ms", "tflops", "ratio_vs_torch"} <= set(row)
        if row["impl"] == "torch" and row["ms"] is None:
            assert row["skipped"] or row["error"]  # torch missing: says why
            continue
        assert row["ms"] > 0 and row["tflops"] > 0, row
        assert row["rel_err"] < 3e-2


def test_bench_gemm_tiny(tmp_path):
    out = tmp_path / "gemm.json"
    code = main(
        [
            "bench",
            "gemm",
            "--preset",
            "tiny",
            "--compare",
            "xla_ragged_dot",
            "--repeats",
            "3",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    rows = _bench_rows(out)
    assert rows and all(r["impl"] == "xla_ragged_dot" for r in rows)
    assert all(r["ms"] > 0 for r in rows)


def test_bench_rejects_unknown_preset():
    with pytest.raises(SystemExit, match="unknown --preset"):
        main(["bench", "layer", "--preset", "gpt5"])
