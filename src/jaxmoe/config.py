"""``MoEConfig``: every knob of an MoE layer, validated once, on construction."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from jaxmoe.field_rules import (
    CROSS_FIELD_RULES,
    FIELD_RULES,
    SWIGLU_ALPHA,
    SWIGLU_LIMIT,
    ceil_scaled,
    fail,
)
from jaxmoe.option_names import (
    ACTIVATIONS,
    GATED_ACTIVATIONS,
    SCORES,
)

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "SCORES", "MoEConfig"]


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Configuration of a Mixture-of-Experts layer (hashable: usable as a static jit argument).

    Dimension letters used in docs: T tokens, H hidden_size, F ffn_size, E num_experts, K top_k,
    G num_groups, C capacity.

    Attributes:
      num_experts: E, routed experts.
      top_k: K, experts per token, ``1 <= K <= E``.
      hidden_size: H, the model width.
      ffn_size: F, each expert's intermediate width.
      activation: ``"swiglu"``/``"geglu"``/``"swiglu_clamped"`` (gated: ``w_gate``, ``w_up``,
        ``w_down``; ``hidden = act(x @ w_gate) * (x @ w_up)``) or ``"gelu"``/``"relu"``
        (``w_up``, ``w_down``; ``hidden = act(x @ w_up)``). GELU is the tanh approximation.
        ``"swiglu_clamped"`` is gpt-oss's: with ``g = min(x @ w_gate, limit)`` and
        ``u = clip(x @ w_up, -limit, limit)``, ``hidden = (u + 1) * g * sigmoid(alpha * g)``
        (``alpha = swiglu_alpha``, ``limit = swiglu_limit``; biases, if any, added before the
        clamps). It applies to the shared expert too.
      score: router score function: ``"softmax"``, ``"sigmoid"`` or ``"sqrtsoftplus"``.
      pre_softmax: softmax only; softmax over all E first, then top-k (else top-k on logits,
        then softmax over the K chosen).
      normalize_weights: divide the K weights by their sum. ``None`` means True for
        sigmoid/sqrtsoftplus with K > 1, else False.
      num_groups, group_top_k: DeepSeek-V3 group-limited routing; experts form ``num_groups``
        contiguous groups, only the ``group_top_k`` best groups are eligible. ``None`` = no limit.
      routed_scaling: multiplies the final routing weights.
      use_expert_bias: a per-expert bias added to scores for selection only (aux-loss-free
        balancing; sigmoid/sqrtsoftplus). Update it with ``update_expert_bias``.
      num_shared_experts, shared_ffn_size: a dense FFN applied to every token, of width
        ``shared_ffn_size`` (default ``ffn_size * num_shared_experts``).
      shared_expert_gate: Qwen2-MoE's gate on the shared expert: its output is multiplied, per
        token, by ``sigmoid(x @ params["shared"]["output_gate"])`` (``[H, 1]``, no bias).
        Needs ``num_shared_experts >= 1``.
      router_bias: the router is affine, ``logits = x @ router["kernel"] + router["bias"]``
        (``[E]``, trained; gpt-oss). The biased logits are the logits everywhere: selection,
        weights and the losses. Not to be confused with ``use_expert_bias``.
      expert_ffn_bias: each routed expert's projections are affine (gpt-oss):
        ``gate = x @ w_gate[e] + b_gate[e]``, ``up = x @ w_up[e] + b_up[e]``,
        ``out = hidden @ w_down[e] + b_down[e]`` (``b_gate``/``b_up`` ``[E, F]``, ``b_down``
        ``[E, H]``, in ``params["experts"]``), so ``y = sum_k w_k * (hidden_k @ w_down + b_down)``:
        each routed copy carries its expert's down bias, scaled by its combine weight. The
        shared expert has no bias. The fused gated kernel has no bias epilogue: such a layer
        runs the unfused grouped matmuls on ``grouped_matmul_backend`` with the biases added
        in between.
      swiglu_alpha, swiglu_limit: the constants of ``activation="swiglu_clamped"`` (defaults
        gpt-oss's 1.702 and 7.0), each a float > 0; other activations take the defaults only.
      aux_loss_coef, seq_aux_loss_coef, z_loss_coef: weights of the router losses in
        ``MoEStats.aux_loss``.
      capacity_factor: ``None`` = dropless. Else each expert keeps
        ``C = min(T, ceil(capacity_factor * T * K / E))`` assignments (T = tokens of one data
        shard; computed exactly, the factor read as the decimal it prints as: 1.1 is 11/10).
      capacity_drop_policy: with a capacity, which assignments an expert over it drops
        (:mod:`jaxmoe.capacity`). ``"position"`` (default): within each sequence the latest
        positions go first, the sequences interleaved (position 0 of every sequence claims
        first, then position 1, ...), so drops spread evenly over the batch (GShard;
        Megatron-Core's ``"position"``). ``"probs"``: the lowest routing weights go first
        (Megatron-Core's default). ``"position"`` is the default because whether a token is
        kept then never depends on later positions of its sequence (``"probs"`` lets a later
        token with a larger weight evict an earlier one: information from the future that a
        causal model does not have at inference), it needs no sort, and for a single sequence
        (a 2-D ``x``) it is the token order. Dropped counts per sequence:
        ``MoEStats.dropped_tokens_per_sequence``.
      dtype: compute dtype of the experts (the router always computes in float32).
      param_dtype: dtype of the parameters made by ``init_params``.
      ep_axis: mesh axis over which experts are sharded (expert parallelism).
      data_axes: mesh axes over which the batch is sharded besides ``ep_axis`` (e.g. FSDP).
      grouped_matmul_backend: backend for the expert matmuls (``None`` = best for the platform).
      alignment: rows of each expert's block in the permuted buffer are padded to a multiple of
        this (``None``: on a GPU 64 where the bf16 experts run the Mosaic kernels of a Hopper,
        else 128; 1 elsewhere). Padding rows are zeros and never reach the output.
      ep_exchange: expert-parallel exchange implementation (``None`` = best for the platform).
      ep_receive_factor: bounds each rank's expert-parallel receive buffer to
        ``ceil(ep_receive_factor * T_local * K)`` rows (``None`` = dropless worst case). Copies
        that overflow it are dropped and counted in ``MoEStats.dropped_tokens``.
      ep_fast_slot_factor: dropless expert parallelism (no capacity, no ``ep_receive_factor``)
        sizes each (sender, receiver) slot for ``P = ceil(f * T_local * K / ep)`` rows, ``f``
        times the balanced share, and always sends them. Copies that do not fit travel in
        later windows of ``P`` rows, in a loop that runs only as often as the fullest slot of
        the ep group needs (counted in ``MoEStats.overflow_tokens``): exact and dropless
        either way, memory close to the fast slots alone. ``None`` = worst-case slots
        (``T_local * K`` rows) always.
      ep_chunks: split each device's tokens into this many chunks, each with its own
        exchange and expert matmuls, so that XLA can overlap one chunk's all-to-all with
        another's matmuls. Every chunk's fast window runs before the overflow, one loop for
        all chunks. On a GPU XLA keeps one collective in flight by default, which leaves the
        forward exchanges under no matmul: set
        ``XLA_FLAGS=--xla_gpu_experimental_parallel_collective_overlap_limit=2``
        (docs/expert-parallelism.md, "Overlapping the exchange").
        Needs ``capacity_factor=None``; must divide the tokens per device.
      ep_dispatch: what one expert-parallel exchange row holds. ``"copies"``: one row per
        (token, expert) copy. ``"tokens"``: one row per (token, destination rank) pair with
        the token's local expert ids and weights; the expert rank sums the pair's outputs
        before sending one row back (``jaxmoe.parallel.token_dispatch``; K=8 of E=32 at ep=4 sends
        2.25x fewer rows). Dropless only (no ``capacity_factor``, no ``ep_receive_factor``);
        ``ep_fast_slot_factor`` sizes its slots too. ``"auto"`` (default): ``"tokens"`` where
        the layer is dropless and its modelled cost, the exchanges' bytes on the wire plus its
        extra local work (5.4 rows per token, fitted to 2-GPU runs), is below the copies
        path's bytes (K=8 of E=32: tokens at ep 2 and 4, copies at 8; K=2 of E=8: copies),
        else ``"copies"`` (:func:`jaxmoe.parallel.layout.auto_dispatch`).
      ep_fp8_dispatch: send the expert-parallel dispatch's rows in FP8 (opt-in; needs
        ``fp8_recipe`` and ``ep_axis``, not ``wgrad="fp8"``; ``wgrad="auto"`` is ``"high"``
        there, since only the FP8 rows cross the wire): each token quantized once before
        the exchange with the recipe's activation blocks, the FP8 rows and their float32
        scales on the wire (about half the bf16 bytes) and used by the experts as received.
        Bitwise the layer that quantizes after the exchange, forward and gradients; the
        dispatch's backward (the gradient of ``x``) and the combine stay in ``dtype``
        (:mod:`jaxmoe.parallel.fp8_wire`).
      fsdp_expert_weights: also shard expert weights over ``data_axes`` (gathered just in time).
      fp8_recipe: ``None`` (default: expert matmuls in ``dtype``), ``"rowwise"``,
        ``"blockwise"`` or an :class:`jaxmoe.ops.fp8.Fp8Recipe` (e.g. ``Fp8Recipe("rowwise",
        wgrad="fp8")``: the weight gradients in FP8 too; the default ``wgrad="auto"`` runs
        them in FP8 where that is faster): the routed experts' grouped matmuls
        run in FP8 (e4m3) with that scaling recipe
        (:func:`jaxmoe.ops.fp8.fp8_grouped_matmul`); master weights and their
        gradients stay in ``param_dtype``, the router, losses, combine and shared expert are
        unchanged. Needs ``grouped_matmul_backend`` None/``"auto"`` (on a Hopper GPU the
        Mosaic GPU FP8 kernel where it applies, else ``"xla"``), ``"xla"``, ``"reference"``, or
        ``"pallas"`` (that kernel only, both recipes; shapes it cannot tile raise
        ``NotImplementedError``).
    """

    num_experts: int
    top_k: int
    hidden_size: int
    ffn_size: int
    activation: str = "swiglu"
    score: str = "softmax"
    pre_softmax: bool = False
    normalize_weights: bool | None = None
    num_groups: int = 1
    group_top_k: int | None = None
    routed_scaling: float = 1.0
    use_expert_bias: bool = False
    num_shared_experts: int = 0
    shared_ffn_size: int | None = None
    shared_expert_gate: bool = False
    router_bias: bool = False
    expert_ffn_bias: bool = False
    swiglu_alpha: float = SWIGLU_ALPHA
    swiglu_limit: float = SWIGLU_LIMIT
    aux_loss_coef: float = 0.0
    seq_aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0
    capacity_factor: float | None = None
    capacity_drop_policy: str = "position"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    ep_axis: str | None = None
    data_axes: tuple[str, ...] = ()
    grouped_matmul_backend: Any = None
    alignment: int | None = None
    ep_exchange: str | None = None
    ep_receive_factor: float | None = None
    ep_fast_slot_factor: float | None = 1.125
    ep_chunks: int = 1
    ep_dispatch: str = "auto"
    ep_fp8_dispatch: bool = False
    fsdp_expert_weights: bool = False
    fp8_recipe: Any = None  # str | jaxmoe.ops.fp8.Fp8Recipe | None

    def __post_init__(self):
        # One rule per field (FIELD_RULES), then the rules between fields (CROSS_FIELD_RULES).
        for field, check in FIELD_RULES.items():
            value = getattr(self, field)
            checked = check(field, value)
            if checked is not value:
                object.__setattr__(self, field, checked)
        for field, broken, rule, fix in CROSS_FIELD_RULES:
            if broken(self):
                fail(field, rule(self), getattr(self, field), fix(self))

    # Derived values, computed from the fields (never stored).

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def normalize_routing_weights(self) -> bool:
        if self.normalize_weights is not None:
            return bool(self.normalize_weights)
        return self.score in ("sigmoid", "sqrtsoftplus") and self.top_k > 1

    @property
    def effective_group_top_k(self) -> int:
        return self.num_groups if self.group_top_k is None else self.group_top_k

    @property
    def effective_shared_ffn_size(self) -> int:
        if self.num_shared_experts == 0:
            return 0
        return self.shared_ffn_size or self.ffn_size * self.num_shared_experts

    def capacity(self, num_tokens: int) -> int | None:
        """Per-expert capacity ``C = min(T, ceil(capacity_factor * T * K / E))`` (None: dropless).

        ``T = num_tokens``. Exact (:func:`ceil_scaled`): no float product rounds it up by one.
        An expert receives at most T copies (a token picks an expert at
        most once), so a larger C would only add empty buffer rows: C is capped at T, which keeps
        a large ``capacity_factor`` (e.g. 1e6) from sizing a buffer for rows that cannot exist.
        """
        if self.capacity_factor is None:
            return None
        uncapped = ceil_scaled(self.capacity_factor, num_tokens * self.top_k, self.num_experts)
        return min(num_tokens, uncapped)
