"""``MoEConfig``: every knob of an MoE layer, validated once, on construction."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from jaxmoe.field_rules import (
    LOSS_COEF,
    Flag,
    Name,
    Number,
    axis_name,
    axis_names,
    ceil_scaled,
    factor,
    fail,
    float_dtype,
    positive_int,
)
from jaxmoe.option_names import (
    ACTIVATIONS,
    CAPACITY_DROP_POLICIES,
    EP_DISPATCHES,
    EP_EXCHANGES,
    FP8_RECIPES,
    GATED_ACTIVATIONS,
    GROUPED_MATMUL_BACKENDS,
    SCORES,
)

__all__ = ["ACTIVATIONS", "GATED_ACTIVATIONS", "SCORES", "MoEConfig"]


_FIELD_RULES: dict[str, Callable[[str, Any], Any]] = {
    "num_experts": positive_int(),
    "top_k": positive_int(),
    "hidden_size": positive_int(),
    "ffn_size": positive_int(),
    "activation": Name(ACTIVATIONS, "Pick a supported activation."),
    "score": Name(SCORES, "Pick a supported score."),
    "pre_softmax": Flag("Pass pre_softmax=True or False."),
    "normalize_weights": Flag("Pass True, False, or None for the score's default.", True),
    "num_groups": positive_int(),
    "group_top_k": positive_int(optional=True),
    "routed_scaling": Number(
        float, 0, "must be a finite float > 0", "Use 1.0 for no scaling.", low_open=True
    ),
    "use_expert_bias": Flag("Pass use_expert_bias=True or False."),
    "num_shared_experts": Number(int, 0, "must be an int >= 0", "Pass 0 for no shared expert."),
    "shared_ffn_size": positive_int(optional=True),
    "shared_expert_gate": Flag("Pass shared_expert_gate=True or False."),
    "router_bias": Flag("Pass router_bias=True or False."),
    "expert_ffn_bias": Flag("Pass expert_ffn_bias=True or False."),
    "swiglu_alpha": Number(
        float, 0, "must be a finite float > 0", "gpt-oss uses swiglu_alpha=1.702.", low_open=True
    ),
    "swiglu_limit": Number(
        float, 0, "must be a finite float > 0", "gpt-oss uses swiglu_limit=7.0.", low_open=True
    ),
    "aux_loss_coef": LOSS_COEF,
    "seq_aux_loss_coef": LOSS_COEF,
    "z_loss_coef": LOSS_COEF,
    "capacity_factor": factor("Use e.g. 1.25, or None for dropless."),
    "capacity_drop_policy": Name(
        CAPACITY_DROP_POLICIES,
        "Use 'position' (the latest positions of each sequence drop first) or 'probs' (the "
        "lowest routing weights drop first).",
    ),
    "dtype": float_dtype,
    "param_dtype": float_dtype,
    "ep_axis": axis_name,
    "data_axes": axis_names,
    "grouped_matmul_backend": Name(
        GROUPED_MATMUL_BACKENDS,
        "Pick a listed name, None for the platform's best, or a backend object "
        "(e.g. jaxmoe.ops.grouped_matmul.XlaGroupedMatmul()).",
        optional=True,
        methods=("gmm", "tgmm"),
    ),
    "alignment": positive_int(optional=True),
    "ep_exchange": Name(
        EP_EXCHANGES,
        "Pick a listed name, None for the platform default, or an exchange object "
        "(a jaxmoe.parallel.Exchange).",
        optional=True,
        methods=("exchange", "check_platform"),
    ),
    "ep_receive_factor": factor("Use e.g. 2.0, or None for the dropless bound."),
    "ep_fast_slot_factor": Number(
        float,
        1,
        "must be None or a finite float >= 1 (a multiple of the balanced slot)",
        "Use e.g. 1.125, or None to always size slots for the worst case.",
        optional=True,
    ),
    "ep_chunks": positive_int(),
    "ep_dispatch": Name(
        EP_DISPATCHES,
        "Use 'auto', 'copies' (one row per token copy) or 'tokens' (one row per token and rank).",
    ),
    "ep_fp8_dispatch": Flag("Pass ep_fp8_dispatch=True or False."),
    "fsdp_expert_weights": Flag("Pass fsdp_expert_weights=True or False."),
    "fp8_recipe": Name(
        FP8_RECIPES,
        "Pick a listed recipe, a jaxmoe.ops.fp8.Fp8Recipe (e.g. Fp8Recipe('rowwise', "
        "wgrad='fp8')), or None for expert matmuls in `dtype`.",
        optional=True,
        attributes=("name", "wgrad", "lhs_blocks", "rhs_blocks"),
        kind="jaxmoe.ops.fp8.Fp8Recipe",
    ),
}

# ----------------------------------------------------------------------------- cross-field rules
# gpt-oss's clamped SwiGLU constants (its modeling code's ``alpha``, its config's ``swiglu_limit``).
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0
# The grouped-matmul backends with an FP8 path (``jaxmoe.ops.fp8``; None/"auto": on a Hopper GPU
# the Mosaic FP8 kernel where it applies, else "xla"; "pallas": that kernel, either recipe).
_FP8_BACKENDS = (None, "auto", "reference", "xla", "pallas")
# (field named in the message, broken(cfg), rule(cfg), fix(cfg)): checked in order, after every
# field passed its own rule.


def _experts_per_group(cfg) -> int:
    return cfg.num_experts // cfg.num_groups


def _per_kept_group(cfg) -> int:
    return cfg.top_k // cfg.group_top_k


# With top_k=1 a softmax after the top-k, or a normalisation, makes the one weight exactly 1: the
# task loss then gives the router no gradient. A balancing loss still trains it (through the
# scores, towards balance); the z-loss alone does not (it only pulls the logits' logsumexp to 0).
def _router_trained_by_a_balancing_loss(cfg) -> bool:
    return cfg.aux_loss_coef > 0 or cfg.seq_aux_loss_coef > 0


_BALANCING_FIX = (
    "or aux_loss_coef > 0 or seq_aux_loss_coef > 0 to train the router by the balancing loss "
    "alone (z_loss_coef alone does not train it)."
)


_CROSS_FIELD_RULES: tuple[tuple[str, Callable, Callable, Callable], ...] = (
    (
        "top_k",
        lambda c: c.top_k > c.num_experts,
        lambda c: f"must be <= num_experts ({c.num_experts})",
        lambda c: "Lower top_k or add experts.",
    ),
    (
        "pre_softmax",
        lambda c: c.pre_softmax and c.score != "softmax",
        lambda c: "only applies to score='softmax'",
        lambda c: f"Set pre_softmax=False for score={c.score!r}.",
    ),
    (
        "top_k",
        lambda c: (
            c.top_k == 1
            and c.score == "softmax"
            and not c.pre_softmax
            and not _router_trained_by_a_balancing_loss(c)
        ),
        lambda c: (
            "must not be 1 with score='softmax' after the top-k (pre_softmax=False): the one "
            "weight is softmax of one logit, always 1, so the task loss gives the router no "
            "gradient"
        ),
        lambda c: "Set pre_softmax=True, score='sigmoid', " + _BALANCING_FIX,
    ),
    (
        "normalize_weights",
        lambda c: (
            c.top_k == 1
            and (c.score != "softmax" or c.pre_softmax)
            and c.normalize_routing_weights
            and not _router_trained_by_a_balancing_loss(c)
        ),
        lambda c: (
            "must not normalise a single weight (top_k=1): it is divided by itself, always 1, "
            "so the task loss gives the router no gradient"
        ),
        lambda c: "Set normalize_weights=None or False, " + _BALANCING_FIX,
    ),
    (
        "use_expert_bias",
        lambda c: c.use_expert_bias and c.score == "softmax",
        lambda c: "needs score='sigmoid' or 'sqrtsoftplus'",
        lambda c: "Set score='sigmoid' or use_expert_bias=False.",
    ),
    (
        "num_groups",
        lambda c: c.num_experts % c.num_groups,
        lambda c: f"must divide num_experts ({c.num_experts})",
        lambda c: "Choose num_groups among the divisors of num_experts.",
    ),
    (
        "group_top_k",
        lambda c: c.group_top_k is not None and c.group_top_k > c.num_groups,
        lambda c: f"must be <= num_groups ({c.num_groups})",
        lambda c: "Lower group_top_k.",
    ),
    (
        "group_top_k",
        lambda c: c.group_top_k is not None and c.top_k % c.group_top_k,
        lambda c: f"must divide top_k ({c.top_k})",
        lambda c: "Each kept group contributes top_k / group_top_k experts to its score.",
    ),
    (
        "group_top_k",
        lambda c: c.group_top_k is not None and _per_kept_group(c) > _experts_per_group(c),
        lambda c: (
            f"top_k / group_top_k ({_per_kept_group(c)}) exceeds the experts per "
            f"group ({_experts_per_group(c)})"
        ),
        lambda c: "Keep more groups or use fewer groups.",
    ),
    (
        "shared_ffn_size",
        lambda c: c.shared_ffn_size is not None and c.num_shared_experts == 0,
        lambda c: "is set but num_shared_experts is 0",
        lambda c: "Set num_shared_experts >= 1 or shared_ffn_size=None.",
    ),
    (
        "shared_expert_gate",
        lambda c: c.shared_expert_gate and c.num_shared_experts == 0,
        lambda c: "gates the shared expert's output but num_shared_experts is 0",
        lambda c: "Set num_shared_experts >= 1 or shared_expert_gate=False.",
    ),
    (
        "swiglu_alpha",
        lambda c: c.activation != "swiglu_clamped" and c.swiglu_alpha != SWIGLU_ALPHA,
        lambda c: f"only applies to activation='swiglu_clamped' (activation={c.activation!r})",
        lambda c: f"Set activation='swiglu_clamped' or leave swiglu_alpha at {SWIGLU_ALPHA}.",
    ),
    (
        "swiglu_limit",
        lambda c: c.activation != "swiglu_clamped" and c.swiglu_limit != SWIGLU_LIMIT,
        lambda c: f"only applies to activation='swiglu_clamped' (activation={c.activation!r})",
        lambda c: f"Set activation='swiglu_clamped' or leave swiglu_limit at {SWIGLU_LIMIT}.",
    ),
    (
        "ep_chunks",
        lambda c: c.ep_chunks > 1 and c.capacity_factor is not None,
        lambda c: "must be 1 with a capacity_factor (capacity counts all of a device's tokens)",
        lambda c: "Set ep_chunks=1, or capacity_factor=None (dropless).",
    ),
    (
        "ep_dispatch",
        lambda c: (
            c.ep_dispatch == "tokens"
            and (c.capacity_factor is not None or c.ep_receive_factor is not None)
        ),
        lambda c: "'tokens' is dropless only (capacity_factor and ep_receive_factor must be None)",
        lambda c: "Use ep_dispatch='copies' with a capacity or a receive bound.",
    ),
    # FP8 rows on the expert-parallel wire (jaxmoe.parallel.fp8_wire): the recipe's activation
    # quantization moved before the exchange, so it needs a recipe and an exchange.
    (
        "ep_fp8_dispatch",
        lambda c: c.ep_fp8_dispatch and c.fp8_recipe is None,
        lambda c: "needs fp8_recipe (the FP8 rows on the wire are the experts' FP8 operand)",
        lambda c: "Set fp8_recipe='rowwise' or 'blockwise', or ep_fp8_dispatch=False.",
    ),
    (
        "ep_fp8_dispatch",
        lambda c: c.ep_fp8_dispatch and c.ep_axis is None,
        lambda c: "needs ep_axis (it changes the expert-parallel exchange only)",
        lambda c: "Set ep_axis to the mesh axis of the experts, or ep_fp8_dispatch=False.",
    ),
    (
        "ep_fp8_dispatch",
        lambda c: c.ep_fp8_dispatch and getattr(c.fp8_recipe, "wgrad", "high") == "fp8",
        lambda c: (
            "cannot run with Fp8Recipe(wgrad='fp8'): its weight gradient re-quantizes the "
            "experts' input rows from high precision, and only their FP8 copies cross the wire"
        ),
        lambda c: "Use wgrad='high' with ep_fp8_dispatch, or ep_fp8_dispatch=False.",
    ),
    (
        "data_axes",
        lambda c: c.ep_axis is not None and c.ep_axis in c.data_axes,
        lambda c: f"must not repeat ep_axis {c.ep_axis!r}",
        lambda c: "The batch is sharded over (*data_axes, ep_axis); list ep_axis once.",
    ),
    (
        "data_axes",
        lambda c: len(set(c.data_axes)) != len(c.data_axes),
        lambda c: "must not repeat an axis",
        lambda c: "List each axis once.",
    ),
    (
        "grouped_matmul_backend",
        lambda c: c.fp8_recipe is not None and c.grouped_matmul_backend not in _FP8_BACKENDS,
        lambda c: f"has no FP8 path (fp8_recipe={c.fp8_recipe!r} needs one of {_FP8_BACKENDS})",
        lambda c: "Set grouped_matmul_backend=None or 'xla', or fp8_recipe=None.",
    ),
)


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
        ``fp8_recipe`` and ``ep_axis``, not ``wgrad="fp8"``): each token quantized once before
        the exchange with the recipe's activation blocks, the FP8 rows and their float32
        scales on the wire (about half the bf16 bytes) and used by the experts as received.
        Bitwise the layer that quantizes after the exchange, forward and gradients; the
        dispatch's backward (the gradient of ``x``) and the combine stay in ``dtype``
        (:mod:`jaxmoe.parallel.fp8_wire`).
      fsdp_expert_weights: also shard expert weights over ``data_axes`` (gathered just in time).
      fp8_recipe: ``None`` (default: expert matmuls in ``dtype``), ``"rowwise"``,
        ``"blockwise"`` or an :class:`jaxmoe.ops.fp8.Fp8Recipe` (e.g. ``Fp8Recipe("rowwise",
        wgrad="fp8")``: the weight gradients in FP8 too): the routed experts' grouped matmuls
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
        # One rule per field (_FIELD_RULES), then the rules between fields (_CROSS_FIELD_RULES).
        for field, check in _FIELD_RULES.items():
            value = getattr(self, field)
            checked = check(field, value)
            if checked is not value:
                object.__setattr__(self, field, checked)
        for field, broken, rule, fix in _CROSS_FIELD_RULES:
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
