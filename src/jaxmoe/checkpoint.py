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

import itertools
import os
import shutil
from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

try:
    import orbax.checkpoint as ocp
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "jaxmoe.checkpoint needs orbax-checkpoint, which is not installed. Install it with "
        "`pip install jaxmoe[checkpoint]` (or `pip install orbax-checkpoint`)."
    ) from error

from jaxmoe.argument_checks import check_mesh_type, describe
from jaxmoe.checkpoint_checks import (
    METADATA,
    check_directory,
    check_items,
    check_max_to_keep,
    check_metadata,
    check_step,
    check_targets,
)
from jaxmoe.checkpoint_files import damage_message
from jaxmoe.config import MoEConfig
from jaxmoe.parallel import check_mesh, param_partition_specs
from jaxmoe.params import check_config, param_shapes


def param_shardings(cfg: MoEConfig, mesh: jax.sharding.Mesh | None = None) -> dict:
    """The sharding of every parameter on ``mesh`` (one device when ``None``).

    ``NamedSharding(mesh, param_partition_specs(cfg)[...])`` in the tree of ``init_params``;
    with ``mesh=None``, ``SingleDeviceSharding`` of this process's first device (``cfg.ep_axis``
    ignored).

    Raises:
      TypeError: ``cfg`` is not a ``MoEConfig`` or ``mesh`` not a ``jax.sharding.Mesh``.
      ValueError: ``cfg`` cannot be laid out on ``mesh`` (e.g. its ``ep_axis`` size does not
        divide ``num_experts``; :func:`jaxmoe.parallel.check_mesh`).
    """
    check_config(cfg, "param_shardings")
    check_mesh_type(mesh, "param_shardings")
    if mesh is not None and cfg.ep_axis is not None:
        check_mesh(cfg, mesh)
    specs = param_partition_specs(cfg)
    if mesh is None:
        device = SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda _: device, specs, is_leaf=_is_spec)
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=_is_spec)


