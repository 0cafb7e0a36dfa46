"""Routing: scores, (group-limited) top-k selection and combine weights.

All routing math is float32. Ties in top-k go to the lower expert index (``lax.top_k``'s rule).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.config import MoEConfig
from jaxmoe.params import check_vector

# Guards the normalisations against all-zero scores (sigmoid underflow); far below any real sum.
_EPS = 1e-20


class Routing(NamedTuple):
    """The router's decision for T tokens.

    Attributes:
      weights: ``[T, K]`` float32 combine weights (after normalisation and ``routed_scaling``).
      experts: ``[T, K]`` int32 chosen experts, in selection order.
      scores: ``[T, E]`` float32 per-expert probabilities used by the balancing losses.
    """

    weights: jax.Array
    experts: jax.Array
    scores: jax.Array


@jax.custom_jvp
def normalize(values: jax.Array) -> jax.Array:
    """``values / (sum(values, -1) + 1e-20)``, with a derivative that stays finite at 0.

    Autodiff of the plain quotient forms ``(sum + 1e-20)^-2``, which overflows float32 when
    every score underflows (sigmoid of very negative logits) and turns gradients into NaN.
    The rule below, ``d out = (d v - out * sum(d v)) / (sum + 1e-20)``, is the same derivative
    without the square.
    """
    return values / (jnp.sum(values, axis=-1, keepdims=True) + _EPS)


@normalize.defjvp
def _normalize_jvp(primals, tangents):
    (values,), (dvalues,) = primals, tangents
    denominator = jnp.sum(values, axis=-1, keepdims=True) + _EPS
    out = values / denominator
    return out, (dvalues - out * jnp.sum(dvalues, axis=-1, keepdims=True)) / denominator


def router_logits(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``x[T, H] @ kernel[H, E]`` (``+ bias[E]``: ``MoEConfig.router_bias``) in float32 (router
    precision matters for selection)."""
    logits = jnp.dot(x.astype(jnp.float32), kernel.astype(jnp.float32))
    return logits if bias is None else logits + bias.astype(jnp.float32)[None, :]


def _score_fn(logits: jax.Array, score: str) -> jax.Array:
    if score == "sigmoid":
        return jax.nn.sigmoid(logits)
    if score == "sqrtsoftplus":
        # softplus underflows to 0 for very negative logits, where sqrt's derivative is infinite
        # (inf * 0 = NaN in backprop). The true derivative sigmoid / (2 sqrt(softplus)) tends to
        # 0 there, so take 0 at exactly 0 through the double-where pattern.
        softplus = jax.nn.softplus(logits)
        positive = softplus > 0
        return jnp.where(positive, jnp.sqrt(jnp.where(positive, softplus, 1.0)), 0.0)
    return jax.nn.softmax(logits, axis=-1)


