"""``jaxmoe bench fp8-quantize --tiny`` on the CPU (Pallas' interpreter): every kind's rows,
the Pallas quantizers bit for bit XLA's, the JSON and its header."""

import jax
import pytest

from jaxmoe.bench import fp8_quantize
from tests.cli_run import bench_help, exit_code, one_error_line, results


def test_tiny_run_of_every_kind_writes_checked_rows(tmp_path, capsys):
    out = tmp_path / "q.json"
    argv = ["bench", "fp8-quantize", "--tiny", "--repeats", "1", "--out", str(out)]
    assert exit_code(argv) == 0
    header, rows = results(out)
    assert {"device", "jax", "date", "command", "commit"} <= set(header)
    weights = [r for r in rows if r["kind"] == "weights"]
    assert [(r["shape"], r["path"]) for r in weights] == [
        (shape, path) for shape in fp8_quantize.TINY_WEIGHT_SHAPES for path in ("xla", "pallas")
    ]
    columnwise = [r for r in rows if r["kind"] == "columnwise"]
    assert [r["path"] for r in columnwise] == ["xla", "pallas"]
    for row in weights + columnwise:
        assert row["ms"] > 0 and row["gbps"] > 0
        if row["path"] == "pallas":  # compared with XLA's outputs, element by element
            assert row["ok"] and row["bitwise_equal"], row
            assert set(row["differing"]) == set(
                fp8_quantize.WEIGHT_OUTPUTS if row["kind"] == "weights" else
                fp8_quantize.COLUMNWISE_OUTPUTS
            )  # fmt: skip
    assert weights[0]["bytes"] == 6 * 2 * 64 * 256
    layouts = [r for r in rows if r["kind"] == "layouts"]
    assert {r["path"] for r in layouts} == set(fp8_quantize.layout_paths(1, 1))
    assert all("bitwise_equal" not in r and r["ms"] > 0 for r in layouts)
    assert out.with_suffix(".md").read_text().count("| weights |") == len(weights)
    assert "bitwise" in capsys.readouterr().out


def test_help_names_every_kind():
    text = bench_help("fp8-quantize")
    assert "(default: weights,columnwise,layouts)" in text and "--tiny" in text


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the refusal is for other platforms")
def test_full_shapes_refuse_without_a_gpu(capsys):
    assert exit_code(["bench", "fp8-quantize", "--kind", "layouts"]) == 2
    assert "--tiny runs here" in one_error_line(capsys)


def test_unknown_kind_is_one_line(capsys):
    assert exit_code(["bench", "fp8-quantize", "--kind", "rows", "--tiny"]) == 2
    assert "rows" in one_error_line(capsys)
