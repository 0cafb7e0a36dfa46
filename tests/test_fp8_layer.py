"""The FP8 recipe in the layer: `MoEConfig.fp8_recipe`, routed experts, `jaxmoe.moe`, the demo.

Bounds: one FP8 grouped matmul is within ~4% (relative Frobenius) of the unquantized product
(tests/test_fp8.py); the experts chain three of them (gate, up, down) through the activation,
so their output is asserted within 10% of the unquantized experts, and > 0.5% away (FP8 ran).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe.bench.harness import relative_error
from jaxmoe.experts import routed_experts

BASE = {"num_experts": 4, "top_k": 2, "hidden_size": 64, "ffn_size": 96}


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("recipe", [None, "rowwise", "blockwise"])
@pytest.mark.parametrize("backend", [None, "auto", "xla", "reference", "pallas"])
def test_config_takes_each_recipe_with_each_fp8_backend(recipe, backend):
    # blockwise with "pallas" included: the Mosaic FP8 kernel scales per K step.
    cfg = jaxmoe.MoEConfig(**BASE, fp8_recipe=recipe, grouped_matmul_backend=backend)
    assert cfg.fp8_recipe == recipe
    hash(cfg)


@pytest.mark.parametrize("backend", ["pallas_triton", jaxmoe.ops.grouped_matmul.XlaGroupedMatmul()])
def test_config_refuses_a_recipe_with_a_backend_that_has_no_fp8_path(backend):
    with pytest.raises(
        ValueError, match=r"^MoEConfig\.grouped_matmul_backend: has no FP8 path .*; got .*\. Set"
    ):
        jaxmoe.MoEConfig(**BASE, fp8_recipe="rowwise", grouped_matmul_backend=backend)
    jaxmoe.MoEConfig(**BASE, grouped_matmul_backend=backend)  # fine without the recipe


# ----------------------------------------------------------------------------- experts


def _experts_inputs(dtype):
    rng = np.random.default_rng(0)
    group_sizes = jnp.array([30, 0, 50, 12], jnp.int32)  # an empty expert; 8 rows past the end
    buffer = jnp.asarray(rng.standard_normal((100, 64)), dtype)
    weights = {
        name: jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[1]), jnp.float32)
        for name, shape in (("w_gate", (4, 64, 96)), ("w_up", (4, 64, 96)), ("w_down", (4, 96, 64)))
    }
    return buffer, group_sizes, weights


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=str)
def test_routed_experts_in_fp8_are_close_to_but_not_the_unquantized_experts(recipe, dtype):
    buffer, group_sizes, weights = _experts_inputs(dtype)

    def loss_and_out(weights, recipe):
        out = routed_experts(buffer, group_sizes, weights, "swiglu", "xla", fp8_recipe=recipe)
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    grad_fn = jax.grad(loss_and_out, has_aux=True)
    exact_grads, exact = grad_fn(weights, None)
    fp8_grads, fp8 = grad_fn(weights, recipe)
    assert fp8.dtype == dtype
    assert 0.005 < relative_error(fp8, exact) < 0.10
    np.testing.assert_array_equal(np.asarray(fp8[92:], np.float32), 0.0)  # rows past the groups
    for name, grad in fp8_grads.items():
        assert grad.dtype == jnp.float32  # master weights and their gradients keep param dtype
        assert 0.005 < relative_error(grad, exact_grads[name]) < 0.15


# ----------------------------------------------------------------------------- the layer


def _layer_outputs(recipe, **extra):
    cfg = jaxmoe.MoEConfig(**BASE, dtype=jnp.bfloat16, fp8_recipe=recipe, **extra)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (4, 32, 64), jnp.bfloat16)

    def loss(params):
        y, stats = jaxmoe.moe(params, x, cfg)
        return jnp.sum(y.astype(jnp.float32) ** 2) + stats.aux_loss, (y, stats)

    (_, (y, stats)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return y, stats, grads


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_layer_with_the_recipe_is_close_to_but_not_the_bf16_layer(recipe, capacity_factor):
    y16, stats16, grads16 = _layer_outputs(None, capacity_factor=capacity_factor)
    y8, stats8, grads8 = _layer_outputs(recipe, capacity_factor=capacity_factor)
    assert y8.dtype == jnp.bfloat16
    assert 0.005 < relative_error(y8, y16) < 0.10
    # The router is untouched: same routing, same losses.
    np.testing.assert_array_equal(stats8.tokens_per_expert, stats16.tokens_per_expert)
    np.testing.assert_array_equal(stats8.aux_loss, stats16.aux_loss)
    for name in ("w_up", "w_down"):
        grad8, grad16 = grads8["experts"][name], grads16["experts"][name]
        assert grad8.dtype == jnp.float32
        assert relative_error(grad8, grad16) < 0.15


# ----------------------------------------------------------------------------- the demo


def test_demo_flag_sets_the_recipe_of_every_layer():
    from jaxmoe.cli.demo import DemoConfig, build
    from jaxmoe.cli.main import build_parser

    args = build_parser().parse_args(["demo", "--fp8", "blockwise"])
    assert args.fp8 == "blockwise"
    assert build_parser().parse_args(["demo"]).fp8 is None
    model, _ = build(DemoConfig(fp8=args.fp8, width=32, ffn_size=32), vocab_size=10)
    assert model.cfg.moe.fp8_recipe == "blockwise"
    args = build_parser().parse_args(["demo", "--fp8", "rowwise", "--fp8-wgrad", "fp8"])
    model, _ = build(DemoConfig(fp8=args.fp8, fp8_wgrad=args.fp8_wgrad, width=32), vocab_size=10)
    assert model.cfg.moe.fp8_recipe == jaxmoe.ops.fp8.Fp8Recipe("rowwise", wgrad="fp8")


def test_demo_refuses_an_fp8_wgrad_without_the_rowwise_recipe():
    from jaxmoe.cli.demo import DemoConfig, check_demo_config

    with pytest.raises(ValueError, match="--fp8-wgrad fp8 needs --fp8 rowwise"):
        check_demo_config(DemoConfig(fp8="blockwise", fp8_wgrad="fp8"))


def test_demo_refuses_an_unknown_recipe_in_one_line(capsys):
    from jaxmoe.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--fp8", "fp4"])
    assert exit_info.value.code == 2
    assert "--fp8" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_with_fp8_trains_like_the_unquantized_demo(tmp_path):
    """20 steps of a one-layer demo model on batches of 4 sequences of 32 characters, warmed up
    over 5 steps (the 300-step comparison of the full demo is in
    benchmarks/results/fp8-demo-cpu/).

    Tolerance: after 20 steps the loss is still falling fast (from ln(vocabulary), about 4.8, to
    about 3.3), so the runs are compared within 3% (the issue's 2% is for 300 steps); both must
    have trained, and the FP8 run must differ (it quantized).
    """
    from jaxmoe.cli.demo import DemoConfig, run_demo

    def final_loss(fp8):
        cfg = DemoConfig(
            steps=20,
            warmup_steps=5,
            batch_size=4,
            seq_len=32,
            fp8=fp8,
            sample_chars=8,
            num_layers=1,
            out=str(tmp_path / str(fp8)),
        )
        return run_demo(cfg)["final_loss"]

    baseline, rowwise = final_loss(None), final_loss("rowwise")
    assert baseline < 3.5 and rowwise < 3.5  # both trained
    assert rowwise != baseline
    assert abs(rowwise - baseline) / baseline < 0.03


@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
def test_tokens_quantized_before_the_permutation_are_the_buffer_quantized(recipe):
    """The layer quantizes each token once and permutes the FP8 rows (layer._dispatch_quantized):
    every row in a group has the bits quantize(buffer) gives, and the experts' outputs and
    gradients are bit for bit those of quantizing the buffer inside the matmuls."""
    from jaxmoe import permutation
    from jaxmoe.layer import _dispatch_quantized
    from jaxmoe.ops.fp8 import quantize, resolve_recipe

    cfg = jaxmoe.MoEConfig(**BASE, fp8_recipe=recipe)
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.standard_normal((40, 64)) * rng.uniform(0.1, 10, (40, 1)), jnp.float32)
    # Two distinct experts of 0..2 per token, as a top-k gives; expert 3 gets no token.
    experts = jnp.asarray(np.argsort(rng.random((40, 3)), axis=-1)[:, :2], jnp.int32)
    plan = permutation.plan_dispatch(experts, 4, alignment=8)
    buffer = permutation.dispatch(tokens, plan)
    q, scale = _dispatch_quantized(tokens, plan, cfg)
    blocks = resolve_recipe(recipe).lhs_blocks
    want_q, want_scale = quantize(buffer, blocks)
    live = int(jnp.sum(plan.group_sizes))
    np.testing.assert_array_equal(q.astype(jnp.float32), want_q.astype(jnp.float32))
    used = np.asarray(jnp.any(buffer != 0, axis=1))  # token rows (padding rows are zeros)
    np.testing.assert_array_equal(scale[used], want_scale[used])
    assert used[:live].sum() == 80

    weights = _experts_inputs(jnp.float32)[2]

    def loss(weights, buffer, buffer_fp8):
        out = routed_experts(
            buffer,
            plan.group_sizes,
            weights,
            "swiglu",
            "xla",
            fp8_recipe=recipe,
            buffer_fp8=buffer_fp8,
        )
        return jnp.sum(out**2), out

    grad_fn = jax.grad(loss, (0, 1), has_aux=True)
    (grads, grad_buffer), out = grad_fn(weights, buffer, None)
    (grads_f, grad_buffer_f), out_f = grad_fn(weights, buffer, (q, scale))
    np.testing.assert_array_equal(out_f, out)
    np.testing.assert_array_equal(grad_buffer_f, grad_buffer)
    for name in grads:
        np.testing.assert_array_equal(grads_f[name], grads[name])


def test_fp8_grouped_matmul_refuses_activations_of_the_wrong_shape():
    from jaxmoe.ops.fp8 import fp8_grouped_matmul, quantize

    lhs, rhs = jnp.ones((8, 16)), jnp.ones((2, 16, 4))
    q, scale = quantize(lhs, (1, None))
    with pytest.raises(ValueError, match="`lhs_fp8` must be the pair"):
        fp8_grouped_matmul(lhs, rhs, jnp.array([4, 4]), lhs_fp8=(q[:4], scale[:4]))
    with pytest.raises(ValueError, match="`lhs_fp8` must be the pair"):
        fp8_grouped_matmul(lhs, rhs, jnp.array([4, 4]), lhs_fp8=q)
