"""The reference Qwen3-MoE decoder of ``examples/qwen3_moe``: logits against transformers
(goldens of ``tests/hf_golden/make_model_goldens.py``, re-checked against transformers where it
is installed), the train command (the loss falls; one step on a (fsdp=2, ep=4) mesh equals the
one-device step; a resumed run continues where it stopped), its flags, and the MFU formula."""

import importlib.util
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `examples` is a folder of the repository, not an installed package
    sys.path.insert(0, ROOT)

from examples.qwen3_moe import flops, presets, step, train  # noqa: E402
from examples.qwen3_moe.config import decoder_config  # noqa: E402
from examples.qwen3_moe.hf_checkpoint import load_checkpoint  # noqa: E402
from examples.qwen3_moe.model import attention_implementation  # noqa: E402

GOLDEN = os.path.join(ROOT, "tests", "hf_golden", "models")
CASES = ("qwen3_moe", "qwen3_moe_tied")
# Small enough for CI: the tiny preset's model on 8 sequences of 32 tokens.
SMALL = ["--preset", "tiny", "--batch-size", "8", "--seq-len", "32", "--log-every", "5"]


def _rel(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got) - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(case):
    golden = load_file(os.path.join(GOLDEN, case, "golden.safetensors"))
    model = load_checkpoint(os.path.join(GOLDEN, case))
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids))
    logits, stats = forward(state, jnp.asarray(golden["input_ids"], jnp.int32))
    assert _rel(logits, golden["logits"]) <= 1e-5
    moe_layers = model.cfg.moe_layers
    assert moe_layers == ((1,) if case == "qwen3_moe" else (0, 1))
    assert stats.tokens_per_expert.shape == (len(moe_layers), 8)
    assert hasattr(model, "lm_head") == (case == "qwen3_moe")  # tied: the embeddings


def test_checkpoint_errors_name_the_problem(tmp_path):
    source = os.path.join(GOLDEN, "qwen3_moe")
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)
    config = decoder_config(source)
    assert config.num_kv_heads == 2 and config.head_dim == 8 and config.rope_theta == 1e6
    import json

    with open(os.path.join(source, "config.json")) as file:
        hf = json.load(file)
    with pytest.raises(ValueError, match="attention_bias"):
        decoder_config({**hf, "attention_bias": True})
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        decoder_config({**hf, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}})
    with pytest.raises(ValueError, match="model_type"):
        decoder_config({**hf, "model_type": "mixtral"})
    with open(os.path.join(tmp_path, "config.json"), "w") as file:
        json.dump({**hf, "head_dim": 16}, file)
    with pytest.raises(ValueError, match="q_proj.weight.*shape"):
        load_checkpoint(tmp_path)


def test_attention_picks_cudnn_only_on_a_gpu_where_it_fits():
    tiny = presets.build_config(presets.PRESETS["tiny"], dtype="bfloat16")
    h200 = presets.build_config(presets.PRESETS["h200"])
    assert attention_implementation(h200, backend="gpu") == "cudnn"
    assert attention_implementation(h200, backend="cpu") == "xla"
    assert attention_implementation(tiny, backend="gpu") == "cudnn"  # bf16, head_dim 16
    f32 = presets.build_config(presets.PRESETS["tiny"])
    assert attention_implementation(f32, backend="gpu") == "xla"  # cuDNN needs bf16 / fp16


def test_flops_formula_by_hand():
    cfg = presets.build_config(presets.PRESETS["tiny"])
    hidden, vocab = 64, 128
    attention = 2 * 64 * 64 + 2 * 64 * 32 + 2 * 16 + 2 * 64  # q, o; k, v; q/k norms; 2 norms
    dense = 3 * 64 * 128
    expert = 3 * 64 * 64
    counts = flops.parameter_counts(cfg)
    assert counts["embedding"] == vocab * hidden
    assert counts["total"] == (
        2 * vocab * hidden + hidden + 2 * attention + dense + hidden * 8 + 8 * expert
    )
    assert (
        counts["active"]
        == vocab * hidden + hidden + 2 * attention + dense + hidden * 8 + 2 * expert
    )
    per_token = 6 * counts["active"] + 12 * 2 * 4 * 16 * 64
    assert flops.flops_per_token(cfg, 64) == per_token
    assert flops.mfu(1e6, cfg, 64, 1.0) == pytest.approx(1e6 * per_token / 1e12)


def test_h200_preset_fits_by_its_memory_estimate():
    cfg = presets.build_config(presets.PRESETS["h200"])
    assert (cfg.hidden_size, cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.ffn_size) == (
        2048,
        128,
        8,
        768,
    )
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (32, 4, 128)
    preset = presets.PRESETS["h200"]
    estimate = presets.memory_estimate(cfg, preset.batch_size * preset.seq_len)
    assert estimate["total"] == pytest.approx(114.4, abs=0.1)  # the figure of the docstring
    assert estimate["total"] < 0.95 * 140 * 2**30 / 1e9 - 20  # headroom for XLA's temporaries


