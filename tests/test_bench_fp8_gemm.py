"""``jaxmoe bench fp8-gemm`` needs a CUDA GPU and torch: its help, and its refusal elsewhere
(the kernel's numerics are tested in tests/test_fp8_mosaic.py, in the interpreter)."""

import jax
import jax.numpy as jnp
import pytest

from jaxmoe.bench import fp8_gemm
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.ops.fp8.pallas_mosaic import default_fp8_tiles, unsupported_reason
from jaxmoe.ops.fp8.quantize import E4M3
from jaxmoe.ops.mosaic.tiles import check_tiles
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


@pytest.mark.parametrize("sweep, count", [("none", 1), ("fixed", 2), ("ring", 3)])
def test_blockwise_tiles_are_ones_the_kernel_takes(sweep, count):
    # Every tile the benchmark times with the blockwise recipe fits shared memory and passes the
    # kernel's own checks on every shape; the default (jax's pipeline) comes first, the ring
    # variants promote one step late.
    for name in fp8_gemm.SHAPES:
        shape = GEMM_SHAPES[name]
        tiles = fp8_gemm.blockwise_tiles(shape, sweep)
        assert len(tiles) == count
        default = default_fp8_tiles(shape.m, shape.k, shape.n, fp8_gemm.BLOCKWISE)
        assert next(iter(tiles.values())) == default
        for cfg in tiles.values():
            check_tiles(cfg, operand_bytes=1)
            reason = unsupported_reason(
                (shape.m, shape.k), (shape.groups, shape.k, shape.n), E4M3, E4M3,
                jnp.bfloat16, fp8_gemm.BLOCKWISE, cfg,
            )  # fmt: skip
            assert reason is None, (name, cfg, reason)
        assert all(cfg.ring for impl, cfg in tiles.items() if "ring" in impl)
