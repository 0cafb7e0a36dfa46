"""The layer options of Qwen2-MoE and gpt-oss against the dense float64 reference.

``shared_expert_gate`` (the shared expert's output times ``sigmoid(x @ output_gate)``),
``router_bias`` (affine router logits), ``expert_ffn_bias`` (a bias on each expert projection,
the down bias carried by each routed copy) and ``activation="swiglu_clamped"`` (gpt-oss's
clamped SwiGLU with ``swiglu_alpha`` and ``swiglu_limit``): forward and every gradient on one
device on the xla, reference and an interpreted Pallas backend, the capacity and padded-block
paths, under expert parallelism on a 2x4 mesh (both dispatches, FSDP), in FP8, in the Flax
modules and through a checkpoint; and the refusals.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxmoe
import jaxmoe.nn
from jaxmoe import checkpoint, experts
from jaxmoe.bench.harness import relative_error
from jaxmoe.ops.grouped_matmul.pallas_triton import PallasTritonGroupedMatmul, TileConfig
from tests import references as ref

FP32_RTOL = 1e-5
NEAR_TIE = 1e-4
LOSS_COEFS = {"aux_loss_coef": 0.01, "seq_aux_loss_coef": 0.02, "z_loss_coef": 1e-3}
BATCH, SEQ, HIDDEN, FFN, EXPERTS = 8, 2, 16, 24, 8
# A limit well inside the projections' spread (about N(0, 1) here): both clamps bind on many
# entries, so a wrong clamp cannot hide.
LIMIT = 0.6

QWEN2 = {"num_shared_experts": 1, "shared_ffn_size": 20, "shared_expert_gate": True}
GPT_OSS = {
    "router_bias": True,
    "expert_ffn_bias": True,
    "activation": "swiglu_clamped",
    "swiglu_limit": LIMIT,
}
SMALL_TILES = TileConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)
INTERPRETED_PALLAS = PallasTritonGroupedMatmul(gmm_tiles=SMALL_TILES, tgmm_tiles=SMALL_TILES)


def _config(**kwargs):
    fields = {"num_experts": EXPERTS, "top_k": 2, "hidden_size": HIDDEN, "ffn_size": FFN}
    return jaxmoe.MoEConfig(**{**fields, **LOSS_COEFS, **kwargs})


def _inputs(cfg, seed=0):
    """init_params with every bias drawn nonzero (init makes them 0, which would test nothing)."""
    keys = jax.random.split(jax.random.key(seed), 4)
    params = jaxmoe.init_params(keys[0], cfg)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    bias_keys = jax.random.split(keys[1], len(leaves))
    for (path, leaf), key in zip(leaves, bias_keys, strict=True):
        name = jax.tree_util.keystr(path)
        if name.endswith(("['bias']", "['b_gate']", "['b_up']", "['b_down']")):
            group, leaf_name = path[0].key, path[1].key
            params[group][leaf_name] = 0.5 * jax.random.normal(key, leaf.shape, leaf.dtype)
    x = jax.random.normal(keys[2], (BATCH, SEQ, HIDDEN), jnp.float32)
    cotangent = jax.random.normal(keys[3], x.shape, jnp.float32)
    return params, x, cotangent


def _objective(cfg, cotangent, mesh=None):
    def loss(params, x):
        y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh)
        return jnp.sum(y * cotangent) + stats.aux_loss, y

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _run(cfg, params, x, cotangent, mesh=None):
    (_, y), (grad_params, grad_x) = _objective(cfg, cotangent, mesh)(params, x)
    return y, grad_params, grad_x


def _reference(cfg, params, x, cotangent):
    """The float64 dense layer: ``(y, grad params, grad x)`` of sum(y * cot) + aux_loss."""
    tokens = np.asarray(x, np.float64).reshape(-1, HIDDEN)
    params64 = ref.to_f64(params)
    spec = ref.RoutingSpec.of(cfg)
    logits = ref.router_logits(params64, tokens)
    routed, margin = ref.select_experts(logits, spec)
    assert margin > NEAR_TIE, "test data too close to a routing tie; pick another seed"
    cap = ref.capacity(cfg.capacity_factor, tokens.shape[0], cfg.top_k, cfg.num_experts)
    weights = ref.routing_weights(np, logits, routed, spec)
    # Drops in the configured order over the [BATCH, SEQ] tokens (MoEConfig.capacity_drop_policy).
    kept = ref.kept_mask(
        routed, cfg.num_experts, cap, cfg.capacity_drop_policy, SEQ, weights
    ).astype(np.float64)
    loss_weights = (cfg.aux_loss_coef, cfg.seq_aux_loss_coef, cfg.z_loss_coef, BATCH)
    cot = np.asarray(cotangent, np.float64).reshape(tokens.shape)
    with jax.enable_x64(True):

        def objective(params, tokens):
            y, aux = ref.dense_moe(jnp, params, tokens, cfg, routed, kept, loss_weights)
            return jnp.sum(y * cot) + aux, y

        (_, y), (grad_params, grad_x) = jax.jit(
            jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)
        )(params64, tokens)
        return ref.to_f64((y.reshape(x.shape), grad_params, grad_x.reshape(x.shape)))


def _assert_close(got, want, rtol=FP32_RTOL, what="layer"):
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    want_leaves = jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves), what
    for (path, value), expected in zip(got_leaves, want_leaves, strict=True):
        error = relative_error(np.asarray(value, np.float64), expected)
        assert error <= rtol, f"{what}{jax.tree_util.keystr(path)}: relative error {error:.2e}"


# ----------------------------------------------------------------------------- one device

CASES = {
    # Qwen2-MoE: softmax top-k (normalised or not: norm_topk_prob), a gated shared expert.
    "qwen2-xla": {**QWEN2, "grouped_matmul_backend": "xla"},
    "qwen2-normalized-reference": {
        **QWEN2,
        "pre_softmax": True,
        "normalize_weights": True,
        "grouped_matmul_backend": "reference",
    },
    "gpt-oss-xla": {**GPT_OSS, "grouped_matmul_backend": "xla"},
    "gpt-oss-reference-align8": {**GPT_OSS, "grouped_matmul_backend": "reference", "alignment": 8},
    "gpt-oss-pallas-interpreted": {**GPT_OSS, "grouped_matmul_backend": INTERPRETED_PALLAS},
    # Capacity blocks (one batched matmul): the biases per block; drops never carry a down bias.
    "gpt-oss-capacity": {**GPT_OSS, "capacity_factor": 0.75, "alignment": 4},
    # Each option alone, with the others' paths: plain activation, sigmoid router, alpha.
    "biases-gelu-sigmoid": {
        "activation": "gelu",
        "router_bias": True,
        "expert_ffn_bias": True,
        "score": "sigmoid",
        "grouped_matmul_backend": "xla",
    },
    "clamped-alpha-shared-gate": {
        **QWEN2,
        "activation": "swiglu_clamped",
        "swiglu_alpha": 0.9,
        "swiglu_limit": LIMIT,
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_option_matches_dense_reference(name):
    cfg = _config(**CASES[name])
    params, x, cotangent = _inputs(cfg)
    _assert_close(_run(cfg, params, x, cotangent), _reference(cfg, params, x, cotangent))


def test_each_option_changes_the_layer():
    """The options are not no-ops (else the reference tests could pass with the option ignored):
    the reference itself differs with each part of the math removed."""
    cfg = _config(**GPT_OSS, **QWEN2)
    params, x, _ = _inputs(cfg)
    tokens = np.asarray(x, np.float64).reshape(-1, HIDDEN)

    def forward(cfg, params):
        params = ref.to_f64(params)
        routed, _ = ref.select_experts(ref.router_logits(params, tokens), ref.RoutingSpec.of(cfg))
        return ref.dense_moe(np, params, tokens, cfg, routed, np.ones(routed.shape))[0]

    y = forward(cfg, params)
    changes = {
        "router bias": (cfg, {"router": {"kernel": params["router"]["kernel"]}}),
        "down bias": (
            cfg,
            {"experts": {**params["experts"], "b_down": 0 * params["experts"]["b_down"]}},
        ),
        "gate bias": (
            cfg,
            {"experts": {**params["experts"], "b_gate": 0 * params["experts"]["b_gate"]}},
        ),
        "shared gate": (
            cfg,
            {"shared": {k: v for k, v in params["shared"].items() if k != "output_gate"}},
        ),
        "limit": (dataclasses.replace(cfg, swiglu_limit=100.0), {}),
    }
    for what, (changed_cfg, change) in changes.items():
        other = forward(changed_cfg, {**params, **change})
        assert relative_error(other, y) > 1e-2, what


def test_biased_or_clamped_experts_never_take_the_fused_gated_op(monkeypatch):
    """The fused gated kernel has no bias epilogue and no clamped activation: routed_experts
    must run the unfused grouped matmuls for them, explicitly (never the fused op, which would
    silently drop the bias). Plain swiglu still takes the fused op."""
    calls = []
    real = experts.gated_ffn

    def spy(*args, **kwargs):
        calls.append(kwargs["activation"])
        return real(*args, **kwargs)

    monkeypatch.setattr(experts, "gated_ffn", spy)
    for options in ({"expert_ffn_bias": True}, {"activation": "swiglu_clamped"}, {}):
        cfg = _config(**options, grouped_matmul_backend="xla")
        params, x, _ = _inputs(cfg)
        # Tracing picks the op: no need to compile or run the layer.
        jax.eval_shape(lambda params, x, cfg=cfg: jaxmoe.moe(params, x, cfg), params, x)
    assert calls == ["swiglu"]


def test_gated_hidden_clamps_and_shifts_as_gpt_oss():
    gate = jnp.array([-9.0, -1.0, 0.0, 0.5, 3.0])
    up = jnp.array([-9.0, 0.2, 5.0, 1.0, 9.0])
    got = experts.gated_hidden(gate, up, "swiglu_clamped", swiglu_alpha=1.702, swiglu_limit=2.0)
    g = np.minimum(np.asarray(gate, np.float64), 2.0)
    u = np.clip(np.asarray(up, np.float64), -2.0, 2.0)
    want = (u + 1) * g / (1 + np.exp(-1.702 * g))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[2] == 0  # gate 0 gives 0 whatever up is: rows past the blocks stay zero
    with pytest.raises(ValueError, match="swiglu_alpha"):
        experts.gated_hidden(gate, up, "swiglu_clamped")


# ----------------------------------------------------------------------------- expert parallelism


def _mesh():
    return jax.make_mesh((2, 4), ("data", "ep"))


@pytest.mark.parametrize(
    "dispatch,fsdp", [("copies", True), ("tokens", False)], ids=["copies-fsdp", "tokens"]
)
def test_expert_parallel_equals_one_device(dispatch, fsdp):
    """Every option at once on a 2x4 mesh: the expert biases sharded with their experts (and
    ``b_down``'s H over the data axis with FSDP), each routed copy's down bias summed on its
    expert rank by the pair dispatch: the one-device layer's output and gradients."""
    cfg = _config(**GPT_OSS, **QWEN2, grouped_matmul_backend="xla")
    params, x, cotangent = _inputs(cfg)
    single = _run(cfg, params, x, cotangent)
    sharded = dataclasses.replace(
        cfg, ep_axis="ep", data_axes=("data",), ep_dispatch=dispatch, fsdp_expert_weights=fsdp
    )
    specs = jaxmoe.parallel.param_partition_specs(sharded)
    assert specs["experts"]["b_gate"] == jax.sharding.PartitionSpec("ep", None)
    assert specs["experts"]["b_down"] == jax.sharding.PartitionSpec(
        "ep", ("data",) if fsdp else None
    )
    assert specs["router"]["bias"] == specs["shared"]["output_gate"] == jax.sharding.PartitionSpec()
    _assert_close(_run(sharded, params, x, cotangent, _mesh()), single, rtol=1e-6, what="ep")


# ----------------------------------------------------------------------------- FP8


def test_fp8_runs_the_biases_and_clamp_around_its_matmuls():
    """FP8 quantizes only the expert matrices: the biases and the clamped activation run in
    ``dtype`` around them. Close to the unquantized layer (FP8's error, see test_fp8_layer) but
    not it; the weight cache holds the matrices only and gives the same bits."""
    cfg = _config(**GPT_OSS, hidden_size=64, ffn_size=96, fp8_recipe="rowwise")
    params, _, _ = _inputs(cfg)
    x = jax.random.normal(jax.random.key(5), (4, 8, 64), jnp.float32)
    # Compiled, not op by op: eager dispatch compiles each of the layer's ops on its own.
    layer = jax.jit(
        lambda params, cfg, fp8_weights=None: jaxmoe.moe(params, x, cfg, fp8_weights=fp8_weights)[
            0
        ],
        static_argnums=1,
    )
    y = layer(params, cfg)
    unquantized = layer(params, dataclasses.replace(cfg, fp8_recipe=None))
    assert 5e-3 < relative_error(y, unquantized) < 0.1
    cache = jax.jit(jaxmoe.quantize_expert_weights, static_argnums=1)(params, cfg)
    assert sorted(cache) == ["w_down", "w_gate", "w_up"]
    np.testing.assert_array_equal(layer(params, cfg, cache), y)
    grads = jax.jit(jax.grad(lambda p: jnp.sum(jaxmoe.moe(p, x, cfg)[0])))(params)
    assert float(jnp.abs(grads["experts"]["b_down"]).sum()) > 0


# ----------------------------------------------------------------------------- modules, checkpoint


def test_nnx_and_linen_hold_the_new_parameters():
    cfg = _config(**GPT_OSS, **QWEN2)
    x = jax.random.normal(jax.random.key(1), (2, 6, HIDDEN), jnp.float32)
    # Each call compiled (nnx.jit, jax.jit), not op by op: eager dispatch compiles each op alone.
    moe = jax.jit(lambda params: jaxmoe.moe(params, x, cfg)[0])
    layer = jaxmoe.nn.MoE(cfg, rngs=nnx.Rngs(0))
    tree = layer.params_tree()
    assert jax.tree.map(jnp.shape, tree) == jaxmoe.params.param_shapes(cfg)
    np.testing.assert_array_equal(nnx.jit(lambda m: m(x)[0])(layer), moe(tree))
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x)[0])))(layer)
    assert float(jnp.abs(grads.router["bias"][...]).sum()) > 0
    assert float(jnp.abs(grads.shared["output_gate"][...]).sum()) > 0

    linen = jaxmoe.nn.MoELinen(cfg)
    variables = jax.jit(linen.init)(jax.random.key(0), x)
    params = nn.unbox(variables["params"])
    assert jax.tree.map(jnp.shape, params) == jaxmoe.params.param_shapes(cfg)
    np.testing.assert_array_equal(jax.jit(linen.apply)(variables, x)[0], moe(params))
    axes = nn.get_partition_spec(variables)["params"]
    assert axes["experts"]["b_down"] == jax.sharding.PartitionSpec("expert", "embed")
    assert axes["shared"]["output_gate"] == jax.sharding.PartitionSpec("embed", None)


