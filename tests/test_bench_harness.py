"""The benches' row sink (every row printed and the results file rewritten with all rows so far)
and the group sizes the benches and the exactness checks draw."""

import json

import numpy as np

from jaxmoe.bench.gemm import group_sizes_for, hard_group_sizes, layer_group_sizes
from jaxmoe.bench.harness import row_emitter
from jaxmoe.bench.presets import GEMM_SHAPES


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


def test_group_sizes_for_the_benches_and_the_exactness_checks():
    shape = GEMM_SHAPES["qwen3-up"]
    for routing in ("balanced", "skewed"):
        sizes = group_sizes_for(shape, routing)
        assert sizes.dtype == np.int32 and sizes.sum() == shape.m and len(sizes) == shape.groups
    assert np.ptp(group_sizes_for(shape, "balanced")) == 0
    hard = hard_group_sizes(shape.m, shape.groups)
    assert hard.sum() == shape.m - 77 and np.all(hard[:2] == 0) and np.all(hard >= 0)
    layer = layer_group_sizes(shape)
    assert layer.dtype == np.int32 and len(layer) == shape.groups and np.all(layer % 64 == 0)
    assert shape.m * 7 // 8 <= layer.sum() <= shape.m * 7 // 8 + 63 * shape.groups
    np.testing.assert_array_equal(layer, layer_group_sizes(shape))
