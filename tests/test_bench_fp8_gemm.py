"""``jaxmoe bench fp8-gemm`` needs a CUDA GPU and torch: its help, and its refusal elsewhere
(the kernel's numerics are tested in tests/test_fp8_mosaic.py, in the interpreter)."""

import jax
import pytest

from jaxmoe.bench import fp8_gemm
from tests.cli_run import bench_help, exit_code, one_error_line


def test_help_names_the_peers_and_every_flag():
    text = bench_help("fp8-gemm")
    assert "torch._scaled_grouped_mm" in text
    for flag in ("--shapes", "--sweep", "--skip-checks", "--rounds", "--settle-ms", "--out"):
        assert flag in text
    assert "(default: all)" in text and "'all': the presets' six" in text


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the refusal is for other platforms")
def test_refuses_without_a_gpu_before_any_work(tmp_path, capsys, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the benchmark ran without a GPU")

    monkeypatch.setattr(fp8_gemm, "run_fp8_gemm_benchmark", must_not_run)
    out = tmp_path / "fp8.json"
    assert exit_code(["bench", "fp8-gemm", "--shapes", "tiny", "--out", str(out)]) == 2
    assert "needs a CUDA GPU and torch" in one_error_line(capsys)
    assert not out.exists()


def test_bad_sweep_is_one_line(capsys):
    assert exit_code(["bench", "fp8-gemm", "--sweep", "all"]) == 2
    assert "--sweep" in one_error_line(capsys)
