"""The model-level comparison's pieces that run on a CPU: torchtitan's peer counts the same
parameters and FLOPs and follows the same learning-rate schedule as the JAX side, the step
profile attributes every op of the compiled step to a scope, and the driver turns each phase's
metrics into rows (the GPU run itself: docs/performance.md)."""

import json
import os
import subprocess
import sys

import numpy as np
import optax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `examples` is a folder of the repository, not an installed package
    sys.path.insert(0, ROOT)

from examples.qwen3_moe import compare, flops, profile_step, torchtitan_peer  # noqa: E402
from examples.qwen3_moe.data import Batches  # noqa: E402
from examples.qwen3_moe.step import adamw, init_state, make_train_step  # noqa: E402
from examples.qwen3_moe.train import build_parser, place_batch, run_from_flags  # noqa: E402


def test_h200_shape_counts_what_torchtitan_counts():
    # torchtitan 0.3.0's Qwen3 30B-A3B flavour cut to one layer reports 1,245,452,544
    # parameters and 2,409,666,048 FLOPs per token at S=4096 (get_nparams_and_flops).
    cfg = torchtitan_peer.h200_config(1)
    assert flops.parameter_counts(cfg)["total"] == 1_245_452_544
    assert flops.flops_per_token(cfg, 4096) == 2_409_666_048
    assert torchtitan_peer.h200_config(8).moe_layers == tuple(range(8))


def test_peer_schedule_is_the_jax_schedule():
    lr, warmup, steps = 3e-4, 10, 50
    want = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, end_value=0.1 * lr)
    multiplier = torchtitan_peer.lr_lambda(warmup, steps)
    got = [lr * multiplier(step) for step in range(steps + 1)]
    np.testing.assert_allclose(got, [float(want(step)) for step in range(steps + 1)], atol=1e-9)


def test_profile_scopes_cover_the_tiny_step():
    run = run_from_flags(build_parser().parse_args(["--preset", "tiny"]))
    graphdef, state, shardings = init_state(run.cfg, adamw(1e-3, 1, 10), 0)
    batches = Batches(run.data, run.cfg.vocab_size, 2, 16, np.random.default_rng(0))
    batch = place_batch(batches.next(), run.cfg, None)
    text = make_train_step(graphdef, shardings).lower(state, batch).compile().as_text()
    scopes = profile_step.op_scopes(text)
    assert set(scopes.values()) >= {"jaxmoe", "attention", "lm_head", "optimizer"}


def _float32_head_dots(float32_logits: bool) -> int:
    """The lowered bf16 tiny step's dot_generals with float32 operands of the vocabulary's width."""
    flags = ["--preset", "tiny", "--dtype", "bfloat16"]
    flags += [] if float32_logits else ["--logits-dtype", "compute"]
    run = run_from_flags(build_parser().parse_args(flags))
    graphdef, state, shardings = init_state(run.cfg, adamw(1e-3, 1, 10), 0)
    batches = Batches(run.data, run.cfg.vocab_size, 2, 16, np.random.default_rng(0))
    batch = place_batch(batches.next(), run.cfg, None)
    text = make_train_step(graphdef, shardings).lower(state, batch).as_text()
    vocab = f"x{run.cfg.vocab_size}xf32>"
    return sum(
        1 for line in text.splitlines() if "dot_general" in line and vocab in line.split("->")[0]
    )


def test_compute_dtype_logits_take_the_head_backward_out_of_float32():
    # float32 logits: the cotangent reaching the head is float32, and so are its backward dots.
    assert _float32_head_dots(True) >= 2
    assert _float32_head_dots(False) == 0


def test_profile_breakdown_shares_and_idle():
    scopes = {"a.1": "jaxmoe", "b.2": "attention", "c.3": "optimizer"}
    # Two steps: kernels of 3 + 1 + 1 ms with a 1 ms gap each step, and one unnamed kernel.
    events = []
    for step in range(2):
        t = step * 10e6
        events += [("k", "a.1", t, 3e6), ("k", "b.2", t + 4e6, 1e6), ("k", "c.3", t + 5e6, 1e6)]
    events.append(("k", "", 16e6, 1e6))
    result = profile_step.step_breakdown(events, scopes, steps=2)
    assert result["ms"]["jaxmoe"] == pytest.approx(3.0)
    assert result["ms"]["unattributed"] == pytest.approx(0.5)
    assert result["kernel_ms"] == pytest.approx(5.5)
    assert result["span_ms"] == pytest.approx(8.5)
    # Gaps: 1 ms inside each step and 4 ms between them; the unnamed kernel starts as the
    # second step's last one ends.
    assert result["idle_ms"] == pytest.approx((1 + 4 + 1) / 2)
    assert sum(result["share"].values()) == pytest.approx(1.0)


def test_compare_rows_and_ratios(tmp_path, monkeypatch):
    def fake_run(command, **kwargs):
        if command[0] == "nvidia-smi":
            raise FileNotFoundError(command[0])
        assert kwargs["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.95"
        folder = command[command.index("--out") + 1]
        os.makedirs(folder)
        rate = 2000.0 if "torchtitan_peer" in " ".join(command) else 3000.0
        if "--fp8" in command:
            return subprocess.CompletedProcess(command, 1)  # a failed phase is reported
        metrics = dict(
            tokens_per_second=rate,
            tokens_per_step=600,
            mfu=0.3,
            peak_memory_bytes=2**30,
            compile_seconds=5.0,
            timed_steps=3,
            loss=[5.0, 4.0],
            flops_per_token=1e9,
        )
        with open(os.path.join(folder, "metrics.json"), "w") as f:
            json.dump(metrics, f)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(compare.subprocess, "run", fake_run)
    rows = compare.main(["--steps", "4", "--rounds", "2", "--out", str(tmp_path)])
    variant = compare.build_parser().parse_args(["--jaxmoe-variant", "b16=--logits-dtype compute"])
    assert compare.phases(variant)[-1] == (
        "jaxmoe-b16",
        [*compare.phases(variant)[0][1], "--logits-dtype", "compute"],
    )
    assert [(r["impl"], r["round"]) for r in rows] == [
        ("jaxmoe-bf16", 0),
        ("torchtitan", 0),
        ("jaxmoe-bf16", 1),
        ("torchtitan", 1),
    ]
    assert rows[0]["vs_torchtitan"] == pytest.approx(1.5)
    assert rows[0]["peak_memory_gib"] == pytest.approx(1.0)
    assert rows[1]["ms"] == pytest.approx(300.0)  # 600 tokens at 2000 tokens/s
    saved = json.loads((tmp_path / "rows.json").read_text())
    assert saved["header"]["device"] == "cpu"
    assert saved["header"]["command"].endswith("--rounds 2 --out " + str(tmp_path))
    assert saved["failures"] == [
        {"impl": "jaxmoe-fp8-rowwise", "round": 0, "status": 1},
        {"impl": "jaxmoe-fp8-rowwise", "round": 1, "status": 1},
    ]
