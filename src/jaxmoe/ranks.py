r"""Each element's rank among the equal keys before it: :func:`stable_ranks`.

A stable sort by key puts element ``i`` at ``starts[key[i]] + rank[i]`` with

    rank[i] = #{j < i : key[j] == key[i]}

and that rank is all the dispatch plans need of the sort: an expert's copies in token order.
Where the keys are few (an expert id, a few to a few hundred) the rank is a cumulative count
over the one-hot keys (``[N, num_keys]`` int32, one ``cumsum`` that XLA runs as a tree of
reductions), with no sort, which is faster than XLA's stable sort on the layer's expert ids
(measured: docs/kernels.md, 'Layer: no loops on the device'). Above
:data:`COUNT_MAX_ELEMENTS` one-hot entries the memory would grow as ``N * num_keys``; there the
rank comes from a stable sort.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# One-hot entries (N * num_keys) up to which the rank is counted rather than sorted: 16 Mi
# int32 entries, 64 MiB (a Qwen3-like layer: 65536 copies over 128 experts is 8 Mi).
COUNT_MAX_ELEMENTS = 1 << 24

RANK_METHODS = ("count", "sort")


def stable_ranks(keys: jax.Array, num_keys: int, *, method: str | None = None) -> jax.Array:
    """``rank[i] = #{j < i : keys[j] == keys[i]}``, int32, for 1-D ``keys`` in ``[0,
    num_keys)``.

    Args:
      keys: ``[N]`` integer keys in ``[0, num_keys)``.
      num_keys: the number of distinct key values.
      method: ``"count"`` (a cumulative count over one-hot keys), ``"sort"`` (a stable
        argsort), or ``None``: count where ``N * num_keys <= COUNT_MAX_ELEMENTS``, else sort.
        Both give the same ranks.
    """
    if method is None:
        method = "count" if keys.shape[0] * num_keys <= COUNT_MAX_ELEMENTS else "sort"
    if method not in RANK_METHODS:
        raise ValueError(f"stable_ranks: method={method!r}; pass one of {RANK_METHODS} or None.")
    keys = keys.astype(jnp.int32)
    if method == "count":
        key_values = jnp.arange(num_keys, dtype=jnp.int32)[None, :]
        one_hot = (keys[:, None] == key_values).astype(jnp.int32)
        seen = jnp.cumsum(one_hot, axis=0)  # inclusive: this element counts itself
        return jnp.take_along_axis(seen, keys[:, None], axis=1)[:, 0] - 1
    num = keys.shape[0]
    order = jnp.argsort(keys, stable=True).astype(jnp.int32)  # sorted position -> element
    counts = jnp.zeros((num_keys,), jnp.int32).at[keys].add(1)
    starts = jnp.cumsum(counts) - counts
    sorted_rank = jnp.arange(num, dtype=jnp.int32) - starts[keys[order]]
    return jnp.zeros((num,), jnp.int32).at[order].set(sorted_rank, unique_indices=True)


def scatter_inverse(positions: jax.Array, size: int, sentinel: int) -> jax.Array:
    """``[size]`` int32: ``out[positions[i]] = i``, ``sentinel`` where no ``i`` lands.
    ``positions`` must be distinct where in ``[0, size)``; those outside are dropped."""
    num = positions.shape[0]
    index = jnp.arange(num, dtype=jnp.int32)
    # Out-of-range positions made distinct too, so that the scatter's indices are unique.
    inside = (positions >= 0) & (positions < size)
    distinct = jnp.where(inside, positions, size + index)
    return (
        jnp.full((size,), sentinel, jnp.int32)
        .at[distinct]
        .set(index, mode="drop", unique_indices=True)
    )