def group_limited_top_k(
    selection: jax.Array, top_k: int, num_groups: int, group_top_k: int
) -> jax.Array:
    """Top-k experts restricted to the ``group_top_k`` best of ``num_groups`` contiguous groups.

    A group's score is the sum of its ``top_k // group_top_k`` largest selection scores
    (DeepSeek-V3). With ``group_top_k == num_groups`` this is plain top-k.

    Args:
      selection: ``[T, E]`` float32 selection scores.

    Returns:
      ``[T, K]`` int32 expert indices.
    """
    if group_top_k >= num_groups:
        return jax.lax.top_k(selection, top_k)[1].astype(jnp.int32)
    num_tokens, num_experts = selection.shape
    grouped = selection.reshape(num_tokens, num_groups, num_experts // num_groups)
    group_scores = jax.lax.top_k(grouped, top_k // group_top_k)[0].sum(axis=-1)  # [T, G]
    kept_groups = jax.lax.top_k(group_scores, group_top_k)[1]  # [T, group_top_k]
    group_mask = jnp.any(
        kept_groups[:, :, None] == jnp.arange(num_groups)[None, None, :], axis=1
    )  # [T, G]
    masked = jnp.where(group_mask[:, :, None], grouped, -jnp.inf).reshape(num_tokens, num_experts)
    return jax.lax.top_k(masked, top_k)[1].astype(jnp.int32)


def route(logits: jax.Array, cfg: MoEConfig, expert_bias: jax.Array | None = None) -> Routing:
    r"""Chooses ``top_k`` experts per token and their combine weights.

    * softmax, post (default): ``experts = top_k(logits)``; ``weights = softmax(logits[experts])``.
    * softmax, pre: ``p = softmax(logits)``; ``experts = top_k(p)``; ``weights = p[experts]``
      (divided by their sum if ``normalize_weights``).
    * sigmoid / sqrtsoftplus: ``s = sigmoid(logits)`` or ``sqrt(softplus(logits))``;
      ``experts = top_k(s + expert_bias)``; ``weights = s[experts]`` (no bias), divided by
      ``sum + 1e-20`` if normalising.

    Then ``weights *= routed_scaling``. With ``num_groups > 1`` the top-k is group-limited (see
    :func:`group_limited_top_k`). ``scores`` (for the losses) is ``softmax(logits)`` or
    ``s / (sum_E s + 1e-20)``. ``expert_bias`` only steers selection: it gets no gradient.

    A NaN or inf bias entry would send every token to the same experts, so it is refused:
    a concrete ``expert_bias`` (eager; or a list, NumPy array or jax array closed over by a
    jitted function) with one raises ValueError before any routing. A traced one cannot be read
    before it runs: there a non-finite entry counts as 0 (that expert is chosen by its score
    alone), so routing never collapses.

    Args:
      logits: ``[T, E]`` router logits (cast to float32).
      cfg: the layer config.
      expert_bias: ``[E]`` selection bias (an array or a list of numbers); required iff
        ``cfg.use_expert_bias``.

    Returns:
      A :class:`Routing`.

    References: Shazeer et al. 2017 (top-k gating); Fedus et al. 2021 (Switch); DeepSeek-AI 2024,
    DeepSeek-V3 (sigmoid scores, group-limited routing, bias-based balancing).
    """
    if expert_bias is not None:
        expert_bias = check_vector(
            "route: `expert_bias`", expert_bias, cfg.num_experts, integer_ok=True
        )
    logits = logits.astype(jnp.float32)
    if logits.ndim != 2 or logits.shape[-1] != cfg.num_experts:
        raise ValueError(
            f"route: `logits` must be [T, num_experts={cfg.num_experts}]; got {logits.shape}."
        )
    if cfg.use_expert_bias != (expert_bias is not None):
        raise ValueError(
            "route: `expert_bias` must be given exactly when cfg.use_expert_bias is True "
            f"(use_expert_bias={cfg.use_expert_bias}, expert_bias "
            f"{'given' if expert_bias is not None else 'missing'})."
        )
    if cfg.score == "softmax":
        probs = jax.nn.softmax(logits, axis=-1)
        selection = probs if cfg.pre_softmax else logits
        scores = probs
    else:
        # sigmoid / sqrtsoftplus; see _score_fn.
        s = _score_fn(logits, cfg.score)
        selection = s
        scores = normalize(s)
    if expert_bias is not None:
        bias = _finite_or_zero(jax.lax.stop_gradient(expert_bias.astype(jnp.float32)))
        selection = selection + bias[None, :]
    experts = group_limited_top_k(
        jax.lax.stop_gradient(selection), cfg.top_k, cfg.num_groups, cfg.effective_group_top_k
    )
    if cfg.score == "softmax" and not cfg.pre_softmax:
        weights = jax.nn.softmax(jnp.take_along_axis(logits, experts, axis=-1), axis=-1)
    else:
        base = probs if cfg.score == "softmax" else s
        weights = jnp.take_along_axis(base, experts, axis=-1)
        if cfg.normalize_routing_weights:
            weights = normalize(weights)
    weights = weights * cfg.routed_scaling
    return Routing(weights=weights, experts=experts, scores=scores)


def _finite_or_zero(values: jax.Array) -> jax.Array:
    """``values`` with every NaN and inf entry replaced by 0 (the traced-value rule above)."""
    return jnp.where(jnp.isfinite(values), values, jnp.zeros((), values.dtype))


def update_expert_bias(bias: jax.Array, tokens_per_expert: jax.Array, rate: float) -> jax.Array:
    r"""Aux-loss-free balancing step: ``bias + rate * sign(mean(c) - c)``.

    Under-loaded experts (count below the mean) get a higher selection bias, over-loaded ones a
    lower one. Apply after each training step with the step's ``MoEStats.tokens_per_expert``.

    Non-finite values: concrete arguments (eager; or lists, NumPy arrays and jax arrays closed
    over by a jitted function) are checked before tracing, and a NaN or inf ``bias`` entry,
    count or ``rate``, or a negative count or rate, raises ValueError. Traced ones cannot be
    read before they run: there a non-finite bias entry counts as 0, a negative rate as 0, a
    non-finite step (NaN/inf ``rate`` or counts) is skipped, and the result is always finite
    (an entry that overflows ``bias``'s dtype restarts at 0), so the router never receives a
    bias that collapses routing.

    Args:
      bias: ``[E]`` floating current bias (an array or a list).
      tokens_per_expert: ``[E]`` integer or floating counts (an array or a list).
      rate: the step size, a finite float ``>= 0`` (or a scalar array).

    Returns:
      The new ``[E]`` bias, in ``bias``'s dtype.

    References: Wang et al. 2024, Auxiliary-Loss-Free Load Balancing; DeepSeek-V3.
    """
    bias = check_vector("update_expert_bias: `bias`", bias, None)
    counts = check_vector(
        "update_expert_bias: `tokens_per_expert`",
        tokens_per_expert,
        bias.shape[0],
        integer_ok=True,
        nonnegative=True,
    )
    rate = _check_rate(rate)
    counts = counts.astype(jnp.float32)
    # The mean taken from the smallest count: equal counts then give a step of exactly 0 (a
    # float32 mean of equal non-integer counts can round off them, and every bias would move
    # by +rate or -rate for nothing).
    low = jnp.min(counts)
    step = _finite_or_zero(rate * jnp.sign(low + jnp.mean(counts - low) - counts))
    new = _finite_or_zero(bias.astype(jnp.float32)) + step
    return _finite_or_zero(new.astype(bias.dtype))


def _check_rate(rate) -> jax.Array | float:
    """``rate`` of ``update_expert_bias``: a finite number >= 0, checked when it is concrete."""
    if isinstance(rate, jax.core.Tracer):
        if np.shape(rate) != () or not jnp.issubdtype(rate.dtype, jnp.floating):
            raise ValueError(
                f"update_expert_bias: `rate` must be a scalar float; got a traced array of "
                f"shape {np.shape(rate)}, dtype {rate.dtype}. Pass e.g. rate=1e-3."
            )
        return jnp.maximum(rate.astype(jnp.float32), 0.0)  # NaN stays NaN: its step is skipped
    number = isinstance(rate, numbers.Real) and not isinstance(rate, bool)
    scalar_array = (
        hasattr(rate, "dtype")
        and np.shape(rate) == ()
        and (jnp.issubdtype(rate.dtype, jnp.floating) or jnp.issubdtype(rate.dtype, jnp.integer))
    )
    value = float(rate) if number or scalar_array else None
    if value is None or not math.isfinite(value) or value < 0:
        shown = repr(rate) if np.shape(rate) == () else f"an array of shape {np.shape(rate)}"
        raise ValueError(
            f"update_expert_bias: `rate` must be a finite number >= 0 (not a bool); got "
            f"{shown}. Pass e.g. rate=1e-3 (0 leaves the bias unchanged)."
        )
    return value