def abstract_params(cfg: MoEConfig, mesh: jax.sharding.Mesh | None = None) -> dict:
    """``jax.ShapeDtypeStruct`` of every parameter (``cfg.param_dtype``) with its sharding."""
    check_config(cfg, "abstract_params")
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
    if not callable(getattr(tx, "init", None)):
        raise TypeError(
            f"abstract_opt_state: `tx` must be an optax.GradientTransformation (the optimizer "
            f"whose tx.init(params) made the saved state); got {describe(tx)}. Pass the same "
            "optimizer, e.g. optax.adamw(1e-3)."
        )
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
    target that puts the checkpoint exactly where ``tree`` lives (structs pass through; a NumPy
    array is restored onto this process's first device)."""

    def struct(a):
        if isinstance(a, jax.ShapeDtypeStruct):
            return a
        sharding = getattr(a, "sharding", None) or SingleDeviceSharding(jax.local_devices()[0])
        return jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=sharding)

    return jax.tree.map(struct, tree)


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
      step: the training step this state belongs to: an int ``>= 0`` (the step's directory is
        named by it, and only such names are listed as steps).
      items: e.g. ``{"params": params, "opt_state": opt_state}``; each name is an orbax item
        (a plain name: not ``"metadata"``, no ``/``, not starting with ``.`` or ``_``), each
        value a non-empty pytree of ``jax.Array`` or NumPy arrays.
      metadata: an optional JSON-serialisable dict (data-loader position, metrics so far).
      max_to_keep: keep only the newest steps (``None`` keeps all).

    Saving a step that exists **replaces** it (running a script twice overwrites its
    checkpoint, as ``force=True`` reads): the new state is written completely beside the old
    one first and then takes its place (two renames), so an interrupted save leaves the old
    step in place. Blocks until the checkpoint is on disk. Under ``jax.distributed`` every
    process must call it.

    Raises:
      TypeError / ValueError: naming the argument, before anything is written: ``directory``
        not a path or a file, ``step`` not an int ``>= 0`` (a bool, a float, a string or a
        negative step would be written where no restore finds it), ``items`` not a mapping of
        names to pytrees of arrays (e.g. the params tree itself: pass ``{"params": params}``),
        ``metadata`` not JSON-serialisable, ``max_to_keep`` not ``None`` or an int ``>= 1``.
    """
    directory = check_directory(directory, "save")
    step = check_step(step, "save")
    check_items(items)
    check_metadata(metadata)
    check_max_to_keep(max_to_keep)
    args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
    if metadata is not None:
        args[METADATA] = ocp.args.JsonSave(metadata)
    if step in _all_steps(directory):
        _replace_step(directory, step, args)
        return
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
        Items of the checkpoint not named here are not read; every leaf of a named item must be
        in its target (a partial item is refused).
      step: which step; ``None`` takes the latest.

    Returns:
      name -> the restored pytree, in the target's structure, dtypes and shardings.

    Raises:
      FileNotFoundError: no checkpoint (or not that step) in ``directory``.
      TypeError / ValueError: naming the argument, before anything is read: ``directory`` not
        a path or a file, ``step`` not an int ``>= 0``, ``targets`` not a mapping of names to
        pytrees of ``ShapeDtypeStruct`` / arrays (e.g. a ``MoEConfig``: pass
        ``abstract_params(cfg, mesh)``).
      ValueError: a target leaf is missing from the checkpoint or has another shape, or the
        checkpoint's item has leaves the target lacks (each named); raised before any array is
        read. Also a damaged checkpoint (a truncated or overwritten file), naming the item and
        the file.
    """
    directory = check_directory(directory, "restore")
    check_targets(targets, "restore")
    targets = {name: abstract_like(tree) for name, tree in targets.items()}
    step = _resolve_step(directory, step, "restore")
    check_checkpoint(directory, targets, step=step)
    names = _stored_items(directory, step)
    with _manager(directory, names, None) as manager:
        args = {name: ocp.args.StandardRestore(tree) for name, tree in targets.items()}
        restored = _read(
            directory,
            step,
            tuple(targets),
            lambda: manager.restore(step, args=ocp.args.Composite(**args)),
        )
    return {name: restored[name] for name in targets}


