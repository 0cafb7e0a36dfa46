"""Checkpoints of MoE layers and optimizer state (orbax-checkpoint), restorable onto any mesh.

A checkpoint is an orbax ``CheckpointManager`` directory: one sub-directory per step, holding one
orbax item per name you save (``"params"``, ``"opt_state"``, ...) and an optional JSON item
``"metadata"``. Arrays are stored globally (not per device), so a restore may place them on any
sharding: the target shardings are built from the library's own rules
(:func:`jaxmoe.parallel.param_partition_specs`) for the config and mesh you restore onto --
another ``ep_axis`` size, FSDP on or off, or a single device::

  save(ckpt_dir, step, {"params": params, "opt_state": opt_state})
  ...
  target = {"params": abstract_params(cfg, mesh), "opt_state": abstract_opt_state(tx, cfg, mesh)}
  state = restore(ckpt_dir, target)                    # the latest step
  params, opt_state = state["params"], state["opt_state"]

Before anything is read, every leaf of the target is checked against the checkpoint's metadata
(:func:`check_checkpoint`); a leaf that is missing or has another shape raises ``ValueError``
naming it. For ``jaxmoe.nn.MoE`` use :func:`save_module` / :func:`restore_module` (the module's
state, ``ExpertBias`` included, in the same layout as ``init_params``).

Needs the ``checkpoint`` extra: ``pip install jaxmoe[checkpoint]``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

try:
    import orbax.checkpoint as ocp
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "jaxmoe.checkpoint needs orbax-checkpoint, which is not installed. Install it with "
        "`pip install jaxmoe[checkpoint]` (or `pip install orbax-checkpoint`)."
    ) from error

from jaxmoe.config import MoEConfig
from jaxmoe.parallel import param_partition_specs
from jaxmoe.params import param_shapes

METADATA = "metadata"  # the name of the optional JSON item


def param_shardings(cfg: MoEConfig, mesh: jax.sharding.Mesh | None = None) -> dict:
    """The sharding of every parameter on ``mesh`` (one device when ``None``).

    ``NamedSharding(mesh, param_partition_specs(cfg)[...])`` in the tree of ``init_params``;
    with ``mesh=None``, ``SingleDeviceSharding`` of this process's first device (``cfg.ep_axis``
    ignored).
    """
    specs = param_partition_specs(cfg)
    if mesh is None:
        device = SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda _: device, specs, is_leaf=_is_spec)
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=_is_spec)


def abstract_params(cfg: MoEConfig, mesh: jax.sharding.Mesh | None = None) -> dict:
    """``jax.ShapeDtypeStruct`` of every parameter (``cfg.param_dtype``) with its sharding."""
    return jax.tree.map(
        lambda shape, sharding: jax.ShapeDtypeStruct(shape, cfg.param_dtype, sharding=sharding),
        param_shapes(cfg),
        param_shardings(cfg, mesh),
        is_leaf=_is_shape,
    )


def abstract_opt_state(tx, cfg: MoEConfig, mesh: jax.sharding.Mesh | None = None):
    """``jax.ShapeDtypeStruct`` tree of ``tx.init(params)`` (an optax transformation) on ``mesh``.

    A leaf whose key path ends with a parameter's path and has its shape (Adam's ``mu``/``nu``,
    momentum, ...) gets that parameter's sharding; the rest (step counts, scalars) are
    replicated.
    """
    params = abstract_params(cfg, mesh)
    shapes = jax.eval_shape(tx.init, params)
    by_path = {_path(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    replicated = (
        SingleDeviceSharding(jax.local_devices()[0])
        if mesh is None
        else NamedSharding(mesh, PartitionSpec())
    )

    def place(path, leaf):
        names = _path(path)
        for cut in range(len(names)):
            param = by_path.get(names[cut:])
            if param is not None and param.shape == leaf.shape:
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=param.sharding)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated)

    return jax.tree_util.tree_map_with_path(place, shapes)


def abstract_like(tree):
    """``jax.ShapeDtypeStruct`` (shape, dtype, sharding) of every array of ``tree``: a restore
    target that puts the checkpoint exactly where ``tree`` lives (structs pass through)."""
    return jax.tree.map(
        lambda a: (
            a
            if isinstance(a, jax.ShapeDtypeStruct)
            else jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
        ),
        tree,
    )


def save(
    directory: str | os.PathLike,
    step: int,
    items: Mapping[str, object],
    *,
    metadata: dict | None = None,
    max_to_keep: int | None = None,
) -> None:
    """Saves ``items`` (name -> pytree of ``jax.Array``) as step ``step`` of ``directory``.

    Args:
      directory: the checkpoint root (created if needed; one sub-directory per step).
      step: the training step this state belongs to.
      items: e.g. ``{"params": params, "opt_state": opt_state}``; each name is an orbax item.
      metadata: an optional JSON-serialisable dict (data-loader position, metrics so far).
      max_to_keep: keep only the newest steps (``None`` keeps all).

    Blocks until the checkpoint is on disk. Under ``jax.distributed`` every process must call it.
    """
    _check_item_names(items)
    args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
    if metadata is not None:
        args[METADATA] = ocp.args.JsonSave(metadata)
    with _manager(directory, tuple(args), max_to_keep) as manager:
        manager.save(step, args=ocp.args.Composite(**args), force=True)
        manager.wait_until_finished()


def restore(
    directory: str | os.PathLike, targets: Mapping[str, object], *, step: int | None = None
) -> dict:
    """Restores the items named in ``targets`` from ``step`` (default: the latest).

    Args:
      directory: the root given to :func:`save`.
      targets: name -> pytree of ``jax.ShapeDtypeStruct`` (with ``sharding``) or arrays, e.g.
        from :func:`abstract_params`, :func:`abstract_opt_state` or :func:`abstract_like`.
        Items of the checkpoint not named here are not read.
      step: which step; ``None`` takes the latest.

    Returns:
      name -> the restored pytree, in the target's structure, dtypes and shardings.

    Raises:
      FileNotFoundError: no checkpoint (or not that step) in ``directory``.
      ValueError: a target leaf is missing from the checkpoint or has another shape (the leaf
        is named); raised before any array is read.
    """
    _check_item_names(targets)
    targets = {name: abstract_like(tree) for name, tree in targets.items()}
    step = _resolve_step(directory, step)
    check_checkpoint(directory, targets, step=step)
    with _manager(directory, _stored_items(directory, step), None) as manager:
        args = {name: ocp.args.StandardRestore(tree) for name, tree in targets.items()}
        restored = manager.restore(step, args=ocp.args.Composite(**args))
    return {name: restored[name] for name in targets}


def restore_metadata(directory: str | os.PathLike, *, step: int | None = None) -> dict | None:
    """The JSON ``metadata`` saved with ``step`` (default: the latest), or None if there is none."""
    step = _resolve_step(directory, step)
    if not os.path.isdir(os.path.join(directory, str(step), METADATA)):
        return None
    with _manager(directory, (METADATA,), None) as manager:
        return manager.restore(step, args=ocp.args.Composite(**{METADATA: ocp.args.JsonRestore()}))[
            METADATA
        ]


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest step saved in ``directory``, or None (also when it does not exist)."""
    if not os.path.isdir(directory):
        return None
    with ocp.CheckpointManager(os.path.abspath(directory)) as manager:
        return manager.latest_step()


