"""Argument checks of :mod:`jaxmoe.checkpoint`, run before orbax is called: each raises a
``TypeError`` (wrong type) or ``ValueError`` naming the argument, the rule, what was received
and the fix. Needs no orbax, so the rules hold (and are tested) without it.

Why each rule: orbax writes a step's directory under ``str(step)`` and lists as steps only the
names that parse as an int >= 0, so any other step is written where nothing finds it again;
an item's name is a directory of the step (a name starting with ``.`` or ``_`` is not listed
as an item).
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Mapping

import jax
import numpy as np

from jaxmoe.argument_checks import describe
from jaxmoe.config import MoEConfig

METADATA = "metadata"  # the name of the optional JSON item


def check_directory(directory, where: str) -> str:
    """``directory`` as a str path; refuses what is not a path, and a path at or under a file."""
    try:
        path = os.fsdecode(os.fspath(directory))
    except TypeError:
        raise TypeError(
            f"{where}: `directory` must be a path (str or os.PathLike); got {describe(directory)}."
            " Pass the checkpoint root, e.g. '/tmp/moe-ckpt'."
        ) from None
    if not path:
        raise ValueError(
            f"{where}: `directory` is the empty string. Pass the checkpoint root, e.g. "
            "'/tmp/moe-ckpt' (or '.' for the current directory)."
        )
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where_it_is = (
            "is" if existing == os.path.abspath(path) else f"is under the file {existing}:"
        )
        raise ValueError(
            f"{where}: `directory` {path!r} {where_it_is} a file, not a directory. Pass a "
            "directory: save creates it (with one sub-directory per step); the other functions "
            "read one that save wrote."
        )
    return path


def check_step(step, where: str) -> int:
    rule = (
        f"{where}: `step` must be an int >= 0 (the step's directory is named by it, and only "
        f"such names are found again); got {step!r} ({type(step).__name__})."
    )
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"{rule} Pass the training step as an int, e.g. int(step).")
    if step < 0:
        raise ValueError(f"{rule} Count steps from 0.")
    return int(step)


def check_names(mapping, argument: str, where: str, example: str) -> None:
    if not isinstance(mapping, Mapping):
        raise TypeError(
            f"{where}: `{argument}` must be a mapping of item name -> pytree, e.g. {example}; "
            f"got {describe(mapping)}."
        )
    if not mapping:
        raise ValueError(f"{where}: `{argument}` is empty; pass e.g. {example}.")
    for name in mapping:
        if (
            not isinstance(name, str)
            or not name
            or name.startswith((".", "_"))
            or "/" in name
            or os.sep in name
        ):
            raise ValueError(
                f"{where}: `{argument}` has the item name {name!r}; an item name is a "
                "non-empty str without '/' that does not start with '.' or '_' (it names a "
                "directory of the step), e.g. 'params'."
            )
    if METADATA in mapping:
        raise ValueError(
            f"{where}: the item name {METADATA!r} is reserved for the JSON metadata; pass that "
            "dict as `metadata=` and name the array items otherwise."
        )


def check_items(items) -> None:
    example = "{'params': params, 'opt_state': opt_state}"
    check_names(items, "items", "save", example)
    if {"router", "experts"} <= set(items):
        raise ValueError(
            f"save: `items` looks like a parameter tree itself (its names {sorted(items)} are "
            "init_params's), which would be saved as one item per parameter group. Name the "
            f"tree: save(directory, step, {{'params': params}}), e.g. {example}."
        )
    check_leaves(
        items,
        "items",
        "save",
        (jax.Array, np.ndarray, np.generic),
        lambda leaf: (
            "a checkpoint item holds arrays (jax or NumPy): convert it with "
            "jnp.asarray(...), or put plain Python values in `metadata=`"
        ),
    )


def check_leaves(mapping, argument: str, where: str, kinds: tuple, fix) -> None:
    """Every value of ``mapping`` is a pytree with at least one leaf, each an instance of
    ``kinds``; else a ValueError (empty) or TypeError (``fix(leaf)`` says what to pass)."""
    for name, tree in mapping.items():
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        if not leaves:
            raise ValueError(
                f"{where}: {argument}[{name!r}] holds no arrays (got {describe(tree)}); pass a "
                "pytree of arrays, or leave the name out."
            )
        for path, leaf in leaves:
            if not isinstance(leaf, kinds):
                raise TypeError(
                    f"{where}: {argument}[{name!r}]{jax.tree_util.keystr(path)} is "
                    f"{describe(leaf)}; {fix(leaf)}."
                )


def check_metadata(metadata) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise TypeError(f"save: `metadata` must be a dict or None; got {describe(metadata)}.")
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"save: `metadata` must be JSON-serialisable ({error}). Convert arrays with "
            ".tolist() or float(...), or save them as an item."
        ) from None


def check_targets(targets, where: str) -> None:
    """``targets``: a mapping of item names to non-empty pytrees of ``jax.ShapeDtypeStruct`` or
    arrays (a ``MoEConfig`` there is refused, pointing to ``abstract_params``)."""
    check_names(targets, "targets", where, "{'params': abstract_params(cfg, mesh)}")
    check_leaves(
        targets,
        "targets",
        where,
        (jax.ShapeDtypeStruct, jax.Array, np.ndarray),
        lambda leaf: (
            "a target is a ShapeDtypeStruct (with sharding) or an array: "
            + (
                "pass abstract_params(cfg, mesh) (or abstract_opt_state(tx, cfg, mesh))"
                if isinstance(leaf, MoEConfig)
                else "pass e.g. abstract_params(cfg, mesh) or abstract_like(tree)"
            )
        ),
    )


def check_max_to_keep(max_to_keep) -> None:
    """``max_to_keep``: None (keep every step) or an int >= 1 (0 would delete what is saved)."""
    if max_to_keep is not None and (
        isinstance(max_to_keep, bool)
        or not isinstance(max_to_keep, numbers.Integral)
        or max_to_keep < 1
    ):
        raise ValueError(
            f"save: `max_to_keep` must be None (keep every step) or an int >= 1; got "
            f"{max_to_keep!r}."
        )
