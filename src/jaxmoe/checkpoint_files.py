"""Which file of a checkpoint is damaged: read when orbax or tensorstore fails on a step, so
:mod:`jaxmoe.checkpoint` can say which item and file (and, for an array, which leaf) to look at
instead of a tensorstore dump or a ``JSONDecodeError`` that names no file.

An orbax item directory holds JSON files (``_METADATA``: the tree; ``_sharding``;
``array_metadatas/``; the ``metadata`` item's ``metadata``) and an OCDBT database
(``manifest.ocdbt``, ``d/``, ``ocdbt.process_*/``) that tensorstore reads; tensorstore's errors
name the database's files as ``local file "..."`` and the array as ``"<leaf.path>/..."``.
"""

from __future__ import annotations

import json
import os
import re

from jaxmoe.checkpoint_checks import METADATA

_LOCAL_FILE = re.compile(r'local file "([^"]+)"')
_ARRAY_KEY = re.compile(r'(?:Error reading|Metadata at) "([^"/]+)/')
_JSON_FILES = ("_METADATA", "_sharding", "array_metadatas", METADATA)  # orbax's JSON files


def damage_message(directory: str, step: int, name: str, error, steps: list[int]) -> str | None:
    """What is damaged in item ``name`` of ``step`` (the file and, if known, the leaf), or
    None when its files look sound and ``error`` (orbax's or tensorstore's, if any) names none
    of them. ``steps``: the steps found, for the message."""
    item_dir = os.path.abspath(os.path.join(directory, str(step), name))
    texts, cause = [], error
    while cause is not None and len(texts) < 8:
        texts.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    text = "\n".join(texts)
    named = [
        f
        for f in _LOCAL_FILE.findall(text)
        if os.path.abspath(f) == item_dir or os.path.abspath(f).startswith(item_dir + os.sep)
    ]
    if named:
        damaged = max(named, key=len)  # the innermost: a file inside the item's database
        keys = _ARRAY_KEY.findall(text)
        leaf = f", reading leaf {name + '/' + keys[0].replace('.', '/')!r}" if keys else ""
        # tensorstore's message without its spec dump: the cause, in its words
        reason = texts[-1].split(" [tensorstore_spec")[0].splitlines()[0][:300]
        what = f"cannot be read ({reason}{leaf})"
    else:
        damaged, what = damaged_json(item_dir, name)
        if damaged is None:
            return None
    return (
        f"checkpoint {directory} step {step}: item {name!r} is damaged: {damaged} {what}. "
        "The file was truncated, overwritten or removed "
        f"after the save; restore another step (steps found: {sorted(steps)}) "
        "or save this one again. Other steps are separate directories."
    )


def damaged_json(item_dir: str, name: str) -> tuple[str | None, str]:
    """The first JSON file of an item that is missing (the one orbax always needs: the tree, or
    the metadata dict) or does not parse, and what is wrong with it; ``(None, "")`` if none."""
    required = os.path.join(item_dir, METADATA if name == METADATA else "_METADATA")
    if os.path.isdir(item_dir) and not os.path.exists(required):
        return required, "is missing"
    for root, _, files in os.walk(item_dir):
        for file in files:
            if os.path.relpath(os.path.join(root, file), item_dir).split(os.sep)[0] not in (
                _JSON_FILES
            ):
                continue
            try:
                with open(os.path.join(root, file), encoding="utf-8") as handle:
                    json.load(handle)
            except (OSError, ValueError) as error:
                return os.path.join(root, file), f"is not valid JSON ({error})"
    return None, ""
