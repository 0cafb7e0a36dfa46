r"""Token permutation: token copies sorted expert-major into a padded buffer, and back.

For T tokens with K choices each there are A = T*K assignments, numbered token-major
(``a = t*K + j``). :func:`plan_dispatch` orders them by expert, stably, so that each expert's
block keeps token order (with a capacity: claim order, below), and lays the blocks out in a
buffer of R rows::

    buffer rows:  [ expert 0: its copies | pad ][ expert 1: ... | pad ] ... [ unused tail ]
                    ^ offsets[0]                ^ offsets[1]
    group_sizes[e] = padded block length (what the grouped matmul sees); rows past the blocks
    and padding rows hold zeros and are never read back.

* Dropless (default): block e holds all ``c_e`` copies, padded up to a multiple of
  ``alignment``; ``R = A + E*(alignment-1)`` rounded up to ``alignment`` (a static bound).
* Capacity C: every block has ``Cp = ceil(C / alignment) * alignment`` rows; expert e keeps the
  first ``C`` copies in claim order (:mod:`jaxmoe.capacity`: by position within the sequence,
  or by routing weight; token order for one sequence), laid out in that order; the others are
  dropped (counted, contribute zero).

:func:`dispatch` (gather tokens into the buffer) and :func:`combine` (gather the buffer back
and sum the K copies with their weights) are each other's transposes, given as such
(:func:`jaxmoe.multilinear.multilinear`; the combine is bilinear in the buffer and the weights).
Both directions are gathers (no scatter-add), so gradients are deterministic; forward mode
applies the same gathers to the tangents.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe import debug
from jaxmoe.argument_checks import as_array, concrete_value, describe, round_up
from jaxmoe.capacity import claim_ranks
from jaxmoe.multilinear import multilinear
from jaxmoe.ops import row_gather
from jaxmoe.ops.row_gather import xla as row_gather_xla
from jaxmoe.ranks import scatter_inverse, stable_ranks


class DispatchPlan(NamedTuple):
    """Where every token copy goes. All int32, all on device.

    Attributes:
      row_assignment: ``[R]`` the assignment ``a = t*K + j`` held by each buffer row, or ``A``
        (an out-of-range sentinel) for padding and unused rows.
      assignment_row: ``[T, K]`` the buffer row of each assignment, or ``R`` if dropped.
      group_sizes: ``[E]`` rows of each expert's block (padding included).
      tokens_per_expert: ``[E]`` assignments routed to each expert, before any drop.
      dropped: scalar, assignments dropped by the capacity.
    """

    row_assignment: jax.Array
    assignment_row: jax.Array
    group_sizes: jax.Array
    tokens_per_expert: jax.Array
    dropped: jax.Array

    @property
    def num_rows(self) -> int:
        return self.row_assignment.shape[0]

    @property
    def dropped_per_token(self) -> jax.Array:
        """``[T]`` int32: each token's copies that hold no row of this buffer (dropped)."""
        return jnp.sum(self.assignment_row >= self.num_rows, axis=1, dtype=jnp.int32)


def capacity_block_rows(capacity: int | None, alignment: int) -> int | None:
    """Rows of every expert block in capacity mode (``Cp``), or None when dropless."""
    return None if capacity is None else round_up(capacity, alignment)


def buffer_rows(
    num_assignments: int, num_experts: int, alignment: int, capacity: int | None
) -> int:
    """R, the static number of rows of the permuted buffer (see the module docstring)."""
    if capacity is not None:
        return num_experts * capacity_block_rows(capacity, alignment)
    if alignment == 1:
        return num_assignments
    return round_up(num_assignments + num_experts * (alignment - 1), alignment)


# Argument checks of the public entry points, in Python before anything is traced. Shapes,
# dtypes and the static counts are always checked; the expert ids' values (range, distinct
# within a token) only where they are concrete. A traced ``experts`` (under ``jit``, ``grad``,
# ``vmap``) cannot be checked without a host round trip: its ids must come from a top-k over
# ``num_experts`` scores (as the router's do), and any other ids give an unspecified plan.


