"""``MoEConfig``: every knob of an MoE layer, validated once, on construction."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

SCORES = ("softmax", "sigmoid", "sqrtsoftplus")
ACTIVATIONS = ("swiglu", "geglu", "gelu", "relu")
GATED_ACTIVATIONS = ("swiglu", "geglu")


def _fail(field: str, rule: str, value: Any, fix: str) -> None:
    raise ValueError(f"MoEConfig.{field}: {rule}; got {value!r}. {fix}")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(name, "must be a positive int", value, f"Pass {name}=<int >= 1>.")


def _float_dtype(name: str, value: Any):
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        _fail(name, "must be a dtype", value, "Use e.g. jnp.float32 or jnp.bfloat16.")
    if not jnp.issubdtype(dtype, jnp.floating):
        _fail(
            name, "must be a floating dtype", value, "Use jnp.float32, jnp.bfloat16 or jnp.float16."
        )
    return dtype


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
      activation: ``"swiglu"``/``"geglu"`` (gated: ``w_gate``, ``w_up``, ``w_down``) or
        ``"gelu"``/``"relu"`` (``w_up``, ``w_down``). GELU is the tanh approximation.
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
      aux_loss_coef, seq_aux_loss_coef, z_loss_coef: weights of the router losses in
        ``MoEStats.aux_loss``.
      capacity_factor: ``None`` = dropless. Else each expert keeps its first
        ``C = ceil(capacity_factor * T * K / E)`` assignments (T = tokens of one data shard).
      dtype: compute dtype of the experts (the router always computes in float32).
      param_dtype: dtype of the parameters made by ``init_params``.
      ep_axis: mesh axis over which experts are sharded (expert parallelism).
      data_axes: mesh axes over which the batch is sharded besides ``ep_axis`` (e.g. FSDP).
      grouped_matmul_backend: backend for the expert matmuls (``None`` = best for the platform).
      alignment: rows of each expert's block in the permuted buffer are padded to a multiple of
        this (``None`` = 128 on GPU, 1 elsewhere). Padding rows are zeros and never reach the
        output.
      ep_exchange: expert-parallel exchange implementation (``None`` = best for the platform).
      ep_receive_factor: bounds each rank's expert-parallel receive buffer to
        ``ceil(ep_receive_factor * T_local * K)`` rows (``None`` = dropless worst case). Copies
        that overflow it are dropped and counted in ``MoEStats.dropped_tokens``.
      ep_fast_slot_factor: dropless expert parallelism (no capacity, no ``ep_receive_factor``)
        first sizes each (sender, receiver) slot for ``ceil(f * T_local * K / ep)`` rows, ``f``
        times the balanced share. When the fullest slot of the ep group needs more, the layer
        takes the worst-case path (slots of ``T_local * K`` rows, recomputed in backward) for
        that step: exact either way, the choice made on the device. ``None`` = always the
        worst-case path.
      ep_chunks: split each device's tokens into this many chunks, each with its own
        exchange and expert matmuls, so that XLA can overlap one chunk's all-to-all with
        another's matmuls (GPU: needs ``--xla_gpu_enable_latency_hiding_scheduler=true``).
        Needs ``capacity_factor=None``; must divide the tokens per device.
      fsdp_expert_weights: also shard expert weights over ``data_axes`` (gathered just in time).
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
    aux_loss_coef: float = 0.0
    seq_aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0
    capacity_factor: float | None = None
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
    fsdp_expert_weights: bool = False

    def __post_init__(self):
        for name in ("num_experts", "top_k", "hidden_size", "ffn_size", "num_groups"):
            _positive_int(name, getattr(self, name))
        if self.top_k > self.num_experts:
            _fail(
                "top_k",
                f"must be <= num_experts ({self.num_experts})",
                self.top_k,
                "Lower top_k or add experts.",
            )
        if self.activation not in ACTIVATIONS:
            _fail(
                "activation",
                f"must be one of {ACTIVATIONS}",
                self.activation,
                "Pick a supported activation.",
            )
        if self.score not in SCORES:
            _fail("score", f"must be one of {SCORES}", self.score, "Pick a supported score.")
        if self.pre_softmax and self.score != "softmax":
            _fail(
                "pre_softmax",
                "only applies to score='softmax'",
                self.pre_softmax,
                f"Set pre_softmax=False for score={self.score!r}.",
            )
        if self.use_expert_bias and self.score == "softmax":
            _fail(
                "use_expert_bias",
                "needs score='sigmoid' or 'sqrtsoftplus'",
                self.use_expert_bias,
                "Set score='sigmoid' or use_expert_bias=False.",
            )
        if self.num_experts % self.num_groups:
            _fail(
                "num_groups",
                f"must divide num_experts ({self.num_experts})",
                self.num_groups,
                "Choose num_groups among the divisors of num_experts.",
            )
        if self.group_top_k is not None:
            _positive_int("group_top_k", self.group_top_k)
            if self.group_top_k > self.num_groups:
                _fail(
                    "group_top_k",
                    f"must be <= num_groups ({self.num_groups})",
                    self.group_top_k,
                    "Lower group_top_k.",
                )
            if self.top_k % self.group_top_k:
                _fail(
                    "group_top_k",
                    f"must divide top_k ({self.top_k})",
                    self.group_top_k,
                    "Each kept group contributes top_k / group_top_k experts to its score.",
                )
            per_group = self.top_k // self.group_top_k
            if per_group > self.num_experts // self.num_groups:
                _fail(
                    "group_top_k",
                    f"top_k / group_top_k ({per_group}) exceeds the experts per "
                    f"group ({self.num_experts // self.num_groups})",
                    self.group_top_k,
                    "Keep more groups or use fewer groups.",
                )
        if not isinstance(self.num_shared_experts, int) or self.num_shared_experts < 0:
            _fail(
                "num_shared_experts",
                "must be an int >= 0",
                self.num_shared_experts,
                "Pass 0 for no shared expert.",
            )
        if self.shared_ffn_size is not None:
            _positive_int("shared_ffn_size", self.shared_ffn_size)
            if self.num_shared_experts == 0:
                _fail(
                    "shared_ffn_size",
                    "is set but num_shared_experts is 0",
                    self.shared_ffn_size,
                    "Set num_shared_experts >= 1 or shared_ffn_size=None.",
                )
        for name in ("aux_loss_coef", "seq_aux_loss_coef", "z_loss_coef"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                _fail(name, "must be a finite float >= 0", value, f"Pass {name}=0.0 to disable.")
        if (
            not isinstance(self.routed_scaling, int | float)
            or not math.isfinite(self.routed_scaling)
            or self.routed_scaling <= 0
        ):
            _fail(
                "routed_scaling",
                "must be a finite float > 0",
                self.routed_scaling,
                "Use 1.0 for no scaling.",
            )
        if self.capacity_factor is not None and (
            not isinstance(self.capacity_factor, int | float)
            or not math.isfinite(self.capacity_factor)
            or self.capacity_factor <= 0
        ):
            _fail(
                "capacity_factor",
                "must be None (dropless) or a float > 0",
                self.capacity_factor,
                "Use e.g. 1.25, or None for dropless.",
            )
        if self.ep_receive_factor is not None and (
            not isinstance(self.ep_receive_factor, int | float) or self.ep_receive_factor <= 0
        ):
            _fail(
                "ep_receive_factor",
                "must be None (dropless) or a float > 0",
                self.ep_receive_factor,
                "Use e.g. 2.0, or None for the dropless bound.",
            )
        if self.ep_fast_slot_factor is not None and (
            not isinstance(self.ep_fast_slot_factor, int | float)
            or isinstance(self.ep_fast_slot_factor, bool)
            or not math.isfinite(self.ep_fast_slot_factor)
            or self.ep_fast_slot_factor < 1
        ):
            _fail(
                "ep_fast_slot_factor",
                "must be None or a finite float >= 1 (a multiple of the balanced slot)",
                self.ep_fast_slot_factor,
                "Use e.g. 1.125, or None to always size slots for the worst case.",
            )
        _positive_int("ep_chunks", self.ep_chunks)
        if self.ep_chunks > 1 and self.capacity_factor is not None:
            _fail(
                "ep_chunks",
                "must be 1 with a capacity_factor (capacity counts all of a device's tokens)",
                self.ep_chunks,
                "Set ep_chunks=1, or capacity_factor=None (dropless).",
            )
        if self.alignment is not None:
            _positive_int("alignment", self.alignment)
        object.__setattr__(self, "dtype", _float_dtype("dtype", self.dtype))
        object.__setattr__(self, "param_dtype", _float_dtype("param_dtype", self.param_dtype))
        if isinstance(self.data_axes, str):
            object.__setattr__(self, "data_axes", (self.data_axes,))
        else:
            object.__setattr__(self, "data_axes", tuple(self.data_axes))
        if self.ep_axis is not None and self.ep_axis in self.data_axes:
            _fail(
                "data_axes",
                f"must not repeat ep_axis {self.ep_axis!r}",
                self.data_axes,
                "The batch is sharded over (*data_axes, ep_axis); list ep_axis once.",
            )
        if len(set(self.data_axes)) != len(self.data_axes):
            _fail("data_axes", "must not repeat an axis", self.data_axes, "List each axis once.")

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
        """Per-expert capacity C for ``num_tokens`` tokens (None when dropless)."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts)
