"""Wrong arguments to ``jaxmoe.checkpoint`` raise our TypeError / ValueError naming the argument
before orbax writes or reads anything; nothing saved becomes unreachable (bad steps refused,
re-saving a step replaces it); a damaged checkpoint names the item and the file."""

import dataclasses
import glob
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

import jaxmoe

ckpt = pytest.importorskip("jaxmoe.checkpoint")

CFG = jaxmoe.MoEConfig(num_experts=8, top_k=2, hidden_size=16, ffn_size=8)


@pytest.fixture(scope="module")
def params():
    return jaxmoe.init_params(jax.random.key(0), CFG)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, params):
    directory = tmp_path_factory.mktemp("saved")
    ckpt.save(directory, 1, {"params": params}, metadata={"seen": 3})
    return directory


def _target():
    return {"params": ckpt.abstract_params(CFG)}


# ----------------------------------------------------------------------------- steps


@pytest.mark.parametrize(
    ("step", "error"),
    [(-5, ValueError), (1.5, TypeError), ("one", TypeError), (True, TypeError)],
    ids=["negative", "float", "str", "bool"],
)
def test_invalid_step_is_refused_before_writing(tmp_path, params, step, error):
    with pytest.raises(error, match=r"save: `step` must be an int >= 0"):
        ckpt.save(tmp_path, step, {"params": params})
    assert os.listdir(tmp_path) == []


def test_numpy_int_step_is_saved_and_found(tmp_path, params):
    ckpt.save(tmp_path, np.int64(3), {"params": params})
    assert ckpt.latest_step(tmp_path) == 3


@pytest.mark.parametrize("step", ["1", -1, 1.0])
def test_restore_step_of_wrong_type_names_step(saved, step):
    with pytest.raises((TypeError, ValueError), match=r"restore: `step` must be an int >= 0"):
        ckpt.restore(saved, _target(), step=step)


def test_resaving_a_step_replaces_it(tmp_path, params):
    ckpt.save(tmp_path, 1, {"params": params}, metadata={"run": 1})
    ckpt.save(tmp_path, 2, {"params": params})
    newer = jax.tree.map(lambda a: a + 1, params)
    ckpt.save(tmp_path, 1, {"params": newer}, metadata={"run": 2})
    restored = ckpt.restore(tmp_path, _target(), step=1)["params"]
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(newer), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert ckpt.restore_metadata(tmp_path, step=1) == {"run": 2}
    assert sorted(os.listdir(tmp_path)) == ["1", "2"]  # no staging directories left
    assert ckpt.latest_step(tmp_path) == 2


# ----------------------------------------------------------------------------- save arguments


def test_save_params_tree_as_items_is_refused(tmp_path, params):
    with pytest.raises(
        ValueError, match=r"`items` looks like a parameter tree.*\{'params': params\}"
    ):
        ckpt.save(tmp_path, 1, params)
    assert os.listdir(tmp_path) == []


def test_save_item_none_names_the_item(tmp_path):
    with pytest.raises(ValueError, match=r"save: items\['params'\] holds no arrays"):
        ckpt.save(tmp_path, 1, {"params": None})


def test_save_python_ints_name_the_leaf(tmp_path):
    with pytest.raises(TypeError, match=r"save: items\['params'\]\[0\] is a int.*jnp\.asarray"):
        ckpt.save(tmp_path, 1, {"params": [1, 2, 3]})


@pytest.mark.parametrize("items", [[1], {}, {"_hidden": jnp.ones(2)}, {"a/b": jnp.ones(2)}])
def test_save_items_not_a_mapping_of_names(tmp_path, items):
    with pytest.raises((TypeError, ValueError), match=r"save: `items`"):
        ckpt.save(tmp_path, 1, items)


def test_save_directory_none_names_directory(params):
    with pytest.raises(TypeError, match=r"save: `directory` must be a path"):
        ckpt.save(None, 1, {"params": params})


def test_directory_that_is_a_file_names_directory(tmp_path, params):
    file = tmp_path / "a_file"
    file.write_text("x")
    with pytest.raises(ValueError, match=r"save: `directory` .* is a file"):
        ckpt.save(file, 1, {"params": params})
    with pytest.raises(ValueError, match=r"save: `directory` .* is under the file"):
        ckpt.save(file / "sub", 1, {"params": params})
    with pytest.raises(ValueError, match=r"restore: `directory` .* is a file"):
        ckpt.restore(file, _target())
    with pytest.raises(ValueError, match=r"latest_step: `directory` .* is a file"):
        ckpt.latest_step(file)