def _check_count(value, name: str, where: str, low: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{where}: `{name}` must be an int; got {describe(value)}. {fix}")
    if value < low:
        raise ValueError(f"{where}: `{name}` must be an int >= {low}; got {value}. {fix}")


def _check_plan_args(experts, num_experts, alignment, capacity) -> jax.Array:
    where = "plan_dispatch"
    experts = as_array(experts, "experts", where)
    _check_count(num_experts, "num_experts", where, 1, "Pass the number of routed experts E.")
    _check_count(alignment, "alignment", where, 1, "Pass 1 for no padding.")
    if capacity is not None:
        _check_count(capacity, "capacity", where, 0, "Pass None for dropless.")
    if experts.ndim != 2 or not jnp.issubdtype(experts.dtype, jnp.integer):
        raise ValueError(
            f"{where}: `experts` must be a 2-D integer array [T, K] of expert ids; got "
            f"{experts.dtype} of shape {experts.shape}. Pass the router's top-k indices, e.g. "
            "routing.experts, or experts.astype(jnp.int32)."
        )
    top_k = experts.shape[1]
    if top_k > num_experts:
        raise ValueError(
            f"{where}: `experts` has K={top_k} choices per token but there are only "
            f"num_experts={num_experts}; a token's experts are distinct, so K <= E."
        )
    ids = concrete_value(experts)
    if ids is None or ids.size == 0:
        return experts
    outside = (ids < 0) | (ids >= num_experts)
    if outside.any():
        token, choice = (int(i[0]) for i in np.nonzero(outside))
        raise ValueError(
            f"{where}: `experts` must hold ids in [0, num_experts={num_experts}); got "
            f"{ids[token, choice]} at [{token}, {choice}] ({int(outside.sum())} of {ids.size} "
            "out of range). Negative ids do not count from the end."
        )
    ordered = np.sort(ids, axis=1)
    repeated = ordered[:, 1:] == ordered[:, :-1]
    if repeated.any():
        token = int(np.nonzero(repeated.any(axis=1))[0][0])
        raise ValueError(
            f"{where}: `experts` must be distinct within each token; token {token} picks "
            f"{ids[token].tolist()}. Take the experts from a top-k (each at most once)."
        )
    return experts


def _check_plan(plan, where: str) -> None:
    if not isinstance(plan, DispatchPlan):
        raise TypeError(
            f"{where}: `plan` must be a DispatchPlan from plan_dispatch; got {describe(plan)}."
        )


def _check_rows(value, name: str, rows: int, what: str, where: str) -> jax.Array:
    """``value`` as a 2-D array of ``rows`` rows (``what`` says where that count comes from)."""
    value = as_array(value, name, where)
    if value.ndim != 2 or value.shape[0] != rows:
        raise ValueError(
            f"{where}: `{name}` must be 2-D with {rows} rows ({what}); got shape "
            f"{value.shape}. Pass the array the plan was made for."
        )
    return value


def plan_dispatch(
    experts: jax.Array,
    num_experts: int,
    *,
    alignment: int = 1,
    capacity: int | None = None,
    drop_policy: str = "position",
    sequence_length: int | None = None,
    weights: jax.Array | None = None,
) -> DispatchPlan:
    """Plans the expert-major layout of the token copies chosen by ``experts``.

    Args:
      experts: ``[T, K]`` integer chosen experts, in ``[0, num_experts)`` and distinct within
        a row (``ValueError`` otherwise where ``experts`` is concrete; traced ids are not
        checked, and ids other than a top-k's give an unspecified plan).
      num_experts: E, an int >= 1.
      alignment: pad each expert's block to a multiple of this many rows (an int >= 1).
      capacity: per-expert capacity C (an int >= 0), or ``None`` for dropless.
      drop_policy, sequence_length, weights: with a capacity, the order in which copies claim
        an expert's C rows (:func:`jaxmoe.capacity.claim_ranks`): ``"position"`` (default;
        with ``sequence_length=None`` the T tokens are one sequence: token order) or
        ``"probs"`` (largest of ``weights [T, K]`` first).

    Returns:
      A :class:`DispatchPlan`.
    """
    experts = _check_plan_args(experts, num_experts, alignment, capacity)
    num_tokens, top_k = experts.shape
    num_assignments = num_tokens * top_k
    num_rows = buffer_rows(num_assignments, num_experts, alignment, capacity)
    flat_experts = experts.reshape(-1).astype(jnp.int32)
    tokens_per_expert = jnp.zeros((num_experts,), jnp.int32).at[flat_experts].add(1)
    if capacity is None:
        # Each copy's place among its expert's copies, in token order: what a stable sort by
        # expert gives, without the sort where experts are few.
        rank = stable_ranks(flat_experts, num_experts)
        kept = tokens_per_expert
        group_sizes = round_up(kept, alignment)
    else:
        # The place in claim order (the drop policy's): the first C of each expert are kept.
        rank = claim_ranks(
            experts,
            num_experts,
            drop_policy=drop_policy,
            sequence_length=sequence_length,
            weights=weights,
        ).reshape(-1)
        kept = jnp.minimum(tokens_per_expert, capacity)
        group_sizes = jnp.full((num_experts,), round_up(capacity, alignment), jnp.int32)
    offsets = jnp.cumsum(group_sizes) - group_sizes  # first buffer row of each block

    # Assignment -> buffer row (R where dropped); buffer row -> assignment is its inverse.
    assignment_row = jnp.where(
        rank < kept[flat_experts], offsets[flat_experts] + rank, num_rows
    ).astype(jnp.int32)
    row_assignment = scatter_inverse(assignment_row, num_rows, sentinel=num_assignments)
    return DispatchPlan(
        row_assignment=row_assignment,
        assignment_row=assignment_row.reshape(num_tokens, top_k),
        group_sizes=group_sizes.astype(jnp.int32),
        tokens_per_expert=tokens_per_expert,
        dropped=jnp.sum(tokens_per_expert - kept).astype(jnp.int32),
    )


# ``values[index]`` along axis 0, zeros for out-of-range (sentinel) indices, as XLA's gather:
# where elementwise work around it (a weight, a cast, a sum over copies) fuses into it.
_gather_rows = row_gather_xla.gather_rows


def _gather_by_index(values, index, inverse):
    return _gather_rows(values, index)


def _gather_by_inverse(grad_out, index, inverse):
    return _gather_rows(grad_out, inverse)


def permute_rows(values: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
    """``out[i] = values[index[i]]`` (zeros for out-of-range ``index``), ``index`` injective.

    ``inverse`` is the inverse map (``inverse[index[i]] = i``, out of range where no ``i``
    maps there), so the transpose is a gather too: ``grad_values = grad_out[inverse]``. No
    scatter-add in either direction, so gradients are deterministic; forward mode gathers the
    tangent by ``index``.
    """
    out = jax.ShapeDtypeStruct((index.shape[0], *values.shape[1:]), values.dtype)
    return multilinear(
        _gather_by_index, (_gather_by_inverse,), ((values,),), (index, inverse), out=out
    )


def _sum_copies(values: jax.Array, assignment_row: jax.Array, weights=None) -> jax.Array:
    """``out[t] = sum_j w[t, j] * values[assignment_row[t, j]]``, accumulated in float32.

    A static loop over the K choices: each step is one gather fused with a multiply-add, so
    the ``[T, K, H]`` stack of copies is never materialised (K is small).
    """
    out = jnp.zeros((assignment_row.shape[0], values.shape[-1]), jnp.float32)
    for choice in range(assignment_row.shape[1]):
        copy = _gather_rows(values, assignment_row[:, choice]).astype(jnp.float32)
        if weights is not None:
            copy = copy * weights[:, choice, None].astype(jnp.float32)
        out = out + copy
    return out if weights is not None else out.astype(values.dtype)


# The row gather backend of the weighted spread (the combine's backward: the output gradient,
# a weight per row). "auto" takes the kernel's scaled form on a GPU, faster than XLA's gather
# fused with its weight (docs/kernels.md, 'Row gather'). A module constant so a benchmark can
# compare the two.
WEIGHTED_SPREAD_BACKEND = "auto"


def _spread(tokens, row_assignment, live_rows, top_k, weights=None):
    """``buffer[r] = w[a] * tokens[a // K]`` for each row holding assignment ``a``; zeros else.

    Rows at or past ``live_rows`` (outside every expert block) are never read by anything
    downstream; the ``JAXMOE_POISON`` debug mode fills them with NaN to prove it. Padding rows
    inside a block stay zero: they enter the weight-gradient contraction, where 0 is exact.
    """
    # The sentinel a = T*K maps to token T: out of range, so the gather fills zeros.
    token = row_assignment // top_k
    if weights is None:
        # The row gather op: a kernel of its own on a GPU, about twice XLA's gather on the
        # layer's dispatch (docs/kernels.md, 'Row gather').
        rows = row_gather.gather_rows(tokens, token)
    else:
        row_weight = _gather_rows(weights.reshape(-1), row_assignment)
        rows = row_gather.gather_rows(
            tokens, token, row_scale=row_weight, backend=WEIGHTED_SPREAD_BACKEND
        )
    return debug.poison_rows(rows, live_rows)


def _dispatch_rows(x, row_assignment, assignment_row, live_rows, *, top_k):
    return _spread(x, row_assignment, live_rows, top_k)


def _dispatch_transpose(grad_buffer, row_assignment, assignment_row, live_rows, *, top_k):
    # Transpose of a copy-out: each token gathers back the gradient of its K copies.
    return _sum_copies(grad_buffer, assignment_row)


def dispatch(x: jax.Array, plan: DispatchPlan) -> jax.Array:
    """Copies each token to its experts' rows: ``buffer[r] = x[row_assignment[r] // K]``.

    Args:
      x: ``[T, H]`` tokens.
      plan: from :func:`plan_dispatch`.

    Returns:
      ``[R, H]`` expert-major buffer. Padding rows inside blocks are zeros; rows past the blocks
      are zeros too (NaN in the ``JAXMOE_POISON`` debug mode: nothing may read them).
    """
    _check_plan(plan, "dispatch")
    num_tokens, top_k = plan.assignment_row.shape
    x = _check_rows(x, "x", num_tokens, "the plan's tokens T", "dispatch")
    live_rows = jnp.sum(plan.group_sizes)
    out = jax.ShapeDtypeStruct((plan.num_rows, x.shape[1]), x.dtype)
    return multilinear(
        _dispatch_rows,
        (_dispatch_transpose,),
        ((x,),),
        (plan.row_assignment, plan.assignment_row, live_rows),
        out=out,
        top_k=top_k,
    )


# The combine is bilinear in (buffer, weights): a multilinear map with one transpose per factor,
# each one half of the combine's backward, so forward mode is the same sum on the tangents.


def _combine_rows(buffer, weights, row_assignment, assignment_row, live_rows, **dtypes):
    return _sum_copies(buffer, assignment_row, weights)


def _combine_buffer_transpose(
    grad_out, weights, row_assignment, assignment_row, live_rows, *, buffer_dtype, weights_dtype
):
    # d buffer[r] = w[a] * d out[a // K]: a dispatch of the output gradient, weighted.
    top_k = weights.shape[1]
    return _spread(grad_out.astype(buffer_dtype), row_assignment, live_rows, top_k, weights)


def _combine_weights_transpose(
    grad_out, buffer, row_assignment, assignment_row, live_rows, *, buffer_dtype, weights_dtype
):
    del row_assignment, live_rows, buffer_dtype
    # d w[t, j] = <d out[t], buffer[assignment_row[t, j]]> (zero for dropped copies); one
    # fused gather-and-reduce per choice, like the forward.
    grad_out = grad_out.astype(jnp.float32)
    return jnp.stack(
        [
            jnp.sum(
                grad_out * _gather_rows(buffer, assignment_row[:, choice]).astype(jnp.float32),
                axis=-1,
            )
            for choice in range(assignment_row.shape[1])
        ],
        axis=1,
    ).astype(weights_dtype)


def combine(buffer: jax.Array, weights: jax.Array, plan: DispatchPlan) -> jax.Array:
    """Sums each token's K expert outputs: ``y[t] = sum_j weights[t, j] * buffer[row(t, j)]``.

    Dropped copies contribute zero. Accumulates in float32 and returns float32; the caller
    casts. Only rows that hold a copy are read.

    Args:
      buffer: ``[R, H]`` expert outputs in the plan's layout.
      weights: ``[T, K]`` combine weights.
      plan: from :func:`plan_dispatch`.

    Returns:
      ``[T, H]`` float32.
    """
    _check_plan(plan, "combine")
    buffer = _check_rows(buffer, "buffer", plan.num_rows, "the plan's buffer rows R", "combine")
    weights = as_array(weights, "weights", "combine")
    if weights.shape != plan.assignment_row.shape or not jnp.issubdtype(
        weights.dtype, jnp.floating
    ):
        raise ValueError(
            f"combine: `weights` must be a float array [T, K] = {plan.assignment_row.shape} "
            f"(one per token copy of the plan); got {weights.dtype} of shape {weights.shape}."
        )
    live_rows = jnp.sum(plan.group_sizes)
    out = jax.ShapeDtypeStruct((weights.shape[0], buffer.shape[1]), jnp.float32)
    return multilinear(
        _combine_rows,
        (_combine_buffer_transpose, _combine_weights_transpose),
        ((buffer,), (weights,)),
        (plan.row_assignment, plan.assignment_row, live_rows),
        out=out,
        buffer_dtype=jnp.dtype(buffer.dtype),
        weights_dtype=jnp.dtype(weights.dtype),
    )
