"""Independent references for the core tests: written from the contract, not from ``src/``.

Routing, layouts, capacity and losses are plain NumPy in float64 with Python loops. The dense
layer reference is written once against an array module ``xp`` so that the gradient tests can
run it through ``jax.grad`` in float64 (``jax.enable_x64``); it computes every expert on every
token and masks the result by the routing. Nothing here imports ``jaxmoe``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import jax
import numpy as np

EPS_NORMALIZE = 1e-20  # the contract's guard in "divide by (sum + 1e-20)"


# ----------------------------------------------------------------------------- elementwise


def softmax(xp, z, axis=-1):
    z = z - xp.max(z, axis=axis, keepdims=True)
    e = xp.exp(z)
    return e / xp.sum(e, axis=axis, keepdims=True)


def sigmoid(xp, z):
    return 1.0 / (1.0 + xp.exp(-z))


def sqrtsoftplus(xp, z):
    return xp.sqrt(xp.logaddexp(0.0, z))


def gelu_tanh(xp, z):
    return 0.5 * z * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))


def activation(xp, name):
    return {
        "swiglu": lambda z: z * sigmoid(xp, z),
        "geglu": lambda z: gelu_tanh(xp, z),
        "gelu": lambda z: gelu_tanh(xp, z),
        "relu": lambda z: xp.maximum(z, 0.0),
    }[name]


GATED = ("swiglu", "geglu", "swiglu_clamped")


def gated_hidden(xp, name, gate, up, clamp=None):
    """A gated FFN's hidden layer. ``"swiglu_clamped"`` (gpt-oss), ``clamp = (alpha, limit)``:
    the gate clipped from above at ``limit``, the up half to ``[-limit, limit]``, then
    ``(up + 1) * gate * sigmoid(alpha * gate)``."""
    if name != "swiglu_clamped":
        return activation(xp, name)(gate) * up
    alpha, limit = clamp
    gate = xp.minimum(gate, limit)
    up = xp.maximum(xp.minimum(up, limit), -limit)
    return (up + 1.0) * gate * sigmoid(xp, alpha * gate)


# ----------------------------------------------------------------------------- routing


class RoutingSpec(NamedTuple):
    """The routing knobs of the contract (mirrors MoEConfig fields; defaults as documented)."""

    num_experts: int
    top_k: int
    score: str = "softmax"
    pre_softmax: bool = False
    normalize_weights: bool | None = None
    num_groups: int = 1
    group_top_k: int | None = None
    routed_scaling: float = 1.0

    @classmethod
    def of(cls, cfg) -> RoutingSpec:
        return cls(**{name: getattr(cfg, name) for name in cls._fields})

    @property
    def normalize(self) -> bool:
        if self.normalize_weights is not None:
            return self.normalize_weights
        return self.score in ("sigmoid", "sqrtsoftplus") and self.top_k > 1


class RefRouting(NamedTuple):
    weights: np.ndarray  # [T, K] float64, paired with `experts`
    experts: np.ndarray  # [T, K] int, best first; ties -> lower index
    scores: np.ndarray  # [T, E] float64
    margin: float  # smallest near tie at any selection (see select_experts)


def _descending(values) -> np.ndarray:
    """Indices sorted by value, largest first; equal values keep ascending index order."""
    return np.argsort(-np.asarray(values, np.float64), kind="stable")


def _near_tie(values, order, taken: int) -> float:
    """The smallest nonzero gap between a value taken (the first ``taken`` of ``order``) and one
    left out. Exact ties are broken by index, the same in any precision; a near tie across the
    boundary is one that rounding may flip, so only those count."""
    values = np.asarray(values, np.float64)
    gaps = np.abs(values[order[:taken], None] - values[None, order[taken:]])
    gaps = gaps[gaps > 0]
    return float(gaps.min()) if gaps.size else math.inf


def score_values(xp, logits, spec: RoutingSpec):
    """``s`` (sigmoid / sqrtsoftplus) or ``p`` (softmax) over all E."""
    if spec.score == "softmax":
        return softmax(xp, logits)
    if spec.score == "sigmoid":
        return sigmoid(xp, logits)
    return sqrtsoftplus(xp, logits)


def loss_scores(xp, logits, spec: RoutingSpec):
    """``scores`` of the contract: softmax over E, or s / sum_E s."""
    s = score_values(xp, logits, spec)
    if spec.score == "softmax":
        return s
    return s / xp.sum(s, axis=-1, keepdims=True)


def select_experts(logits, spec: RoutingSpec, expert_bias=None):
    """``(experts [T, K], margin)`` by the contract's selection rule, one token at a time.

    ``margin``: the smallest nonzero gap, over the tokens and both stages (groups, then experts),
    between a score taken and one left out (``inf`` if none). Exact ties do not count (the rule
    breaks them by index). Gaps anywhere across the boundary count, not only the k-th against
    the (k+1)-th: with groups [2s - e, 2s, 2s] and one group taken, groups 1 and 2 tie exactly
    at the boundary, but group 0 is within rounding of them (a float32 sum may put it first;
    found by an unseeded hypothesis run)."""
    logits = np.asarray(logits, np.float64)
    num_tokens, num_experts = logits.shape
    s = score_values(np, logits, spec)
    if spec.score == "softmax":
        selection = s if spec.pre_softmax else logits
    else:
        selection = s + (0.0 if expert_bias is None else np.asarray(expert_bias, np.float64))
    group_top_k = spec.num_groups if spec.group_top_k is None else spec.group_top_k
    per_group = num_experts // spec.num_groups
    experts = np.zeros((num_tokens, spec.top_k), np.int64)
    margin = math.inf
    for t in range(num_tokens):
        eligible = np.ones(num_experts, bool)
        if group_top_k < spec.num_groups:
            take = spec.top_k // group_top_k
            group_scores = np.array(
                [
                    np.sort(selection[t, g * per_group : (g + 1) * per_group])[::-1][:take].sum()
                    for g in range(spec.num_groups)
                ]
            )
            order = _descending(group_scores)
            margin = min(margin, _near_tie(group_scores, order, group_top_k))
            eligible[:] = False
            for g in order[:group_top_k]:
                eligible[g * per_group : (g + 1) * per_group] = True
        candidates = np.flatnonzero(eligible)  # ascending index
        order = candidates[_descending(selection[t, candidates])]
        experts[t] = order[: spec.top_k]
        margin = min(margin, _near_tie(selection[t], order, spec.top_k))
    return experts, float(margin)


def routing_weights(xp, logits, experts, spec: RoutingSpec):
    """``[T, K]`` weights of the chosen ``experts`` (fixed ints), differentiable in logits."""
    chosen_logits = xp.take_along_axis(logits, experts, axis=-1)
    if spec.score == "softmax" and not spec.pre_softmax:
        weights = softmax(xp, chosen_logits)
    else:
        weights = xp.take_along_axis(score_values(xp, logits, spec), experts, axis=-1)
        if spec.normalize:
            eps = EPS_NORMALIZE if spec.score != "softmax" else 0.0
            weights = weights / (xp.sum(weights, axis=-1, keepdims=True) + eps)
    return weights * spec.routed_scaling


def route_reference(logits, spec: RoutingSpec, expert_bias=None) -> RefRouting:
    logits = np.asarray(logits, np.float64)
    experts, margin = select_experts(logits, spec, expert_bias)
    return RefRouting(
        weights=routing_weights(np, logits, experts, spec),
        experts=experts,
        scores=loss_scores(np, logits, spec),
        margin=margin,
    )


def sort_by_expert(experts, weights):
    """Rows of (experts, weights) reordered by expert id: compares routings whatever the K order."""
    experts, weights = np.asarray(experts), np.asarray(weights)
    order = np.argsort(experts, axis=-1, kind="stable")
    return np.take_along_axis(experts, order, -1), np.take_along_axis(weights, order, -1)


# ----------------------------------------------------------------------------- capacity & layout


def capacity(capacity_factor, num_tokens, top_k, num_experts):
    if capacity_factor is None:
        return None
    # Exact: the factor as the decimal it prints as (1.1 is 11/10), as the contract states.
    return math.ceil(Fraction(repr(float(capacity_factor))) * num_tokens * top_k / num_experts)


def claim_order(num_tokens, top_k, policy="position", sequence_length=None, weights=None):
    """The copies ``(t, j)`` in the order they claim an expert's capacity.

    "position": position s of every sequence (sequences in batch order, then j) before
    position s + 1, tokens being ``[B, S]`` (``t = b*S + s``); ``sequence_length=None`` is one
    sequence. "probs": the largest weight first, ties in the "position" order.
    """
    length = sequence_length or num_tokens
    copies = [(t, j) for t in range(num_tokens) for j in range(top_k)]
    copies.sort(key=lambda c: (c[0] % length, c[0] // length, c[1]))
    if policy == "probs":
        weights = np.asarray(weights, np.float64)
        copies.sort(key=lambda c: -weights[c])  # stable: ties keep the position order
    return copies


def kept_mask(experts, num_experts, cap, policy="position", sequence_length=None, weights=None):
    """``[T, K]`` bool: the copy survives (among the first ``cap`` of its expert to claim)."""
    experts = np.asarray(experts)
    kept = np.ones(experts.shape, bool)
    if cap is None:
        return kept
    seen = np.zeros(num_experts, np.int64)
    for t, j in claim_order(*experts.shape, policy, sequence_length, weights):
        e = experts[t, j]
        kept[t, j] = seen[e] < cap
        seen[e] += 1
    return kept


def round_up(value, multiple):
    return -(-value // multiple) * multiple


class RefLayout(NamedTuple):
    group_sizes: np.ndarray  # [E] rows of each block, padding included
    tokens_per_expert: np.ndarray  # [E] before drops
    dropped: int
    row_of: np.ndarray  # [T, K] buffer row of each copy, -1 if dropped
    row_token: np.ndarray  # [live rows] token held by each row, -1 for padding


def layout_reference(experts, num_experts, alignment=1, cap=None) -> RefLayout:
    """The expert-major buffer layout, built copy by copy."""
    experts = np.asarray(experts)
    num_tokens, top_k = experts.shape
    counts = np.bincount(experts.reshape(-1), minlength=num_experts)
    kept = kept_mask(experts, num_experts, cap)
    row_of = -np.ones((num_tokens, top_k), np.int64)
    row_token = []
    group_sizes = []
    for e in range(num_experts):
        start = len(row_token)
        for t in range(num_tokens):  # token order inside a block
            for j in range(top_k):
                if experts[t, j] == e and kept[t, j]:
                    row_of[t, j] = len(row_token)
                    row_token.append(t)
        used = len(row_token) - start
        size = round_up(used if cap is None else cap, alignment)
        row_token.extend([-1] * (size - used))
        group_sizes.append(size)
    dropped = int(np.sum(np.maximum(counts - cap, 0))) if cap is not None else 0
    return RefLayout(
        group_sizes=np.array(group_sizes),
        tokens_per_expert=counts,
        dropped=dropped,
        row_of=row_of,
        row_token=np.array(row_token, np.int64),
    )


def dispatch_matrix(layout: RefLayout, num_tokens) -> np.ndarray:
    """``D [live rows, T]``: ``dispatch(x)[:live] = D @ x``."""
    matrix = np.zeros((len(layout.row_token), num_tokens))
    for r, t in enumerate(layout.row_token):
        if t >= 0:
            matrix[r, t] = 1.0
    return matrix


def combine_matrix(layout: RefLayout, weights) -> np.ndarray:
    """``M [T, live rows]``: ``combine(buffer, w) = M @ buffer[:live]``."""
    weights = np.asarray(weights, np.float64)
    matrix = np.zeros((weights.shape[0], len(layout.row_token)))
    for t in range(weights.shape[0]):
        for j in range(weights.shape[1]):
            if layout.row_of[t, j] >= 0:
                matrix[t, layout.row_of[t, j]] += weights[t, j]
    return matrix


# ----------------------------------------------------------------------------- losses


def losses_reference(logits, experts, spec: RoutingSpec, num_sequences=1):
    """``(load_balancing, seq_aux, z_loss)`` in float64."""
    logits = np.asarray(logits, np.float64)
    num_tokens, num_experts = logits.shape
    scores = loss_scores(np, logits, spec)

    def balance(rows):
        counts = np.bincount(np.asarray(experts)[rows].reshape(-1), minlength=num_experts)
        mean_scores = scores[rows].mean(axis=0)
        return num_experts / (spec.top_k * len(rows)) * np.sum(counts * mean_scores)

    seq_len = num_tokens // num_sequences
    load_balancing = balance(np.arange(num_tokens))
    seq_aux = np.mean(
        [balance(np.arange(b * seq_len, (b + 1) * seq_len)) for b in range(num_sequences)]
    )
    lse = np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1)) + logits.max(-1)
    return load_balancing, seq_aux, np.mean(lse**2)


# ----------------------------------------------------------------------------- dense layer


def ffn(xp, x, weights, name, index=None, clamp=None):
    """One FFN; ``index`` picks an expert out of stacked ``[E, ...]`` weights. Each projection
    ``w_*`` adds its bias ``b_*`` where ``weights`` has one; ``clamp``: see ``gated_hidden``."""
    pick = (lambda w: w) if index is None else (lambda w: w[index])

    def project(z, name):
        out = z @ pick(weights["w_" + name])
        return out + pick(weights["b_" + name])[None, :] if "b_" + name in weights else out

    up = project(x, "up")
    if name in GATED:
        hidden = gated_hidden(xp, name, project(x, "gate"), up, clamp)
    else:
        hidden = activation(xp, name)(up)
    return project(hidden, "down")


def router_logits(params, x):
    """``x @ kernel`` (``+ bias`` where the router has one)."""
    logits = x @ params["router"]["kernel"]
    return logits + params["router"]["bias"][None, :] if "bias" in params["router"] else logits


def dense_moe(xp, params, x, cfg, experts, kept, loss_weights=None):
    """The whole layer on tokens ``x [T, H]`` with routing decisions fixed (``experts``, ``kept``).

    Every expert runs on every token; the output mixes them with the routing weights of the
    kept copies. Returns ``(y [T, H], aux_loss)``; ``aux_loss`` uses ``loss_weights`` =
    ``(aux_coef, seq_coef, z_coef, num_sequences)`` and counts as constants.
    """
    spec = RoutingSpec.of(cfg)
    num_tokens = x.shape[0]
    num_experts = spec.num_experts
    logits = router_logits(params, x)
    weights = routing_weights(xp, logits, experts, spec) * kept  # [T, K]
    onehot = np.asarray(experts)[:, :, None] == np.arange(num_experts)[None, None, :]  # [T, K, E]
    gates = xp.sum(weights[:, :, None] * onehot, axis=1)  # [T, E]
    clamp = (getattr(cfg, "swiglu_alpha", None), getattr(cfg, "swiglu_limit", None))
    every = xp.stack(
        [ffn(xp, x, params["experts"], cfg.activation, e, clamp) for e in range(num_experts)]
    )
    y = xp.einsum("te,teh->th", gates, xp.transpose(every, (1, 0, 2)))
    if "shared" in params:
        shared = ffn(xp, x, params["shared"], cfg.activation, clamp=clamp)
        if "output_gate" in params["shared"]:  # Qwen2-MoE: sigmoid(x @ gate) per token
            shared = shared * sigmoid(xp, x @ params["shared"]["output_gate"])
        y = y + shared
    if loss_weights is None:
        return y, 0.0
    aux_coef, seq_coef, z_coef, num_sequences = loss_weights
    scores = loss_scores(xp, logits, spec)
    counts = onehot.sum(axis=1)  # [T, E] constants: gradient flows through the scores only

    def balance(rows):
        return (
            num_experts
            / (spec.top_k * len(rows))
            * xp.sum(counts[rows].sum(0) * xp.mean(scores[rows], axis=0))
        )

    seq_len = num_tokens // num_sequences
    seq_aux = sum(balance(np.arange(b * seq_len, (b + 1) * seq_len)) for b in range(num_sequences))
    top = xp.max(logits, axis=-1, keepdims=True)
    lse = (xp.log(xp.sum(xp.exp(logits - top), axis=-1, keepdims=True)) + top)[:, 0]
    aux = (
        aux_coef * balance(np.arange(num_tokens))
        + seq_coef * seq_aux / num_sequences
        + z_coef * xp.mean(lse**2)
    )
    return y, aux


def to_f64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)
