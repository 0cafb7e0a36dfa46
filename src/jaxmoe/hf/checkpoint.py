"""A safetensors checkpoint directory: which file holds each key, tensor shapes from the file
headers, and memory-mapped reads of whole tensors or slices of them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import numpy as np

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _safetensors():
    try:
        import safetensors
    except ImportError as error:  # pragma: no cover - the extra is installed in the test env
        raise ImportError(
            "jaxmoe.hf reads safetensors checkpoints: pip install 'jaxmoe[hf]' (safetensors)."
        ) from error
    return safetensors


class CheckpointFiles:
    """The tensors of a checkpoint directory as written by ``save_pretrained`` or the Hub.

    Either ``model.safetensors.index.json`` (its ``weight_map``: key -> shard file) or one
    ``model.safetensors``. Files are opened lazily and memory-mapped: :meth:`read` copies only
    the requested slice.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise ValueError(
                f"jaxmoe.hf: `path` must be a checkpoint directory; {self.path!r} is not one."
            )
        index = os.path.join(self.path, INDEX)
        if os.path.isfile(index):
            with open(index) as file:
                self.weight_map = dict(json.load(file)["weight_map"])
        elif os.path.isfile(os.path.join(self.path, SINGLE)):
            self.weight_map = None  # every key in the one file, listed on first use
        else:
            raise ValueError(
                f"jaxmoe.hf: {self.path!r} has neither {INDEX} nor {SINGLE}; point `path` at "
                "a safetensors checkpoint directory (as save_pretrained writes)."
            )
        self._handles: dict[str, object] = {}

    def _open(self, name: str):
        if name not in self._handles:
            self._handles[name] = _safetensors().safe_open(
                os.path.join(self.path, name), framework="numpy"
            )
        return self._handles[name]

    def has(self, key: str) -> bool:
        """Whether the checkpoint lists ``key`` (its index, or its one file's header)."""
        if self.weight_map is None:
            self.weight_map = dict.fromkeys(self._open(SINGLE).keys(), SINGLE)
        return key in self.weight_map

    def file_of(self, key: str) -> str:
        if not self.has(key):
            where = INDEX if os.path.isfile(os.path.join(self.path, INDEX)) else SINGLE
            raise ValueError(
                f"jaxmoe.hf: the checkpoint {self.path!r} has no tensor {key!r} (not in {where}). "
                "Check that `layer` is an MoE layer and that config.json matches the weights."
            )
        return self.weight_map[key]

    def check_files(self, keys: Iterable[str]) -> None:
        """Raises ValueError naming the first key whose shard file is missing."""
        for key in keys:
            name = self.file_of(key)
            if not os.path.isfile(os.path.join(self.path, name)):
                raise ValueError(
                    f"jaxmoe.hf: shard {name!r} (holding {key!r}, per {INDEX}) is missing from "
                    f"{self.path!r}. Download every shard of the checkpoint."
                )

    def shape(self, key: str) -> tuple[int, ...]:
        """The tensor's shape, from its file's header (no data read)."""
        return tuple(self._open(self.file_of(key)).get_slice(key).get_shape())

    def dtype(self, key: str) -> np.dtype:
        """The tensor's numpy dtype (bfloat16 is ml_dtypes'), from an empty slice: no data read."""
        tensor = self._open(self.file_of(key)).get_slice(key)
        return tensor[tuple(slice(0, 0) for _ in tensor.get_shape())].dtype

    def read(self, key: str, index: tuple[slice, ...] | None = None) -> np.ndarray:
        """The tensor, or its ``index`` slice (a tuple of slices), copied out of the mmap."""
        handle = self._open(self.file_of(key))
        if index is None:
            return handle.get_tensor(key)
        return np.asarray(handle.get_slice(key)[index])


__all__ = ["CheckpointFiles"]
