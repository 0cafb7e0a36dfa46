"""Smoke tests of the ``jaxmoe`` command line: demo, bench layer, bench gemm, errors.

They run the commands in-process (``main([...])``), which shares the test session's JAX start-up,
and keep each run tiny (a few steps, the ``tiny`` preset, few timing samples).
"""

import argparse
import importlib.util
import json
import math
import runpy
import sys

import jax
import jax.numpy as jnp
import pytest
from cli_run import exit_code, one_error_line
from flax import nnx
from jax.sharding import PartitionSpec

from jaxmoe.cli.demo import DemoConfig, build, make_mesh, make_train_step, state_shardings
from jaxmoe.cli.main import main


def test_module_entry_point_prints_help(monkeypatch, capsys):
    """``python -m jaxmoe --help``, run in-process as ``-m`` runs it (runpy, sys.argv)."""
    monkeypatch.setattr(sys, "argv", ["python -m jaxmoe", "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("jaxmoe", run_name="__main__", alter_sys=True)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "bench" in out


def test_demo_expert_parallel_with_expert_bias_writes_metrics_and_plot(tmp_path, capsys):
    """One demo run takes every demo path the CLI offers beside the default (one device and
    softmax: tests/test_checkpoint.py and tests/test_fp8_layer.py run those): expert parallel on
    2 devices, the sigmoid score with expert-bias updates. One test, not a shared fixture: each
    run costs ~25 s, mostly compilation, and pytest-xdist would run a fixture once per worker."""
    argv = ["demo", "--steps", "3", "--devices", "2", "--score", "sigmoid", "--sample-chars", "8"]
    assert main([*argv, "--expert-bias-rate", "0.01", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    config = metrics["config"]
    assert (config["devices"], config["score"], config["expert_bias_rate"]) == (2, "sigmoid", 0.01)
    assert metrics["step"] == [1, 2, 3]
    assert len(metrics["loss"]) == 3
    assert all(math.isfinite(v) for v in metrics["loss"])
    load = metrics["tokens_per_expert"]
    assert len(load) == 3 and len(load[0]) == 2 and len(load[0][0]) == 8  # steps, layers, E
    # Dropless top-2, gathered over both devices: every token is routed twice in every layer.
    tokens = config["batch_size"] * config["seq_len"]
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


def test_expert_parallel_train_step_compiles_once():
    # The state goes in laid out as the step returns it (the experts' weights and moments over
    # ep, the rest replicated; specs without trailing Nones, as jit returns them), so the second
    # step reuses the first's program. (Left to XLA, the first step returns the state laid out
    # on the mesh where it went in without one, and the second step compiles again: jax's
    # behaviour, not tested here.)
    cfg = DemoConfig(steps=2, devices=2, width=32, ffn_size=32, seq_len=16, batch_size=4)
    model, optimizer = build(cfg, vocab_size=65)
    graphdef, state = nnx.split((model, optimizer))
    shardings = state_shardings(state, make_mesh(cfg.devices), model.cfg.moe)
    experts = shardings[0]["blocks"][0]["moe"]["experts"]
    assert experts["w_gate"].get_value().spec == PartitionSpec("ep")
    assert shardings[0]["embed"]["embedding"].get_value().spec == PartitionSpec()
    step = make_train_step(graphdef, 0.0, shardings)
    state = jax.device_put(state, shardings)
    tokens = jnp.zeros((cfg.batch_size, cfg.seq_len + 1), jnp.int32)
    for _ in range(2):
        state, loss, *_ = step(state, tokens)
    assert jnp.isfinite(loss)
    assert step._cache_size() == 1


def _bench_rows(path):
    data = json.loads(path.read_text())
    assert {"device", "jax", "torch", "date", "command"} <= set(data["header"])
    return data["rows"]


def test_bench_layer_tiny(tmp_path):
    out = tmp_path / "layer.json"
    # 64 of the tiny preset's 256 tokens: each impl's call is also timed 20 times on its own.
    argv = ["bench", "layer", "--preset", "tiny", "--tokens", "64", "--repeats", "3"]
    argv += ["--settle-ms", "2"]
    assert main([*argv, "--out", str(out)]) == 0
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
        assert row["ms_per_call"] > 0, row  # each call also timed on its own
        assert row["timing"]["settle_ms"] == 2.0, row  # each sample after 2 ms untimed
        assert row["rel_err"] < 3e-2


def test_bench_layer_fp8_recipe_rows(tmp_path):
    from jaxmoe.bench import layer

    out = tmp_path / "layer.json"
    impls = "jaxmoe-fp8-rowwise,jaxmoe-fp8-rowwise-cached,jaxmoe-fp8-rowwise-fp8wgrad"
    # 64 of the tiny preset's 256 tokens: each impl's call is also timed 20 times on its own.
    argv = ["bench", "layer", "--impls", impls, "--pass", "fwd,fwd+bwd", "--tokens", "64"]
    assert main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    rows = _bench_rows(out)
    for impl in ("jaxmoe-fp8-rowwise", "jaxmoe-fp8-rowwise-cached", "jaxmoe-fp8-rowwise-fp8wgrad"):
        fp8 = [r for r in rows if r["impl"] == impl]
        assert len(fp8) == 2 and all(r["fp8_recipe"] == "rowwise" and r["ms"] > 0 for r in fp8)
        assert all(r["fp8_wgrad"] == ("fp8" if "fp8wgrad" in impl else "auto") for r in fp8)
        # The tiny preset (H=64, F=128) is far below the FP8 wgrad's width: "auto" runs "high".
        assert all(r["fp8_wgrad_runs"] == ("fp8" if "fp8wgrad" in impl else "high") for r in fp8)
        # FP8 rounding shows (it is not the bf16 layer) but stays within the FP8 tolerance.
        assert all(3e-3 < r["rel_err"] < layer.FP8_REL_TOL for r in fp8), fp8
    # The cache (weights quantized once, outside the timed calls) is the same layer, bit for bit.
    for pass_ in ("fwd", "fwd+bwd"):
        errors = {r["impl"]: r["rel_err"] for r in rows if r["pass"] == pass_}
        assert errors["jaxmoe-fp8-rowwise"] == errors["jaxmoe-fp8-rowwise-cached"]
    with pytest.raises(ValueError, match="jaxmoe-fp8-<recipe>"):
        layer.check_impls(["jaxmoe-fp8-tensorwise"])
    with pytest.raises(ValueError, match="jaxmoe-fp8-<recipe>"):
        layer.check_impls(["jaxmoe-fp8-rowwise-cache"])
    with pytest.raises(ValueError, match="wgrad='fp8' needs name='rowwise'"):
        layer.check_impls(["jaxmoe-fp8-blockwise-fp8wgrad"])


def test_bench_layer_torchtitan_is_skipped_with_a_reason(tmp_path):
    """The opt-in torchtitan peer, where torch, CUDA or torchtitan is missing (as on CI), gives
    skipped rows that say why, not errors, and the run still succeeds."""
    if importlib.util.find_spec("torch") is not None and torch_cuda_available():
        pytest.skip("torch with CUDA is here: the torchtitan peer may run")
    out = tmp_path / "layer.json"
    argv = ["bench", "layer", "--preset", "tiny", "--impls", "torchtitan,jaxmoe", "--pass", "fwd"]
    assert main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    rows = {r["impl"]: r for r in _bench_rows(out)}
    titan = rows["torchtitan"]
    assert titan["ms"] is None and not titan.get("error"), titan
    assert "torch" in titan["skipped"], titan
    assert rows["jaxmoe"]["ms"] > 0


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


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


# --------------------------------------------------------------------------------------------------
# The command-line rules: a bad flag is one line and exit status 2, before any work.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["demo", "--seed", "-1"], "--seed"),
        (["demo", "--aux-loss", "nan"], "--aux-loss"),
        (["demo", "--expert-bias-rate", "inf"], "--expert-bias-rate"),
        (["demo", "--steps", "0"], "--steps"),
        (["demo", "--top-k", "two"], "--top-k"),
        (["demo", "--experts", "1.5"], "--experts"),
        (["demo", "--devices", "0"], "--devices"),
        (["demo", "--sample-chars", "-1"], "--sample-chars"),
        (["bench", "gemm", "--tokens", "-1"], "--tokens"),
        (["bench", "gemm", "--compare", "foo"], "'foo'"),
        (["bench", "gemm", "--pass", "bwd"], "'bwd'"),
        (["bench", "gemm", "--routings", "uniform"], "'uniform'"),
        (["bench", "gemm", "--shapes", "huge"], "'huge'"),
        (["bench", "layer", "--repeats", "0"], "--repeats"),
        (["bench", "layer", "--settle-ms", "-1"], "--settle-ms"),
        (["bench", "layer", "--compare", "jaxmoe-foo"], "jaxmoe-foo"),
        (["bench", "layer", "--dtype", "fp8"], "--dtype"),
        (["bench", "gemm", "--budget-s", "-5"], "--budget-s"),
        (["bench", "ep", "--repeats", "3"], "--repeats"),
        (["bench", "ep", "--ep", "0"], "--ep"),
        (["bench", "ep", "--ep", "1,x"], "--ep"),
        (["bench", "ep", "--receive-factor", "inf"], "--receive-factor"),
        (["bench", "ep", "--chunks", "0"], "--chunks"),
        (["bench", "ep", "--parts", "all"], "'all'"),
        (["bench", "ep", "--preset", "qwen3"], "--preset"),
        (["bench", "ep", "--preset", "tiny,dsv3"], "--preset"),
        (["bench", "ep", "--ep", "64"], "--ep"),
        (["bench", "nope"], "invalid choice"),
        (["demo", "--no-such-flag"], "--no-such-flag"),
    ],
)
def test_bad_flag_is_one_line_and_status_2(argv, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the demo's default --out folder lands here
    assert exit_code(argv) == 2
    assert says in one_error_line(capsys)


def test_demo_cross_flag_error_is_one_line(tmp_path, capsys):
    argv = ["demo", "--expert-bias-rate", "0.01", "--out", str(tmp_path)]
    assert exit_code(argv) == 2
    assert "--score sigmoid" in one_error_line(capsys)


@pytest.mark.parametrize("kind", ["gemm", "layer", "ep"])
def test_unwritable_out_fails_before_the_benchmark(kind, monkeypatch, capsys):
    from jaxmoe.bench import expert_parallel, gemm, layer

    def must_not_run(*args, **kwargs):
        raise AssertionError("the benchmark ran although --out cannot be written")

    monkeypatch.setattr(gemm, "run_gemm_benchmark", must_not_run)
    monkeypatch.setattr(layer, "run_layer_benchmark", must_not_run)
    monkeypatch.setattr(expert_parallel, "run_ep_benchmark", must_not_run)
    assert exit_code(["bench", kind, "--out", "/proc/jaxmoe/x.json"]) == 2
    line = one_error_line(capsys)
    assert "--out" in line and "/proc/jaxmoe/x.json" in line


def test_out_that_is_a_folder_is_refused(tmp_path, capsys):
    assert exit_code(["bench", "layer", "--out", str(tmp_path)]) == 2
    assert "folder" in one_error_line(capsys)


def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_every_help_shows_every_default():
    from jaxmoe.cli import bench_commands
    from jaxmoe.cli.main import build_parser

    parsers = list(_all_parsers(build_parser()))
    # jaxmoe, demo, bench, gemm, layer, ep, and the other bench subcommands
    assert len(parsers) == 6 + len(bench_commands.KINDS)
    for parser in parsers:
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if action.option_strings and action.default is not argparse.SUPPRESS:
                assert f"(default: {action.default})" in text, (parser.prog, action.dest)


def test_gemm_help_lists_every_peer():
    from jaxmoe.bench import gemm
    from jaxmoe.cli.main import build_parser

    gemm_parser = next(p for p in _all_parsers(build_parser()) if p.prog.endswith("gemm"))
    text = " ".join(gemm_parser.format_help().split())
    assert all(impl in text for impl in gemm.IMPLS)


def _table_head(out: str, first_column: str) -> list[str]:
    """The table's heading and rule lines: every bench prints the same kind of table."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_column + " "))
    heading, rule = lines[start], lines[start + 1]
    assert heading.split()[-1] == "note" and set(rule.replace(" ", "")) == {"-"}
    return heading.split()


def test_gemm_skips_peers_the_platform_lacks(tmp_path, capsys):
    """On CPU: jax's Mosaic GPU peer and jaxmoe's Mosaic backend (and torch without CUDA) are
    skipped rows with a reason."""
    from jaxmoe.bench import gemm as gemm_bench

    out = tmp_path / "gemm.json"
    argv = ["bench", "gemm", "--preset", "tiny", "--pass", "fwd", "--routings", "balanced"]
    assert main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    rows = _bench_rows(out)
    by_impl = {r["impl"]: r for r in rows}
    assert set(by_impl) == set(gemm_bench.IMPLS)
    assert not any(r.get("error") for r in rows)
    assert "NVIDIA GPU" in by_impl["jax_mosaic"]["skipped"]
    assert "Mosaic GPU" in by_impl["jaxmoe_pallas"]["skipped"]
    assert by_impl["jax_mosaic"]["ms"] is None
    stdout = capsys.readouterr().out
    assert "ERROR" not in stdout
    assert _table_head(stdout, "shape")[:3] == ["shape", "m", "k"]


def test_layer_and_ep_print_the_same_kind_of_table(tmp_path, capsys):
    argv = ["bench", "layer", "--compare", "jaxmoe-xla", "--pass", "fwd", "--repeats", "1"]
    assert main([*argv, "--tokens", "64"]) == 0
    assert _table_head(capsys.readouterr().out, "preset")[:2] == ["preset", "tokens"]
    out = tmp_path / "ep.json"
    argv = ["bench", "ep", "--preset", "tiny", "--ep", "1", "--parts", "layer"]
    assert main([*argv, "--out", str(out)]) == 0
    assert _table_head(capsys.readouterr().out, "case")[:3] == ["case", "ep", "impl"]
    rows = _bench_rows(out)
    assert {r["case"] for r in rows} == {"layer_fwd_bwd:dsv3-tiny", "layer_fwd_bwd:mixtral-tiny"}


def test_layer_bench_reports_every_row_as_it_goes():
    """A run cut by a time limit keeps what it measured: on_row sees the rows after each one."""
    from jaxmoe.bench import layer

    seen = []
    _, rows = layer.run_layer_benchmark(
        ["tiny"],
        ["jaxmoe"],
        ["fwd", "fwd+bwd"],
        repeats=1,
        tokens=64,
        log=lambda _: None,
        on_row=lambda rows: seen.append(len(rows)),
    )
    assert seen == [1, 2] and len(rows) == 2


# --------------------------------------------------------------------------------------------------
# Flags that cannot work, found by trying the commands adversarially: exit status 2 before any
# work, and no folder left behind.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--out", "--checkpoint-dir"])
def test_demo_refuses_an_empty_folder_name(flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert exit_code(["demo", flag, ""]) == 2
    assert f"argument {flag}: must name a folder" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_demo_folder_under_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    assert exit_code(["demo", "--out", str(tmp_path / "file" / "run")]) == 2
    assert "is not a folder" in one_error_line(capsys)


def test_a_rejected_demo_creates_no_folder(capsys, tmp_path):
    out, checkpoints = tmp_path / "out", tmp_path / "checkpoints"
    argv = ["demo", "--expert-bias-rate", "0.01", "--out", str(out)]
    assert exit_code([*argv, "--checkpoint-dir", str(checkpoints)]) == 2
    assert "--score sigmoid" in one_error_line(capsys)
    assert not out.exists() and not checkpoints.exists()


@pytest.mark.parametrize("value", ["0.5", "0.99"])
def test_bench_ep_fast_slot_factor_below_one(value, capsys, monkeypatch):
    from jaxmoe.bench import expert_parallel

    def must_not_run(*args, **kwargs):
        raise AssertionError("the benchmark ran with a fast slot factor below 1")

    monkeypatch.setattr(expert_parallel, "run_ep_benchmark", must_not_run)
    assert exit_code(["bench", "ep", "--fast-slot-factor", value]) == 2
    assert "argument --fast-slot-factor: must be a finite number >= 1" in one_error_line(capsys)


def test_demo_help_states_each_fp8_default_once():
    from jaxmoe.cli.main import build_parser

    """The formatter appends ``(default: X)`` (test_cli checks it is there); the flag's own
    text must not state the default a second time."""
    demo = next(
        sub
        for action in build_parser()._actions
        if isinstance(getattr(action, "choices", None), dict)
        for name, sub in action.choices.items()
        if name == "demo"
    )
    text = " ".join(demo.format_help().split())
    for action in demo._actions:
        if action.dest in ("fp8", "fp8_wgrad"):
            assert "default" not in action.help, action.help
            assert text.count(f"{action.help} (default: {action.default})") == 1


def test_demo_resume_to_more_steps_and_its_rates(tmp_path, capsys, monkeypatch):
    """A resume with a larger --steps trains on to it and says so; rates count only the steps
    this run timed (after its first, compiling one), and a run of that one step writes none."""
    import dataclasses

    from jaxmoe.cli import demo
    from jaxmoe.cli.resume import check_resume

    small = dict(width=16, ffn_size=16, seq_len=8, batch_size=4, sample_chars=2, num_layers=1)
    ckpt = tmp_path / "ckpt"
    cfg = DemoConfig(steps=2, out=str(tmp_path / "a"), checkpoint_dir=str(ckpt), **small)
    assert demo.run_demo(dataclasses.replace(cfg, save_every=1))["tokens_per_second"] > 0
    capsys.readouterr()
    # The checkpoint holds the run's flags: another --top-k is refused before any work.
    with pytest.raises(ValueError, match=r"--top-k 2 \(this run: 1\)"):
        check_resume(dataclasses.replace(cfg, top_k=1))
    assert check_resume(dataclasses.replace(cfg, fp8_wgrad="high")) == 2  # no --fp8: no effect

    timed, rate = [], demo.tokens_per_second

    def recording(tokens_per_step, timed_steps, seconds):
        timed.append(timed_steps)
        return rate(tokens_per_step, timed_steps, seconds)

    monkeypatch.setattr(demo, "tokens_per_second", recording)
    resumed = demo.run_demo(dataclasses.replace(cfg, steps=12, out=str(tmp_path / "b")))
    out = capsys.readouterr().out
    assert (
        f"resumed from step 2 of {ckpt}, training on to --steps 12 (the checkpoint's run had "
        "--steps 2; the learning-rate schedule now spans 12 steps)" in out
    )
    assert resumed["step"] == list(range(1, 13))
    assert timed == [7, 9, 9]  # the bar at steps 10 and 12, the summary: steps 4..12 timed
    timed.clear()

    assert "sample" in resumed
    # One more step, sampling nothing (--sample-chars 0; a resume may change it).
    last = demo.run_demo(
        dataclasses.replace(cfg, steps=13, out=str(tmp_path / "c"), sample_chars=0)
    )
    assert timed == [0, 0] and last["tokens_per_second"] is None
    assert json.loads((tmp_path / "c" / "metrics.json").read_text())["tokens_per_second"] is None
    out = capsys.readouterr().out
    assert "tokens/s not measured" in out and "sample:" not in out and "sample" not in last
