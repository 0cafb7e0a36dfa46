r"""Token permutation: token copies sorted expert-major into a padded buffer, and back.

For T tokens with K choices each there are A = T*K assignments, numbered token-major
(``a = t*K + j``). :func:`plan_dispatch` orders them by expert, stably, so that each expert's
block keeps token order, and lays the blocks out in a buffer of R rows::

    buffer rows:  [ expert 0: its copies | pad ][ expert 1: ... | pad ] ... [ unused tail ]
                    ^ offsets[0]                ^ offsets[1]
    group_sizes[e] = padded block length (what the grouped matmul sees); rows past the blocks
    and padding rows hold zeros and are never read back.

* Dropless (default): block e holds all ``c_e`` copies, padded up to a multiple of
  ``alignment``; ``R = A + E*(alignment-1)`` rounded up to ``alignment`` (a static bound).
* Capacity C: every block has ``Cp = ceil(C / alignment) * alignment`` rows; expert e keeps its
  first ``C`` copies in token order, later ones are dropped (counted, contribute zero).

:func:`dispatch` (gather tokens into the buffer) and :func:`combine` (gather the buffer back
and sum the K copies with their weights) have custom VJPs that are each other's transposes.
Both directions are gathers (no scatter-add), so gradients are deterministic.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxmoe import debug
from jaxmoe.arrays import round_up
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


def plan_dispatch(
    experts: jax.Array, num_experts: int, *, alignment: int = 1, capacity: int | None = None
) -> DispatchPlan:
    """Plans the expert-major layout of the token copies chosen by ``experts``.

    Args:
      experts: ``[T, K]`` int32 chosen experts (distinct within a row).
      num_experts: E.
      alignment: pad each expert's block to a multiple of this many rows.
      capacity: per-expert capacity C, or ``None`` for dropless.

    Returns:
      A :class:`DispatchPlan`.
    """
    num_tokens, top_k = experts.shape
    num_assignments = num_tokens * top_k
    num_rows = buffer_rows(num_assignments, num_experts, alignment, capacity)
    flat_experts = experts.reshape(-1).astype(jnp.int32)
    # Each copy's place among its expert's copies, in token order (this defines who a capacity
    # drops): what a stable sort by expert gives, without the sort where experts are few.
    rank = stable_ranks(flat_experts, num_experts)
    tokens_per_expert = jnp.zeros((num_experts,), jnp.int32).at[flat_experts].add(1)
    if capacity is None:
        kept = tokens_per_expert
        group_sizes = round_up(kept, alignment)
    else:
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


FORWARD_MODE_REASON = (
    "forward-mode autodiff (jax.jvp, jax.jacfwd) cannot run through the token permutation: "
    "its dispatch and combine are jax.custom_vjp functions (so that their gradients are gathers "
    "by the inverse map, deterministic, rather than JAX's scatter-add), and JAX has no forward "
    "mode for a custom VJP. Use reverse mode (jax.grad, jax.vjp, jax.jacrev), jax.linearize, "
    "or forward-over-reverse (jax.hessian, jax.jvp of jax.grad), which all work."
)


def _refusing_forward_mode(name: str, function):
    """``function``, with JAX's bare error for forward mode through a custom VJP replaced by
    one that says why and what works."""

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except TypeError as error:
            if "forward-mode autodiff" not in str(error) or "custom_vjp" not in str(error):
                raise
            raise TypeError(f"jaxmoe.permutation.{name}: {FORWARD_MODE_REASON}") from error

    return wrapped


# ``values[index]`` along axis 0, zeros for out-of-range (sentinel) indices, as XLA's gather:
# where elementwise work around it (a weight, a cast, a sum over copies) fuses into it.
_gather_rows = row_gather_xla.gather_rows


@jax.custom_vjp
def permute_rows(values: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
    """``out[i] = values[index[i]]`` (zeros for out-of-range ``index``), ``index`` injective.

    ``inverse`` is the inverse map (``inverse[index[i]] = i``, out of range where no ``i``
    maps there), so the VJP is a gather too: ``grad_values = grad_out[inverse]``. No
    scatter-add in either direction, so gradients are deterministic.
    """
    return _gather_rows(values, index)


def _permute_rows_fwd(values, index, inverse):
    return _gather_rows(values, index), (index, inverse)


def _permute_rows_bwd(residuals, grad_out):
    index, inverse = residuals
    return _gather_rows(grad_out, inverse), None, None


permute_rows.defvjp(_permute_rows_fwd, _permute_rows_bwd)


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
# a weight per row). "auto" takes the kernel's scaled form on a GPU: against XLA's gather fused
# with its weight, Qwen3-like fwd+bwd 1.029x, DeepSeek-like 1.007x, the same gradients (H200,
# benchmarks/results/raw/h200-run33/call1). A module constant so the probe can compare.
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
        # The row gather op: a kernel of its own on a GPU (2x XLA's gather on the Qwen3- and
        # DeepSeek-like dispatch; their layers' forward 1.04x and 1.02x, H200
        # benchmarks/results/raw/h200-run32/call4).
        rows = row_gather.gather_rows(tokens, token)
    else:
        row_weight = _gather_rows(weights.reshape(-1), row_assignment)
        rows = row_gather.gather_rows(
            tokens, token, row_scale=row_weight, backend=WEIGHTED_SPREAD_BACKEND
        )
    return debug.poison_rows(rows, live_rows)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _dispatch(x, row_assignment, assignment_row, live_rows, top_k):
    return _spread(x, row_assignment, live_rows, top_k)


def _dispatch_fwd(x, row_assignment, assignment_row, live_rows, top_k):
    return _spread(x, row_assignment, live_rows, top_k), (assignment_row,)


def _dispatch_bwd(top_k, residuals, grad_buffer):
    (assignment_row,) = residuals
    # Transpose of a copy-out: each token gathers back the gradient of its K copies.
    grad_x = _sum_copies(grad_buffer, assignment_row)
    return grad_x, None, None, None


_dispatch.defvjp(_dispatch_fwd, _dispatch_bwd)


@functools.partial(_refusing_forward_mode, "dispatch")
def dispatch(x: jax.Array, plan: DispatchPlan) -> jax.Array:
    """Copies each token to its experts' rows: ``buffer[r] = x[row_assignment[r] // K]``.

    Args:
      x: ``[T, H]`` tokens.
      plan: from :func:`plan_dispatch`.

    Returns:
      ``[R, H]`` expert-major buffer. Padding rows inside blocks are zeros; rows past the blocks
      are zeros too (NaN in the ``JAXMOE_POISON`` debug mode: nothing may read them).
    """
    top_k = plan.assignment_row.shape[1]
    live_rows = jnp.sum(plan.group_sizes)
    return _dispatch(x, plan.row_assignment, plan.assignment_row, live_rows, top_k)


@jax.custom_vjp
def _combine(buffer, weights, row_assignment, assignment_row, live_rows):
    return _sum_copies(buffer, assignment_row, weights)


def _combine_fwd(buffer, weights, row_assignment, assignment_row, live_rows):
    out = _sum_copies(buffer, assignment_row, weights)
    return out, (buffer, weights, row_assignment, assignment_row, live_rows)


def _combine_bwd(residuals, grad_out):
    buffer, weights, row_assignment, assignment_row, live_rows = residuals
    top_k = weights.shape[1]
    # d buffer[r] = w[a] * d out[a // K]: a dispatch of the output gradient, weighted.
    grad_buffer = _spread(grad_out.astype(buffer.dtype), row_assignment, live_rows, top_k, weights)
    # d w[t, j] = <d out[t], buffer[assignment_row[t, j]]> (zero for dropped copies); one
    # fused gather-and-reduce per choice, like the forward.
    grad_out = grad_out.astype(jnp.float32)
    grad_weights = jnp.stack(
        [
            jnp.sum(
                grad_out * _gather_rows(buffer, assignment_row[:, choice]).astype(jnp.float32),
                axis=-1,
            )
            for choice in range(top_k)
        ],
        axis=1,
    ).astype(weights.dtype)
    return grad_buffer, grad_weights, None, None, None


_combine.defvjp(_combine_fwd, _combine_bwd)


@functools.partial(_refusing_forward_mode, "combine")
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
    live_rows = jnp.sum(plan.group_sizes)
    return _combine(buffer, weights, plan.row_assignment, plan.assignment_row, live_rows)
