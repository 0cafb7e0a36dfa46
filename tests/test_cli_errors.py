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


# --------------------------------------------------------------------------------------------------
# demo: every MoEConfig rule at flag check; a resume with other flags, or with nothing to do.
# --------------------------------------------------------------------------------------------------


def test_demo_layer_rule_is_one_line_naming_the_flags(capsys, tmp_path):
    """top_k=1 with softmax after the top-k trains no router (MoEConfig's rule, its message)."""
    out = tmp_path / "out"
    assert exit_code(["demo", "--top-k", "1", "--aux-loss", "0", "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert "argument --top-k: MoEConfig.top_k: must not be 1 with score='softmax'" in line
    assert "score is --score" in line and "aux_loss_coef is --aux-loss" in line
    assert not out.exists()


def _fake_demo_checkpoint(directory, step: int, **flags):
    """A checkpoint as the demo saves it, holding the run's flags (no training needed)."""
    import dataclasses

    import jax.numpy as jnp

    from jaxmoe import checkpoint
    from jaxmoe.cli.demo import DemoConfig

    config = dataclasses.asdict(DemoConfig(checkpoint_dir=str(directory), **flags))
    items = {"state": {"w": jnp.zeros(2)}}
    checkpoint.save(directory, step, items, metadata={"config": config})


def test_demo_resumed_with_other_flags_is_refused(capsys, tmp_path):
    ckpt = tmp_path / "ckpt"
    _fake_demo_checkpoint(ckpt, 2, num_experts=8, seed=3)
    argv = ["demo", "--experts", "4", "--checkpoint-dir", str(ckpt), "--out", str(tmp_path / "o")]
    assert exit_code(argv) == 2
    line = one_error_line(capsys)
    assert f"argument --checkpoint-dir: {ckpt} holds step 2 of a run with other flags" in line
    assert "--experts 8 (this run: 4), --seed 3 (this run: 0)" in line
    assert not (tmp_path / "o").exists()


def test_demo_resume_with_nothing_to_do(capsys, tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    _fake_demo_checkpoint(ckpt, 5, steps=5)
    for steps in ("5", "3"):  # at, then past --steps
        argv = ["demo", "--steps", steps, "--checkpoint-dir", str(ckpt), "--out", str(out)]
        assert exit_code(argv) == 0
        said = capsys.readouterr().out.strip()
        assert said == (
            f"jaxmoe demo: nothing to do: {ckpt} is at step 5, at or past --steps {steps} "
            "(raise --steps to train on)"
        )
    assert not out.exists()  # no metrics.json, no rate
