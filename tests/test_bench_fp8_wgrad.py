"""``jaxmoe bench fp8-wgrad``: its help and its refusal without a GPU unless ``--smoke`` (the
smoke run itself: tests/test_fp8_mosaic_wgrad.py::test_probe_smoke_runs_in_the_interpreter)."""

import jax
import pytest

from jaxmoe.bench import fp8_wgrad
from tests.cli_run import bench_help, exit_code, one_error_line


def test_help_names_every_flag():
    text = bench_help("fp8-wgrad")
    for flag in ("--shapes", "--routings", "--rounds", "--smoke", "--whole-slab", "--out"):
        assert flag in text
    assert "(default: balanced,skewed)" in text


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the refusal is for other platforms")
def test_timed_run_refuses_without_a_gpu_and_points_to_smoke(capsys, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the benchmark ran without a GPU")

    monkeypatch.setattr(fp8_wgrad, "run_fp8_wgrad_benchmark", must_not_run)
    assert exit_code(["bench", "fp8-wgrad", "--shapes", "tiny"]) == 2
    assert "--smoke runs here" in one_error_line(capsys)
