"""Flags of ``jaxmoe`` that cannot work, between flags or against the library's rules: one
``jaxmoe: error:`` line naming the flag and exit status 2, before the bench runs (each test
makes the bench itself fail the test if it starts)."""

import pytest
from cli_run import exit_code, one_error_line

from jaxmoe.bench import ep_memory, expert_parallel, layer_profile


@pytest.fixture
def benches_must_not_run(monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the bench ran although its flags cannot work")

    monkeypatch.setattr(expert_parallel, "run_ep_benchmark", must_not_run)
    monkeypatch.setattr(ep_memory, "run_ep_memory", must_not_run)
    monkeypatch.setattr(layer_profile, "run_layer_profile", must_not_run)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # 3 does not divide the 8 experts of the tiny mixtral layer.
        (["bench", "ep", "--ep", "3"], "argument --ep: 3 does not divide the 8 experts"),
        (["bench", "ep", "--ep", "1,2,6", "--preset", "mixtral"], "6 does not divide the 8"),
        (["bench", "ep", "--ep", "3", "--preset", "megatron-dsv3"], "3 does not divide the 256"),
        # A size past what one process drives is refused before JAX is asked for the devices.
        (["bench", "ep", "--ep", "1000"], "argument --ep: 1000 devices is more than"),
        (["bench", "ep", "--exchange-ep", "2,128"], "argument --exchange-ep: 128 devices"),
        (["bench", "ep-memory", "--ep", "1000"], "argument --ep: 1000 devices is more than"),
        (["demo", "--devices", "1000"], "argument --devices: 1000 devices is more than"),
        # ep_chunks must divide each device's tokens (64 in the tiny layers).
        (["bench", "ep", "--chunks", "7"], "argument --chunks: 7 must divide the 64 tokens"),
        # The -tokens presets are dropless (a MoEConfig rule, with the flag that breaks it).
        (["bench", "ep", "--preset", "dsv3-tokens"], "argument --preset: MoEConfig.ep_dispatch"),
        (["bench", "ep", "--preset", "dsv3-tokens"], "ep_receive_factor is --receive-factor"),
        (["bench", "ep", "--layer-exchange", "ragged_all_to_all"], "does not run on cpu"),
        (["bench", "ep-memory", "--ep", "3"], "argument --ep: 3 does not divide the 32 experts"),
        (["bench", "layer-profile", "--sites", "gmm,foo"], "argument --sites: unknown kernels"),
        (
            ["bench", "layer-profile", "--tile-variants", '{"v": {"blok_m": 64}}'],
            "argument --tile-variants: variant 'v' sets blok_m",
        ),
        (
            ["bench", "layer-profile", "--sites", "wgrad", "--tile-variants", '{"v": {"ring": 1}}'],
            "not fields of MosaicTgmmTileConfig",
        ),
        (
            ["bench", "layer-profile", "--backend-variants", '{"v": {"fused": false}}'],
            "argument --backend-variants: variant 'v' sets fused",
        ),
    ],
)
def test_flags_that_cannot_work(argv, says, benches_must_not_run, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert exit_code(argv) == 2
    assert says in one_error_line(capsys)


def test_ep_rules_only_bind_the_parts_that_run(monkeypatch, capsys):
    """--ep 3 splits the correctness check's 2*ep experts: without the layer part it runs."""
    calls = []

    def run(ep_sizes, **kwargs):
        calls.append((ep_sizes, kwargs["parts"]))
        kwargs["on_row"]({"case": "correctness", "ep": 3, "ok": True})

    monkeypatch.setattr(expert_parallel, "run_ep_benchmark", run)
    argv = ["bench", "ep", "--ep", "3", "--chunks", "7", "--parts", "correctness"]
    assert exit_code(argv) == 0
    assert calls == [([3], ["correctness"])]


def test_bench_ep_correctness_rows_are_told_apart(monkeypatch, capsys):
    """Each correctness check is its own row: the two token-dispatch checks (the fast window
    only, and overflow windows forced by fast_slot_factor=1) used to read the same."""
    from jaxmoe.bench import sharded_correctness

    def fake_check(ep, impl, *, tiny=False, fast_slot_factor=1.125, ep_dispatch="copies"):
        label = sharded_correctness.correctness_label(impl, ep_dispatch, fast_slot_factor)
        return {"case": "correctness", "ep": ep, "impl": label, "max_rel_err": 0.0, "ok": True}

    monkeypatch.setattr(expert_parallel, "check_correctness", fake_check)
    argv = ["bench", "ep", "--preset", "tiny", "--ep", "2", "--parts", "correctness"]
    assert exit_code(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("corr")]
    assert len(rows) == 5, rows  # three exchanges (one skipped on CPU), two token checks
    assert len(set(rows)) == len(rows), rows
    assert any("fast_slot_factor=1)" in row for row in rows), rows
