"""``jaxmoe bench layer-profile``: refused without a GPU; its rows, JSON and markdown with the
platform and the trace faked (a CPU trace has no device events), on the tiny preset."""

import jax
import pytest

from jaxmoe.bench import kernel_profile
from jaxmoe.cli import bench_commands
from tests.cli_run import bench_help, exit_code, one_error_line, results


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the refusal is for other platforms")
def test_refuses_without_a_gpu(capsys):
    assert exit_code(["bench", "layer-profile", "--preset", "tiny"]) == 2
    assert "needs a GPU" in one_error_line(capsys)


def test_rows_and_markdown_with_a_faked_trace(tmp_path, monkeypatch):
    traced = []

    def fake_breakdown(compiled, *operands, top, settle_s):
        traced.append((len(operands), settle_s))
        events = [("gmm_kernel", "fusion.1", 0.0, 2e6), ("sort", "sort.2", 2e6, 1e6)]
        return kernel_profile.summarize(events, calls=1, top=top)

    monkeypatch.setattr(bench_commands, "platform", lambda: "gpu")
    monkeypatch.setattr(kernel_profile, "kernel_breakdown", fake_breakdown)
    out, hlo = tmp_path / "profile.json", tmp_path / "hlo"
    argv = ["bench", "layer-profile", "--preset", "tiny", "--passes", "fwd", "--settle-s", "0.5"]
    assert exit_code([*argv, "--hlo-dir", str(hlo), "--out", str(out)]) == 0
    assert traced == [(2, 0.5)]  # (params, x): the forward
    _, rows = results(out)
    assert [(r["preset"], r["pass"], r["impl"], r["variant"]) for r in rows] == [
        ("tiny", "fwd", "jaxmoe", "default")
    ]
    assert rows[0]["total_ms"] == 3.0 and [op["op"] for op in rows[0]["rows"]] == [
        "fusion.1",
        "sort.2",
    ]
    assert "### tiny fwd jaxmoe: 3.000 ms of kernels" in out.with_suffix(".md").read_text()
    assert "ENTRY" in (hlo / "hlo-tiny-fwd-default.txt").read_text()


def test_bad_variants_json_is_one_line(capsys):
    assert exit_code(["bench", "layer-profile", "--tile-variants", "[1]"]) == 2
    assert "JSON object" in one_error_line(capsys)


def test_help_names_the_variants():
    text = bench_help("layer-profile")
    assert "--tile-variants" in text and "--backend-variants" in text and "(default: all)" in text
