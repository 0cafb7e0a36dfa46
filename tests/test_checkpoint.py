"""Checkpoints (``jaxmoe.checkpoint``, orbax): save under a (data=2, ep=4) mesh, restore under
ep=8, (data=4, ep=2), data=8 with FSDP and one device -- bitwise the same parameters and Adam
state, and the same next training step; mismatched configs are refused; NNX round trip; the
demo resumes bitwise."""

import dataclasses
import importlib
import json
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh

import jaxmoe
import jaxmoe.nn

ckpt = pytest.importorskip("jaxmoe.checkpoint")

CFG = jaxmoe.MoEConfig(
    num_experts=8,
    top_k=2,
    hidden_size=16,
    ffn_size=8,
    num_shared_experts=1,
    ep_axis="ep",
    data_axes=("data",),
)
TX = optax.adamw(1e-2, weight_decay=0.01)


def _mesh(shape, names=("data", "ep")):
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


# name -> (config, mesh) to restore onto
LAYOUTS = {
    "ep8": lambda: (dataclasses.replace(CFG, data_axes=()), _mesh((8,), ("ep",))),
    "data4_ep2": lambda: (CFG, _mesh((4, 2))),
    "data8_fsdp": lambda: (dataclasses.replace(CFG, fsdp_expert_weights=True), _mesh((8, 1))),
    "one_device": lambda: (dataclasses.replace(CFG, ep_axis=None, data_axes=()), None),
}


def _train_step(cfg, mesh):
    @jax.jit
    def step(params, opt_state, x):
        def loss_fn(params):
            y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh)
            return jnp.mean(jnp.square(y - x)) + stats.aux_loss

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = TX.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def _batch():
    return jax.random.normal(jax.random.key(1), (16, 4, CFG.hidden_size))


def _put(tree, target):
    return jax.tree.map(lambda a, t: jax.device_put(a, t.sharding), tree, target)


def _assert_bitwise(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Params and AdamW state after one step under (data=2, ep=4), saved at step 1."""
    mesh = _mesh((2, 4))
    params = _put(jaxmoe.init_params(jax.random.key(0), CFG), ckpt.abstract_params(CFG, mesh))
    opt_state = TX.init(params)
    params, opt_state, _ = _train_step(CFG, mesh)(params, opt_state, _batch())
    directory = tmp_path_factory.mktemp("ckpt")
    ckpt.save(directory, 1, {"params": params, "opt_state": opt_state})
    return directory, jax.device_get(params), jax.device_get(opt_state)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_restore_onto_another_layout(saved, layout):
    directory, params, opt_state = saved
    cfg, mesh = LAYOUTS[layout]()
    target = {
        "params": ckpt.abstract_params(cfg, mesh),
        "opt_state": ckpt.abstract_opt_state(TX, cfg, mesh),
    }
    restored = ckpt.restore(directory, target)
    _assert_bitwise(restored["params"], params)
    _assert_bitwise(restored["opt_state"], opt_state)
    for leaf, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target), strict=True):
        assert leaf.sharding.is_equivalent_to(want.sharding, leaf.ndim)
    # Adam's moments follow their parameter's sharding (here: experts over ep).
    mu = restored["opt_state"][0].mu["experts"]["w_up"]
    assert mu.sharding == restored["params"]["experts"]["w_up"].sharding

    # One more step: from the restored state, and from the saved values placed directly.
    step = _train_step(cfg, mesh)
    after_restore = step(restored["params"], restored["opt_state"], _batch())
    direct = step(_put(params, target["params"]), _put(opt_state, target["opt_state"]), _batch())
    _assert_bitwise(after_restore, direct)


def test_mismatched_checkpoint_names_the_leaf(saved):
    directory = saved[0]
    bigger = dataclasses.replace(CFG, ffn_size=CFG.ffn_size * 2)
    with pytest.raises(ValueError, match=r"'params/experts/w_down' has shape \(8, 8, 16\)"):
        ckpt.restore(directory, {"params": ckpt.abstract_params(bigger, _mesh((2, 4)))})
    with_bias = dataclasses.replace(CFG, score="sigmoid", use_expert_bias=True)
    with pytest.raises(ValueError, match="'params/expert_bias' is missing"):
        ckpt.restore(directory, {"params": ckpt.abstract_params(with_bias)})
    with pytest.raises(ValueError, match="no item 'ema'"):
        ckpt.restore(directory, {"ema": ckpt.abstract_params(CFG)})
    with pytest.raises(FileNotFoundError, match="step 7"):
        ckpt.restore(directory, {"params": ckpt.abstract_params(CFG)}, step=7)


def test_nnx_module_round_trip_with_expert_bias(tmp_path):
    cfg = dataclasses.replace(
        CFG, score="sigmoid", use_expert_bias=True, data_axes=(), num_shared_experts=0
    )
    layer = jaxmoe.nn.MoE(dataclasses.replace(cfg, ep_axis=None), rngs=nnx.Rngs(0))
    layer.update_expert_bias(jnp.arange(cfg.num_experts), rate=0.5)
    assert np.any(np.asarray(layer.expert_bias[...]) != 0)
    ckpt.save_module(tmp_path, 3, layer)

    mesh = _mesh((4,), ("ep",))
    other = jaxmoe.nn.MoE(cfg, rngs=nnx.Rngs(1), mesh=mesh)
    ckpt.restore_module(tmp_path, other)
    _assert_bitwise(other.params_tree(), layer.params_tree())
    assert isinstance(other.expert_bias, jaxmoe.nn.ExpertBias)
    ep_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("ep"))
    assert other.experts["w_up"][...].sharding.is_equivalent_to(ep_sharding, 3)
    # The same checkpoint is a functional params dict too.
    params = ckpt.restore(tmp_path, {"params": ckpt.abstract_params(cfg)})["params"]
    _assert_bitwise(params, layer.params_tree())


def test_demo_resumes_bitwise(tmp_path):
    from jaxmoe.cli.demo import DemoConfig, run_demo

    small = dict(width=16, ffn_size=16, seq_len=8, batch_size=4, sample_chars=2, num_layers=1)
    first = tmp_path / "first"
    cfg = DemoConfig(steps=4, out=str(first), checkpoint_dir=str(first / "ckpt"), save_every=2)
    full = run_demo(dataclasses.replace(cfg, **small))
    assert ckpt.latest_step(first / "ckpt") == 4
    # Lose the last checkpoint, as if the run had stopped after step 3: resume from step 2.
    second = tmp_path / "second"
    shutil.copytree(first / "ckpt", second / "ckpt")
    shutil.rmtree(second / "ckpt" / "4")
    resumed = run_demo(
        dataclasses.replace(cfg, out=str(second), checkpoint_dir=str(second / "ckpt"), **small)
    )
    assert resumed["resumed_from_step"] == 2
    for key in ("step", "loss", "aux_loss", "tokens_per_expert", "val_step", "val_loss"):
        assert resumed[key] == full[key], key
    assert json.loads((second / "metrics.json").read_text())["loss"] == full["loss"]


def test_missing_orbax_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)  # makes the import fail
    monkeypatch.delitem(sys.modules, "jaxmoe.checkpoint")
    with pytest.raises(ImportError, match=r"pip install jaxmoe\[checkpoint\]"):
        importlib.import_module("jaxmoe.checkpoint")
