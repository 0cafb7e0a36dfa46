"""Router losses: load balancing (Switch), per-sequence balancing (DeepSeek-V3), z-loss (ST-MoE).

Each loss is computed from partial sums (:class:`LossTerms`) so that a sharded layer can add
them over devices before finishing: the result is the one device's, to float rounding (the
counts are taken before any capacity drop, so a per-shard capacity does not change them).

**Which assignments the balancing losses count.** ``c_i`` counts the experts each token is
actually routed to (``Routing.experts``: the selection with the expert bias and the
group-limited top-k applied), before any capacity drop; ``P_i`` averages the scores
(``Routing.scores``, no bias). Megatron-Core instead counts a plain top-k of the scores (no
bias, no groups) for its auxiliary losses. The two agree without a bias and groups; with them,
jaxmoe's loss measures the load the experts really receive (what the capacity and the
expert-parallel buffers see), where a plain top-k would count assignments that never happen.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class LossTerms(NamedTuple):
    """Additive partial sums over a set of tokens (and whole sequences)."""

    counts: jax.Array  # [E] float32 assignments per expert (before any drop)
    score_sums: jax.Array  # [E] sum over tokens of scores[:, e]
    num_tokens: jax.Array  # scalar
    seq_loss_sum: jax.Array  # scalar: sum over sequences of their balancing loss
    num_sequences: jax.Array  # scalar
    z_sum: jax.Array  # scalar: sum over tokens of logsumexp(logits)^2


def _safe_divide(numerator, denominator):
    """``numerator / denominator``, and 0 where the denominator is 0 (no tokens, no sequences):
    a loss over nothing is 0, not NaN, and so is its gradient."""
    denominator = jnp.asarray(denominator, jnp.float32)
    safe = jnp.where(denominator > 0, denominator, 1.0)
    return jnp.where(denominator > 0, numerator / safe, 0.0)


def _balance(counts, score_sums, num_tokens, num_experts, top_k):
    # E / (K T) * sum_i c_i P_i with P_i = score_sums_i / T; gradient flows through P only.
    counts = jax.lax.stop_gradient(counts)
    num_tokens = jnp.asarray(num_tokens, jnp.float32)
    weighted = num_experts / top_k * jnp.sum(counts * score_sums, axis=-1)
    return _safe_divide(weighted, num_tokens * num_tokens)


def loss_terms(
    logits: jax.Array, scores: jax.Array, experts: jax.Array, num_sequences: int
) -> LossTerms:
    """Partial sums for ``num_sequences`` equal-length sequences laid out one after another.

    Args:
      logits: ``[T, E]`` float32 router logits.
      scores: ``[T, E]`` float32 per-expert probabilities (``Routing.scores``).
      experts: ``[T, K]`` chosen experts.
      num_sequences: B; T must be a multiple of it (rows are ``[B, S]`` flattened). Zero
        tokens (T = 0, or B = 0) is valid: every sum is 0.
    """
    num_tokens, num_experts = scores.shape
    top_k = experts.shape[-1]
    onehot_counts = (
        jnp.zeros((num_tokens, num_experts), jnp.float32)
        .at[jnp.arange(num_tokens)[:, None], experts]
        .add(1.0)
    )  # [T, E]; each token adds 1 per chosen expert (distinct experts)
    seq_len = num_tokens // num_sequences if num_sequences else 0
    seq_counts = onehot_counts.reshape(num_sequences, seq_len, num_experts).sum(axis=1)
    seq_scores = scores.reshape(num_sequences, seq_len, num_experts).sum(axis=1)
    seq_losses = _balance(seq_counts, seq_scores, seq_len, num_experts, top_k)  # [B]
    return LossTerms(
        counts=onehot_counts.sum(axis=0),
        score_sums=scores.sum(axis=0),
        num_tokens=jnp.asarray(num_tokens, jnp.float32),
        seq_loss_sum=seq_losses.sum(),
        num_sequences=jnp.asarray(num_sequences, jnp.float32),
        z_sum=jnp.sum(jnp.square(jax.nn.logsumexp(logits, axis=-1))),
    )


def finish_losses(terms: LossTerms, num_experts: int, top_k: int):
    """Returns ``(load_balancing_loss, seq_aux_loss, z_loss)`` from (summed) partial sums.

    * ``load_balancing_loss = E / (K T) * sum_i c_i P_i`` (1 at perfect balance), Switch/GShard;
    * ``seq_aux_loss``: the same per sequence, averaged over sequences (DeepSeek-V3);
    * ``z_loss = mean_t logsumexp(logits_t)^2`` (ST-MoE, Zoph et al. 2022).

    Each is 0 (not NaN) over zero tokens or sequences.
    """
    load_balancing = _balance(terms.counts, terms.score_sums, terms.num_tokens, num_experts, top_k)
    seq_aux = _safe_divide(terms.seq_loss_sum, terms.num_sequences)
    z_loss = _safe_divide(terms.z_sum, terms.num_tokens)
    return load_balancing, seq_aux, z_loss