def test_save_metadata_and_max_to_keep_are_checked(tmp_path, params):
    with pytest.raises(TypeError, match=r"save: `metadata` must be JSON-serialisable"):
        ckpt.save(tmp_path, 1, {"params": params}, metadata={"x": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"save: `max_to_keep` must be None .* or an int >= 1"):
        ckpt.save(tmp_path, 1, {"params": params}, max_to_keep=0)
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- restore arguments


def test_restore_targets_list_names_targets(saved):
    with pytest.raises(TypeError, match=r"restore: `targets` must be a mapping of item name"):
        ckpt.restore(saved, [ckpt.abstract_params(CFG)])


def test_restore_target_config_points_to_abstract_params(saved):
    with pytest.raises(
        TypeError,
        match=r"restore: targets\['params'\] is a MoEConfig.*abstract_params\(cfg, mesh\)",
    ):
        ckpt.restore(saved, {"params": CFG})


def test_restore_directory_none_names_directory():
    with pytest.raises(TypeError, match=r"restore: `directory` must be a path"):
        ckpt.restore(None, _target())


def test_abstract_opt_state_without_tx_names_tx():
    with pytest.raises(TypeError, match=r"abstract_opt_state: `tx` must be an optax"):
        ckpt.abstract_opt_state(None, CFG)


def test_abstract_params_config_and_mesh_types_are_named():
    with pytest.raises(TypeError, match=r"abstract_params: `cfg` must be a jaxmoe\.MoEConfig"):
        ckpt.abstract_params(dataclasses.asdict(CFG))
    with pytest.raises(TypeError, match=r"`mesh` must be a jax\.sharding\.Mesh"):
        ckpt.abstract_params(CFG, "ep")


def test_mesh_that_does_not_divide_the_experts_names_axis_size_and_num_experts(saved):
    cfg = dataclasses.replace(CFG, ep_axis="ep")
    mesh = Mesh(np.array(jax.devices()[:3]), ("ep",))
    pattern = r"num_experts: must be divisible by the size of ep_axis 'ep' \(3\); got 8"
    with pytest.raises(ValueError, match=pattern):
        ckpt.restore(saved, {"params": ckpt.abstract_params(cfg, mesh)})
    with pytest.raises(ValueError, match=pattern):
        ckpt.abstract_opt_state(optax.adam(1e-3), cfg, mesh)


def test_checkpoint_with_more_leaves_than_the_target_names_them(tmp_path, params):
    ckpt.save(tmp_path, 1, {"params": {**params, "extra": jnp.ones(3)}})
    with pytest.raises(
        ValueError,
        match=r"item 'params' holds leaves the target lacks: "
        r"\['params/extra'\]",
    ):
        ckpt.restore(tmp_path, _target())


# ----------------------------------------------------------------------------- damaged files


def _damaged_copy(saved, tmp_path, pattern, how):
    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    files = glob.glob(str(copy / "1" / pattern))
    assert files, pattern
    for file in files:
        if how == "delete":
            os.remove(file)
        else:
            data = open(file, "rb").read()
            open(file, "wb").write(data[: len(data) // 2])
    return copy


@pytest.mark.parametrize(
    ("pattern", "how", "named"),
    [
        ("params/_METADATA", "truncate", r"params/_METADATA is not valid JSON"),
        ("params/_METADATA", "delete", r"params/_METADATA is missing"),
        ("params/manifest.ocdbt", "truncate", r"params/manifest\.ocdbt cannot be read"),
        ("params/d/*", "truncate", r"params/d/[0-9a-f]+ cannot be read"),
        (
            "params/ocdbt.process_0/d/*",
            "truncate",
            r"params/ cannot be read.*leaf .params/experts/",
        ),
        ("params/array_metadatas/process_0", "truncate", r"process_0 is not valid JSON"),
    ],
    ids=["metadata-json", "metadata-missing", "manifest", "btree", "chunk", "array-metadata"],
)
def test_damaged_checkpoint_names_item_and_file(saved, tmp_path, pattern, how, named):
    copy = _damaged_copy(saved, tmp_path, pattern, how)
    with pytest.raises(ValueError, match=rf"step 1: item 'params' is damaged: .*{named}"):
        ckpt.restore(copy, _target())


def test_damaged_metadata_item_names_its_file(saved, tmp_path):
    copy = _damaged_copy(saved, tmp_path, "metadata/metadata", "truncate")
    with pytest.raises(
        ValueError,
        match=r"item 'metadata' is damaged: .*metadata/metadata is "
        "not valid JSON",
    ):
        ckpt.restore_metadata(copy)