def check_checkpoint(
    directory: str | os.PathLike, targets: Mapping[str, object], *, step: int | None = None
) -> None:
    """Raises ``ValueError`` naming the first target leaf the checkpoint lacks or shapes
    differently (reads metadata only)."""
    step = _resolve_step(directory, step)
    with _manager(directory, _stored_items(directory, step), None) as manager:
        stored = manager.item_metadata(step)
        for name, tree in targets.items():
            meta = stored[name] if name in stored else None
            if meta is None:
                raise ValueError(
                    f"checkpoint {directory} step {step} has no item {name!r}; it holds "
                    f"{sorted(k for k in stored if stored[k] is not None)}."
                )
            _check_item(name, abstract_like(tree), getattr(meta, "tree", meta), directory, step)


def save_module(directory: str | os.PathLike, step: int, module: nnx.Module, **kwargs) -> None:
    """Saves a ``jaxmoe.nn.MoE`` (or any NNX module) as the item ``"params"``.

    The state is stored as its pure dict -- for ``MoE`` exactly the ``init_params`` layout,
    ``expert_bias`` (an ``ExpertBias``, not an ``nnx.Param``) included -- so a functional
    :func:`restore` and :func:`restore_module` read the same checkpoint. ``kwargs`` go to
    :func:`save`.
    """
    save(directory, step, {"params": nnx.to_pure_dict(nnx.state(module))}, **kwargs)