def test_checkpoint_round_trip_with_the_new_parameters(tmp_path):
    cfg = _config(**GPT_OSS, **QWEN2)
    params, _, _ = _inputs(cfg)
    checkpoint.save(tmp_path, 0, {"params": params})
    restored = checkpoint.restore(tmp_path, {"params": checkpoint.abstract_params(cfg)})["params"]
    jax.tree.map(np.testing.assert_array_equal, restored, params)
    # A checkpoint of a layer without the options does not restore into one with them.
    plain = _config(**QWEN2)
    checkpoint.save(tmp_path / "plain", 0, {"params": jaxmoe.init_params(jax.random.key(0), plain)})
    with pytest.raises(ValueError, match="bias|output_gate|b_"):
        checkpoint.restore(tmp_path / "plain", {"params": checkpoint.abstract_params(cfg)})


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "fields,named",
    [
        ({"shared_expert_gate": True}, "shared_expert_gate"),
        ({"swiglu_limit": 0.0, "activation": "swiglu_clamped"}, "swiglu_limit"),
        ({"swiglu_limit": float("inf"), "activation": "swiglu_clamped"}, "swiglu_limit"),
        ({"swiglu_alpha": -1.0, "activation": "swiglu_clamped"}, "swiglu_alpha"),
        ({"swiglu_limit": 5.0}, "swiglu_limit"),  # set for an activation without a clamp
        ({"swiglu_alpha": 1.0, "activation": "geglu"}, "swiglu_alpha"),
        ({"router_bias": 1}, "router_bias"),
        ({"expert_ffn_bias": "yes"}, "expert_ffn_bias"),
    ],
)
def test_config_refuses(fields, named):
    with pytest.raises(ValueError, match=rf"^MoEConfig\.{named}: .*; got .*\. \S"):
        _config(**fields)


def test_params_must_match_the_options():
    cfg = _config(**GPT_OSS, **QWEN2)
    params, x, _ = _inputs(cfg)
    missing = {**params, "experts": {k: v for k, v in params["experts"].items() if k != "b_down"}}
    with pytest.raises(ValueError, match=r"params\['experts'\]\['b_down'\] is missing"):
        jaxmoe.moe(missing, x, cfg)
    wrong = {**params, "shared": {**params["shared"], "output_gate": jnp.zeros((HIDDEN,))}}
    with pytest.raises(ValueError, match=r"params\['shared'\]\['output_gate'\] has shape"):
        jaxmoe.moe(wrong, x, cfg)
    with pytest.raises(ValueError, match=r"params\['router'\]\['bias'\] is not used"):
        jaxmoe.moe(params, x, dataclasses.replace(cfg, router_bias=False))
