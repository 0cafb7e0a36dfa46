"""Shared pieces of the grouped matmul op: argument checks and the backend interface.

Every backend implements two primitives on already-validated arguments:

* ``gmm(lhs[M, K], rhs[G, K, N], group_sizes[G]) -> [M, N]``: row block ``g`` of ``lhs`` times
  ``rhs[g]`` (or ``rhs[g].T`` with ``transpose_rhs``, where ``rhs`` is then ``[G, N, K]``). Rows at
  or beyond ``sum(group_sizes)`` are zeros.
* ``tgmm(lhs[M, K], rhs[M, N], group_sizes[G]) -> [G, K, N]``: for each group, ``lhs_g^T @ rhs_g``
  over that group's rows; an empty group gives zeros.

``api.grouped_matmul`` binds them as JAX primitives (:mod:`.primitives`): the forward is
``gmm``, the input gradient is ``gmm`` with ``rhs`` transposed and the weight gradient is
``tgmm``. The group sizes reaching a backend always sum to at most ``M`` (``api`` clips them),
are int32 and stay on the device.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.sorted_search import search_right

Array = jax.Array


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def check_grouped_matmul_args(lhs, rhs, group_sizes, preferred_element_type=None):
    """Raises ValueError, naming the argument, for anything the op cannot take."""
    lhs_shape, rhs_shape, gs_shape = np.shape(lhs), np.shape(rhs), np.shape(group_sizes)
    if len(lhs_shape) != 2:
        raise ValueError(
            f"grouped_matmul: `lhs` must be 2-D [M, K]; got shape {lhs_shape}. "
            "Flatten the leading dims first: lhs.reshape(-1, lhs.shape[-1])."
        )
    if len(rhs_shape) != 3:
        raise ValueError(f"grouped_matmul: `rhs` must be 3-D [G, K, N]; got shape {rhs_shape}.")
    if lhs_shape[1] != rhs_shape[1]:
        raise ValueError(
            f"grouped_matmul: the contracting dims differ: `lhs` is [M={lhs_shape[0]}, "
            f"K={lhs_shape[1]}] but `rhs` is [G={rhs_shape[0]}, K={rhs_shape[1]}, "
            f"N={rhs_shape[2]}]. `rhs[g]` must be [K, N]."
        )
    if gs_shape != (rhs_shape[0],):
        raise ValueError(
            f"grouped_matmul: `group_sizes` must be 1-D with one entry per group of `rhs` "
            f"(shape ({rhs_shape[0]},)); got shape {gs_shape}."
        )
    gs_dtype = jnp.result_type(group_sizes)
    if not jnp.issubdtype(gs_dtype, jnp.integer):
        raise ValueError(
            f"grouped_matmul: `group_sizes` must be an integer array (int32); got dtype "
            f"{gs_dtype}. Pass group_sizes.astype(jnp.int32)."
        )
    lhs_dtype, rhs_dtype = jnp.result_type(lhs), jnp.result_type(rhs)
    for name, dtype in (("lhs", lhs_dtype), ("rhs", rhs_dtype)):
        if not _is_float(dtype):
            raise ValueError(
                f"grouped_matmul: `{name}` must be a floating array (float32, bfloat16, "
                f"float16); got dtype {dtype}."
            )
    if lhs_dtype != rhs_dtype:
        raise ValueError(
            f"grouped_matmul: `lhs` ({lhs_dtype}) and `rhs` ({rhs_dtype}) must have the same "
            "dtype; cast one of them (e.g. rhs.astype(lhs.dtype))."
        )
    if preferred_element_type is not None and not _is_float(preferred_element_type):
        raise ValueError(
            f"grouped_matmul: `preferred_element_type` must be a floating dtype or None; got "
            f"{preferred_element_type}."
        )


def clip_group_sizes(group_sizes: Array, num_rows: int) -> Array:
    """Truncates groups so that they end by row ``num_rows`` (sum(result) <= num_rows)."""
    group_sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(group_sizes), num_rows)
    return jnp.diff(ends, prepend=jnp.zeros((1,), jnp.int32)).astype(jnp.int32)


def group_ids(group_sizes: Array, num_rows: int) -> Array:
    """The group of every row (``[num_rows]``); ``G`` for rows at or past ``sum(group_sizes)``."""
    ends = jnp.cumsum(group_sizes)
    return search_right(ends, jnp.arange(num_rows, dtype=ends.dtype))


# A group's default padding on a GPU: the row tile of the Triton kernels (and of the FP8 ones).
GPU_ROW_TILE = 128


@dataclasses.dataclass(frozen=True)
class GroupedMatmulBackend(abc.ABC):
    """One implementation of the grouped matmul primitives (see the module docstring).

    Class attributes (capabilities, declared by each backend):
      supports_check_vma: whether its outputs carry the mesh-variance types that
        ``jax.shard_map(check_vma=True)`` checks. Pallas kernels cannot declare them (jax 0.10 and
        0.11 refuse them under the check), so a sharded layer using one runs unchecked.
    """

    supports_check_vma: ClassVar[bool] = True
    name: str = dataclasses.field(default="", init=False)

    @abc.abstractmethod
    def gmm(
        self, lhs: Array, rhs: Array, group_sizes: Array, *, transpose_rhs: bool, out_dtype
    ) -> Array: ...

    @abc.abstractmethod
    def tgmm(self, lhs: Array, rhs: Array, group_sizes: Array, *, out_dtype) -> Array: ...

    def preferred_alignment(self, dtype) -> int:
        """Rows each group is best padded to on a GPU for ``dtype`` operands (what
        :func:`jaxmoe.ops.grouped_matmul.preferred_alignment` asks): 128, the Triton kernels'
        row tile, unless a backend's kernels tile differently."""
        del dtype
        return GPU_ROW_TILE
