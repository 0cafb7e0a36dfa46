"""One decoder layer's MoE block: from a transformers checkpoint into jaxmoe params (optionally
straight onto an expert-parallel mesh), and back into the checkpoint's key names and layouts.

Layouts: a transformers ``nn.Linear`` weight is ``[out, in]``; jaxmoe stores ``[in, out]``, the
routed experts stacked on a leading ``E``::

    router  gate.weight [E, H]                        -> params["router"]["kernel"] [H, E]
    experts experts.{e}.gate_proj.weight [F, H]  (e<E) -> params["experts"]["w_gate"] [E, H, F]
            experts.{e}.up_proj.weight   [F, H]       -> params["experts"]["w_up"]   [E, H, F]
            experts.{e}.down_proj.weight [H, F]       -> params["experts"]["w_down"] [E, F, H]
    bias    gate.e_score_correction_bias [E]          -> params["expert_bias"]        [E]
    shared  shared_experts.*_proj.weight              -> params["shared"][...]  [H, Fs] / [Fs, H]

(Mixtral names its projections ``w1`` / ``w3`` / ``w2`` under ``block_sparse_moe``.) Qwen2-MoE's
shared expert is ``shared_expert.*`` with its gate ``shared_expert_gate.weight`` ``[1, H]`` ->
``params["shared"]["output_gate"]`` ``[H, 1]``. gpt-oss stacks its experts (with their biases)
in ``[E, in, out]`` tensors, gate and up interleaved, possibly MXFP4 (:mod:`jaxmoe.hf.fused`);
its router is ``router.weight`` / ``router.bias`` -> ``params["router"]["kernel"]`` / ``["bias"]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxmoe.config import MoEConfig
from jaxmoe.hf.checkpoint import CheckpointFiles
from jaxmoe.hf.families import Family, family_of, is_moe_layer, moe_config, read_hf_config
from jaxmoe.hf.fused import FusedExpertTensor
from jaxmoe.parallel.sharding import check_mesh, param_partition_specs
from jaxmoe.params import check_params, param_shapes


def _moe_family(hf: dict, layer: int, where: str) -> Family:
    """The family, after checking that ``layer`` exists and is an MoE layer."""
    family = family_of(hf)
    if not is_moe_layer(hf, layer):
        raise ValueError(
            f"jaxmoe.hf.{where}: layer {layer} of this {family.name} checkpoint is a dense MLP "
            "layer, not an MoE block (see first_k_dense_replace / decoder_sparse_step / "
            "mlp_only_layers in config.json). Pick an MoE layer; "
            "jaxmoe.hf.is_moe_layer(config, i) tells which."
        )
    return family


def _leaves(tree: dict, prefix: tuple = ()):
    """``(path, leaf)`` of a nested dict whose leaves are keys, key lists or shapes."""
    for name, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, name))
        else:
            yield (*prefix, name), value


def _get(tree: dict, path: tuple):
    for name in path:
        tree = tree[name]
    return tree


def _set(tree: dict, path: tuple, value) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


def _stored_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The checkpoint shape of one jaxmoe weight (per expert: drop ``E`` first): ``[out, in]``."""
    return tuple(reversed(shape))


def _stored_keys(leaf) -> list[str]:
    """The checkpoint keys of one leaf of ``Family.keys``."""
    if isinstance(leaf, FusedExpertTensor):
        return leaf.stored_keys()
    return leaf if isinstance(leaf, list) else [leaf]