def restore_module(
    directory: str | os.PathLike, module: nnx.Module, *, step: int | None = None
) -> nnx.Module:
    """Loads the item ``"params"`` into ``module`` in place (and returns it).

    For a ``jaxmoe.nn.MoE`` the arrays land on the shardings of its config and mesh
    (:func:`param_shardings` of ``module.cfg`` and ``module.mesh``); for another module, where
    its arrays live now.
    """
    state = nnx.state(module)
    current = nnx.to_pure_dict(state)
    cfg, mesh = getattr(module, "cfg", None), getattr(module, "mesh", None)
    if isinstance(cfg, MoEConfig):
        target = abstract_params(cfg, mesh)
        if jax.tree.structure(target) != jax.tree.structure(current):
            raise ValueError(
                f"restore_module: the module's state {jax.tree.structure(current)} does not "
                f"match its config's parameters {jax.tree.structure(target)}."
            )
    else:
        target = abstract_like(current)
    restored = restore(directory, {"params": target}, step=step)["params"]
    nnx.replace_by_pure_dict(state, restored)
    nnx.update(module, state)
    return module


def _check_item(name: str, target, stored, directory, step) -> None:
    stored_leaves = {
        _path(p): leaf
        for p, leaf in jax.tree_util.tree_flatten_with_path(
            stored, is_leaf=lambda n: hasattr(n, "shape")
        )[0]
    }
    for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
        key = _path(path)
        leaf_name = f"{name}/{'/'.join(key)}"
        found = stored_leaves.get(key)
        if found is None:
            raise ValueError(
                f"checkpoint {directory} step {step}: leaf {leaf_name!r} is missing (the "
                f"checkpoint's {name!r} has {sorted('/'.join(k) for k in stored_leaves)}). "
                "Restore with the config the checkpoint was saved with (e.g. the same "
                "use_expert_bias, num_shared_experts, activation)."
            )
        if tuple(found.shape) != tuple(leaf.shape):
            raise ValueError(
                f"checkpoint {directory} step {step}: leaf {leaf_name!r} has shape "
                f"{tuple(found.shape)} in the checkpoint but the config expects "
                f"{tuple(leaf.shape)}. Restore with the num_experts / hidden_size / ffn_size the "
                "checkpoint was saved with; only the mesh and sharding may change."
            )


def _manager(directory, names: tuple[str, ...], max_to_keep):
    # Every item gets its handler, the JSON one always (so orbax can read any step's metadata).
    handlers = {name: ocp.StandardCheckpointHandler() for name in names if name != METADATA}
    handlers[METADATA] = ocp.JsonCheckpointHandler()
    return ocp.CheckpointManager(
        os.path.abspath(directory),
        item_handlers=handlers,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
    )


def _stored_items(directory, step: int) -> tuple[str, ...]:
    # Registering a handler for every item on disk keeps orbax from warning about the ones a
    # partial restore leaves unread.
    step_dir = os.path.join(directory, str(step))
    return tuple(
        name
        for name in sorted(os.listdir(step_dir))
        if os.path.isdir(os.path.join(step_dir, name)) and not name.startswith((".", "_"))
    )


def _resolve_step(directory, step: int | None) -> int:
    steps = []
    if os.path.isdir(directory):
        with ocp.CheckpointManager(os.path.abspath(directory)) as manager:
            steps = manager.all_steps()
    if step is None and steps:
        return max(steps)
    if step is not None and step in steps:
        return step
    raise FileNotFoundError(
        f"no checkpoint{'' if step is None else f' for step {step}'} in {directory} "
        f"(steps found: {sorted(steps)})."
    )


def _check_item_names(items: Mapping[str, object]) -> None:
    if METADATA in items:
        raise ValueError(
            f"the item name {METADATA!r} is reserved for the JSON metadata; pass that dict as "
            "`metadata=` and name the array items otherwise."
        )


def _path(path) -> tuple[str, ...]:
    # DictKey('mu'), GetAttrKey('mu') (optax namedtuples) and SequenceKey(0) all become
    # strings, as in orbax's metadata tree.
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
        else:
            names.append(str(key))
    return tuple(names)


def _is_spec(node) -> bool:
    return isinstance(node, PartitionSpec)


def _is_shape(node) -> bool:
    return isinstance(node, tuple) and all(isinstance(d, int) for d in node)


__all__ = [
    "abstract_like",
    "abstract_opt_state",
    "abstract_params",
    "check_checkpoint",
    "latest_step",
    "param_shardings",
    "restore",
    "restore_metadata",
    "restore_module",
    "save",
    "save_module",
]
