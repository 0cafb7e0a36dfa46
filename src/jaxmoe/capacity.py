r"""Capacity drops: which copies a per-expert capacity keeps.

``C = min(T, ceil(capacity_factor * T * K / E))`` (:meth:`jaxmoe.MoEConfig.capacity`, exact).
Expert ``e`` keeps the ``C`` copies that claim its slots first; the drop policy
(``MoEConfig.capacity_drop_policy``) fixes that claim order (:func:`claim_ranks`):

* ``"position"``: earlier positions of a sequence claim first, the sequences of a batch
  interleaved: position 0 of every sequence (in batch order), then position 1, ... So the
  latest positions of every sequence drop first, spread over the batch (GShard; Megatron-Core's
  ``"position"`` on its ``[S, B]`` token order). Whether a token is kept depends only on the
  tokens at earlier positions (and on earlier sequences at its own position), never on later
  positions of its own sequence.
* ``"probs"``: the copies of the largest routing weight claim first (Megatron-Core's default);
  equal weights in the ``"position"`` order. A NaN weight claims last.

References: Lepikhin et al. 2020 (GShard); Fedus et al. 2021 (Switch); Riquelme et al. 2021
(V-MoE, batch prioritized routing); NVIDIA Megatron-Core ``moe_token_drop_policy``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.option_names import CAPACITY_DROP_POLICIES
from jaxmoe.ranks import stable_ranks

DROP_POLICIES = CAPACITY_DROP_POLICIES


def check_drop_policy(where: str, policy, weights) -> None:
    """Raises ValueError for an unknown ``policy`` or ``"probs"`` without ``weights``."""
    if policy not in DROP_POLICIES:
        raise ValueError(
            f"{where}: `drop_policy` must be one of {DROP_POLICIES}; got {policy!r}. "
            "Pick 'position' (latest positions drop first) or 'probs' (lowest weights first)."
        )
    if policy == "probs" and weights is None:
        raise ValueError(
            f"{where}: drop_policy='probs' ranks copies by their routing weights; pass "
            "`routing_weights` ([T, K], the combine weights)."
        )


def _position_major(values: jax.Array, sequence_length: int) -> jax.Array:
    """``[B*S, K] -> [S*B*K]``: the rows of ``[B, S]`` token order in ``[S, B]`` order."""
    num_tokens, top_k = values.shape
    sequences = max(num_tokens // sequence_length, 1) if sequence_length else 1
    shaped = values.reshape(sequences, num_tokens // sequences, top_k)
    return jnp.swapaxes(shaped, 0, 1).reshape(-1)


def _token_major(values: jax.Array, shape: tuple[int, int], sequence_length: int) -> jax.Array:
    """The inverse of :func:`_position_major`: ``[S*B*K] -> [B*S, K]``."""
    num_tokens, top_k = shape
    sequences = max(num_tokens // sequence_length, 1) if sequence_length else 1
    shaped = values.reshape(num_tokens // sequences, sequences, top_k)
    return jnp.swapaxes(shaped, 0, 1).reshape(num_tokens, top_k)


def claim_ranks(
    experts: jax.Array,
    num_experts: int,
    *,
    drop_policy: str = "position",
    sequence_length: int | None = None,
    weights: jax.Array | None = None,
) -> jax.Array:
    """Each copy's place among its expert's copies in claim order: a capacity ``C`` keeps the
    copies of rank ``< C``.

    Args:
      experts: ``[T, K]`` int32 chosen experts, tokens in ``[B, S]`` order (``T = B * S``).
      num_experts: E.
      drop_policy: ``"position"`` or ``"probs"`` (module docstring).
      sequence_length: S; ``None``: the T tokens are one sequence (then ``"position"`` is
        token order). Must divide T.
      weights: ``[T, K]`` routing weights, for ``"probs"`` (no gradient flows through ranks).

    Returns:
      ``[T, K]`` int32 ranks, ``0 .. count_e - 1`` over the copies of each expert ``e``.
    """
    check_drop_policy("claim_ranks", drop_policy, weights)
    num_tokens = experts.shape[0]
    sequence_length = num_tokens if sequence_length is None else sequence_length
    if sequence_length < 0 or (
        num_tokens and (not sequence_length or num_tokens % sequence_length)
    ):
        raise ValueError(
            f"claim_ranks: `sequence_length` ({sequence_length}) must divide the tokens "
            f"({num_tokens}); the tokens are [B, S] sequences laid out one after another."
        )
    keys = _position_major(experts.astype(jnp.int32), sequence_length)
    if drop_policy == "position":
        ranks = stable_ranks(keys, num_experts)
    else:
        # Largest weight first; a stable sort keeps the position order among equal weights.
        scores = _position_major(
            jax.lax.stop_gradient(weights).astype(jnp.float32), sequence_length
        )
        order = jnp.argsort(-scores, stable=True).astype(jnp.int32)
        in_order = stable_ranks(keys[order], num_experts)
        ranks = jnp.zeros_like(in_order).at[order].set(in_order, unique_indices=True)
    return _token_major(ranks, experts.shape, sequence_length)