def _expected_shapes(leaf, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Each stored key of ``leaf`` -> the shape config.json implies for it."""
    if isinstance(leaf, FusedExpertTensor):
        return leaf.expected_shapes(shape)
    if isinstance(leaf, list):  # one tensor per expert
        return dict.fromkeys(leaf, _stored_shape(shape[1:]))
    return {leaf: _stored_shape(shape)}


def _check_shapes(files: CheckpointFiles, keys: dict, shapes: dict, family: Family) -> None:
    """Raises ValueError naming the first tensor whose header shape disagrees with config.json."""
    for path, key in _leaves(keys):
        for stored_key, expected in _expected_shapes(key, _get(shapes, path)).items():
            found = files.shape(stored_key)
            if found != expected:
                raise ValueError(
                    f"jaxmoe.hf.load_moe_layer: {stored_key!r} has shape {list(found)} but the "
                    f"{family.name} config.json implies {list(expected)} (E, top-k, hidden and "
                    "intermediate sizes). The weights and config.json are from different models."
                )


def _read_expert_block(files, keys: list[str], index: tuple[slice, ...], dtype) -> np.ndarray:
    """``index`` (of the stacked ``[E, in, out]`` weight) read from the per-expert tensors: only
    the experts of ``index[0]``, and only the rows and columns of ``index[1:]``."""
    experts = range(*index[0].indices(len(keys)))
    stored_index = (index[2], index[1])  # stored [out, in]
    block = [files.read(keys[e], stored_index).T for e in experts]
    return np.stack(block).astype(dtype, copy=False)


def _experts_dtype(files: CheckpointFiles, keys: dict) -> np.dtype:
    """The routed experts' stored dtype; MXFP4 experts take the router's (the dtype the rest
    of such a checkpoint is in: MXFP4 values are exact in it)."""
    leaf = keys["experts"]["w_up"]
    if isinstance(leaf, FusedExpertTensor):
        key = keys["router"]["kernel"] if leaf.mxfp4 else leaf.key
    else:
        key = leaf[0]
    return np.dtype(files.dtype(key))


def _pick_ep_axis(mesh, ep_axis: str | None) -> str:
    if ep_axis is not None:
        return ep_axis
    if len(mesh.axis_names) == 1:
        return mesh.axis_names[0]
    raise ValueError(
        f"jaxmoe.hf.load_moe_layer: `ep_axis` must name the mesh axis to shard experts over "
        f"when the mesh has several axes {tuple(mesh.axis_names)}; got None. Pass e.g. "
        f"ep_axis={mesh.axis_names[-1]!r}."
    )


def load_moe_layer(
    path, layer: int, *, mesh=None, dtype=None, ep_axis: str | None = None, **overrides
) -> tuple[MoEConfig, dict]:
    """One decoder layer's MoE block of a transformers checkpoint, as jaxmoe params.

    Everything is checked before any weight is read: the family and its options
    (:func:`moe_config`), that ``layer`` exists and is MoE, that every tensor is in the
    checkpoint and its shard file present, and every tensor's shape (from the file headers).

    With ``mesh``, the routed experts are laid out as :func:`jaxmoe.moe` shards them under
    expert parallelism (``E`` over ``ep_axis``, :func:`jaxmoe.parallel.param_partition_specs`):
    each device's shard is read straight from the memory-mapped files, its own experts only
    (``jax.make_array_from_callback``), so the whole layer never sits in one host's memory. The
    experts' biases (gpt-oss) shard with their experts; the router (its bias too), selection
    bias and shared experts are replicated.

    gpt-oss experts stored in MXFP4 (``*_blocks`` / ``*_scales``, as on the Hub) are read
    dequantized (exactly: every MXFP4 value is a float32 and a bfloat16), each device
    dequantizing only its own experts' blocks.

    Args:
      path: a checkpoint directory: ``config.json`` and ``model.safetensors`` or sharded files
        with ``model.safetensors.index.json`` (``save_pretrained`` or a Hub download).
      layer: the decoder layer's index.
      mesh: a ``jax.sharding.Mesh``, or None for arrays on the default device.
      dtype: the params' dtype and the config's ``dtype`` / ``param_dtype``; None keeps each
        tensor's stored dtype (the config takes the experts'; MXFP4 experts take the router's).
        The selection bias stays float32: it decides routing.
      ep_axis: the mesh axis of the experts (the returned config's ``ep_axis``); may be left out
        for a one-axis mesh. Ignored without ``mesh``.
      **overrides: other ``MoEConfig`` fields that are not the model's (see :func:`moe_config`).

    Returns:
      ``(cfg, params)``: ``params`` in the tree of :func:`jaxmoe.init_params`; ``jaxmoe.moe(params,
      x, cfg, mesh=mesh)`` computes the transformers block's output.

    Raises:
      ValueError: an unsupported family or option, a missing or dense layer, a missing tensor or
        shard file, a tensor shape that disagrees with ``config.json``.
    """
    hf = read_hf_config(path)
    family = _moe_family(hf, layer, "load_moe_layer")
    files = CheckpointFiles(path)
    model_cfg = moe_config(hf)  # the checks of the family's options, before any file is read
    mxfp4_key = family.mxfp4_key(layer)
    keys = family.keys(model_cfg, layer, mxfp4=mxfp4_key is not None and files.has(mxfp4_key))
    files.check_files(k for _, leaf in _leaves(keys) for k in _stored_keys(leaf))
    shapes = param_shapes(model_cfg)
    _check_shapes(files, keys, shapes, family)

    stored = _experts_dtype(files, keys)
    param_dtype = stored if dtype is None else jnp.dtype(dtype)
    fields = {"dtype": param_dtype, "param_dtype": param_dtype, **overrides}
    if mesh is not None:
        fields["ep_axis"] = _pick_ep_axis(mesh, ep_axis)
    cfg = moe_config(hf, **fields)
    specs = None
    if mesh is not None:
        check_mesh(cfg, mesh)
        specs = param_partition_specs(cfg)

    params: dict = {}
    for leaf_path, key in _leaves(keys):
        shape = _get(shapes, leaf_path)
        if leaf_path[0] == "experts":

            def read(index, key=key, shape=shape):
                if isinstance(key, FusedExpertTensor):
                    return key.read(files, index, shape, param_dtype)
                return _read_expert_block(files, key, index, param_dtype)

            if mesh is None:
                value = jnp.asarray(read(tuple(slice(None) for _ in shape)))
            else:
                sharding = NamedSharding(mesh, _get(specs, leaf_path))
                value = jax.make_array_from_callback(shape, sharding, read)
        else:
            leaf_dtype = np.float32 if leaf_path == ("expert_bias",) else None
            host = files.read(key)
            host = host.T if host.ndim == 2 else host
            host = host.astype(leaf_dtype or (host.dtype if dtype is None else param_dtype))
            if mesh is None:
                value = jnp.asarray(host)
            else:
                value = jax.device_put(host, NamedSharding(mesh, PartitionSpec()))
        _set(params, leaf_path, value)
    return cfg, params


def _check_model_fields(cfg: MoEConfig, hf: dict, family: Family) -> None:
    for field, value in family.config_fields(hf).items():
        if getattr(cfg, field) != value:
            raise ValueError(
                f"jaxmoe.hf.moe_layer_state_dict: cfg.{field} is {getattr(cfg, field)!r} but the "
                f"{family.name} config.json gives {value!r}; `cfg` is not this checkpoint's "
                "layer. Use the cfg that load_moe_layer returned."
            )


def moe_layer_state_dict(cfg: MoEConfig, params: dict, hf_config, layer: int) -> dict:
    """The MoE block of ``layer`` in the checkpoint's own key names and layouts.

    The inverse of :func:`load_moe_layer`: every tensor of the block (routed experts one tensor
    per expert, ``[out, in]``; gpt-oss's stacked and interleaved tensors), as host NumPy arrays
    in the params' dtypes (gathered from a mesh if sharded). Write them over the same keys of
    the checkpoint's safetensors files and transformers loads it with no missing or unexpected
    keys. gpt-oss experts are always written dense, never MXFP4: for a checkpoint whose experts
    were MXFP4, drop the layer's ``*_blocks`` / ``*_scales`` tensors (and, once every layer is
    dense, ``quantization_config``).

    Args:
      cfg: the layer's config (as :func:`load_moe_layer` returned it; its model fields must be
        the checkpoint's).
      params: the layer's params (the tree of :func:`jaxmoe.init_params`).
      hf_config: the checkpoint's ``config.json`` (a dict, its path or the checkpoint directory).
      layer: the decoder layer's index.

    Returns:
      ``{checkpoint key: np.ndarray}``.
    """
    hf = read_hf_config(hf_config)
    family = _moe_family(hf, layer, "moe_layer_state_dict")
    _check_model_fields(cfg, hf, family)
    check_params(params, cfg)
    tensors: dict[str, np.ndarray] = {}
    for leaf_path, key in _leaves(family.keys(cfg, layer)):
        host = np.asarray(jax.device_get(_get(params, leaf_path)))
        if isinstance(key, FusedExpertTensor):
            key.write(host, tensors)
        elif leaf_path[0] == "experts":
            for e, expert_key in enumerate(key):
                tensors[expert_key] = np.ascontiguousarray(host[e].T)
        else:
            tensors[key] = np.ascontiguousarray(host.T if host.ndim == 2 else host)
    return tensors


__all__ = ["load_moe_layer", "moe_layer_state_dict"]