def test_tiny_training_loss_falls(tmp_path):
    metrics = train.main([*SMALL, "--steps", "20", "--out", str(tmp_path)])
    loss = metrics["loss"]
    assert len(loss) == 20 and np.mean(loss[-4:]) < loss[0] - 0.5, loss
    assert metrics["tokens_per_second"] > 0 and 0 < metrics["mfu"] < 1
    assert np.array(metrics["tokens_per_expert"]).shape == (20, 1, 8)
    assert (tmp_path / "metrics.json").is_file() and (tmp_path / "train.png").is_file()


def _pure_params(state):
    model_state = state[0]
    return jax.device_get(nnx.to_pure_dict(model_state))


def test_mesh_step_equals_one_device_step():
    parser = train.build_parser()
    one = train.run_from_flags(parser.parse_args([*SMALL, "--steps", "5"]))
    meshed = train.run_from_flags(
        parser.parse_args([*SMALL, "--steps", "5", "--mesh", "fsdp=2,ep=4"])
    )
    assert meshed.cfg.moe.ep_axis == "ep" and meshed.cfg.moe.fsdp_expert_weights
    mesh = train.make_mesh(meshed.mesh)
    tokens = np.random.default_rng(0).integers(0, 65, (8, 33), dtype=np.int32)
    results = []
    for run, on in ((one, None), (meshed, mesh)):
        tx = step.adamw(run.learning_rate, run.warmup_steps, run.steps)
        graphdef, state, shardings = step.init_state(run.cfg, tx, run.seed, on)
        train_step = step.make_train_step(graphdef, shardings)
        state, loss, aux, load, _ = train_step(state, train.place_batch(tokens, run.cfg, on))
        results.append((float(loss), float(aux), np.asarray(load), _pure_params(state)))
    experts = nnx.to_pure_dict(state[0])["layers"][1]["mlp"]["experts"]["w_up"]
    assert len(experts.sharding.device_set) == 8  # the updated experts stay sharded
    (loss1, aux1, load1, params1), (loss8, aux8, load8, params8) = results
    assert loss8 == pytest.approx(loss1, rel=1e-6) and aux8 == pytest.approx(aux1, rel=1e-5)
    np.testing.assert_array_equal(load8, load1)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params8, params1
    )


def test_resume_continues_at_the_next_step(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    flags = [*SMALL, "--steps", "4", "--save-every", "2", "--checkpoint-dir", ckpt]
    full = train.main([*flags, "--out", str(tmp_path / "full")])
    shutil.rmtree(os.path.join(ckpt, "4"))  # as if the run had stopped after step 2's save
    resumed = train.main([*flags, "--out", str(tmp_path / "resumed")])
    assert resumed["resumed_from_step"] == 2 and resumed["step"] == [1, 2, 3, 4]
    assert resumed["loss"] == full["loss"]  # the same batches and state: bit for bit


def test_help_and_a_bad_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        train.main(["--help"])
    assert exit_.value.code == 0
    assert "--mesh" in capsys.readouterr().out
    for argv, says in (
        (["--mesh", "fsdp=2,tp=4"], "--mesh"),
        (["--steps", "0"], "--steps"),
        (["--mesh", "ep=3"], "ep=3"),
    ):
        with pytest.raises(SystemExit) as exit_:
            train.main(argv)
        assert exit_.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("jaxmoe: error: ") and says in lines[0]


def _make_model_goldens():
    path = os.path.join(ROOT, "tests", "hf_golden", "make_model_goldens.py")
    spec = importlib.util.spec_from_file_location("make_model_goldens", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case", CASES)
def test_goldens_are_what_transformers_computes(case):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    make = _make_model_goldens()
    golden = load_file(os.path.join(GOLDEN, case, "golden.safetensors"))
    logits = make.model_logits(make.reload(case), golden)
    assert _rel(logits, golden["logits"]) <= 1e-6


@pytest.mark.parametrize("case", CASES)
def test_regenerated_goldens_equal_the_committed_ones(case):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    make = _make_model_goldens()
    golden = load_file(os.path.join(GOLDEN, case, "golden.safetensors"))
    with safe_open(os.path.join(GOLDEN, case, "golden.safetensors"), "np") as file:
        made_with = {k: file.metadata()[k] for k in ("transformers", "torch")}
    if make.versions() != made_with:
        pytest.skip(f"goldens made with {made_with}; installed {make.versions()}")
    made = make.make_case(case)
    stored = load_file(os.path.join(GOLDEN, case, "model.safetensors"))
    assert sorted(made["tensors"]) == sorted(stored)
    for key, value in stored.items():
        np.testing.assert_array_equal(made["tensors"][key], value)
    np.testing.assert_array_equal(made["golden"]["logits"], golden["logits"])