def restore_metadata(directory: str | os.PathLike, *, step: int | None = None) -> dict | None:
    """The JSON ``metadata`` saved with ``step`` (default: the latest), or None if there is none."""
    directory = check_directory(directory, "restore_metadata")
    step = _resolve_step(directory, step, "restore_metadata")
    if not os.path.isdir(os.path.join(directory, str(step), METADATA)):
        return None
    with _manager(directory, (METADATA,), None) as manager:
        args = ocp.args.Composite(**{METADATA: ocp.args.JsonRestore()})
        return _read(directory, step, (METADATA,), lambda: manager.restore(step, args=args))[
            METADATA
        ]


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest step saved in ``directory``, or None (also when it does not exist)."""
    directory = check_directory(directory, "latest_step")
    steps = _all_steps(directory)
    return max(steps) if steps else None


def check_checkpoint(
    directory: str | os.PathLike, targets: Mapping[str, object], *, step: int | None = None
) -> None:
    """Raises ``ValueError`` naming the first target leaf the checkpoint lacks or shapes
    differently, or a leaf of a named item that the target lacks (reads metadata only)."""
    directory = check_directory(directory, "check_checkpoint")
    check_targets(targets, "check_checkpoint")
    targets = {name: abstract_like(tree) for name, tree in targets.items()}
    step = _resolve_step(directory, step, "check_checkpoint")
    names = _stored_items(directory, step)
    with _manager(directory, names, None) as manager:
        stored = _read(directory, step, names, lambda: manager.item_metadata(step))
        for name, tree in targets.items():
            meta = stored[name] if name in stored else None
            if meta is None and name in names:  # its directory is there, orbax reads nothing
                raise ValueError(
                    damage_message(directory, step, name, None, _all_steps(directory))
                    or (
                        f"checkpoint {directory} step {step}: item {name!r} has no readable "
                        "metadata; it is damaged. Restore another step or save this one again."
                    )
                )
            if meta is None:
                raise ValueError(
                    f"checkpoint {directory} step {step} has no item {name!r}; it holds "
                    f"{sorted(k for k in stored if stored[k] is not None)}."
                )
            _check_item(name, tree, getattr(meta, "tree", meta), directory, step)


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
    target_leaves = jax.tree_util.tree_flatten_with_path(target)[0]
    extra = sorted(set(stored_leaves) - {_path(path) for path, _ in target_leaves})
    if extra:
        raise ValueError(
            f"checkpoint {directory} step {step}: item {name!r} holds leaves the target lacks: "
            f"{[f'{name}/' + '/'.join(k) for k in extra][:8]}. jaxmoe restores whole items: "
            "build the target with the config the checkpoint was saved with (e.g. the same "
            "use_expert_bias, num_shared_experts, activation), or abstract_like(the saved tree)."
        )
    for path, leaf in target_leaves:
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


def _all_steps(directory: str) -> list[int]:
    """The saved steps: orbax's finished step folders, named by the step (unfinished ones carry
    a temporary suffix). Read from the file system, not through a ``CheckpointManager``, whose
    construction synchronises the processes: under ``jax.distributed`` a process that finds no
    folder yet would skip a barrier the others enter."""
    if not os.path.isdir(directory):
        return []
    return sorted(
        int(name)
        for name in os.listdir(directory)
        if name.isdigit() and os.path.isdir(os.path.join(directory, name))
    )


def _resolve_step(directory: str, step: int | None, where: str) -> int:
    if step is not None:
        step = check_step(step, where)
    steps = _all_steps(directory)
    if step is None and steps:
        return max(steps)
    if step is not None and step in steps:
        return step
    raise FileNotFoundError(
        f"no checkpoint{'' if step is None else f' for step {step}'} in {directory} "
        f"(steps found: {sorted(steps)})."
    )


# ----------------------------------------------------------------------------- writing and reading


_REPLACEMENTS = itertools.count()  # unique barrier names; every process calls save in one order


def _replace_step(directory: str, step: int, args: dict) -> None:
    # orbax never overwrites a step (StepAlreadyExistsError, even with force=True): write the
    # new state as the same step of a staging root inside ``directory`` (not a step name, so
    # orbax lists nothing there), then swap the two step directories on the primary process.
    staging = os.path.join(directory, f".replacing-{step}")
    old = os.path.join(directory, str(step))
    replaced = os.path.join(directory, f".replaced-{step}")
    primary = ocp.multihost.is_primary_host(0)
    if primary:
        for leftover in (staging, replaced):  # from an interrupted earlier replacement
            shutil.rmtree(leftover, ignore_errors=True)
    _sync(f"jaxmoe.checkpoint.replace.start.{next(_REPLACEMENTS)}")
    with _manager(staging, tuple(args), None) as manager:
        manager.save(step, args=ocp.args.Composite(**args), force=True)
        manager.wait_until_finished()
    if primary:
        os.replace(old, replaced)
        os.replace(os.path.join(staging, str(step)), old)
        shutil.rmtree(replaced)
        shutil.rmtree(staging)
    _sync(f"jaxmoe.checkpoint.replace.done.{next(_REPLACEMENTS)}")


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        ocp.multihost.sync_global_processes(name)


def _read(directory: str, step: int, names: tuple[str, ...], read):
    """``read()``, with an error from a damaged file re-raised naming the item and the file."""
    try:
        return read()
    except Exception as error:
        for name in names:
            message = damage_message(directory, step, name, error, _all_steps(directory))
            if message is not None:
                raise ValueError(message) from error
        raise


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
