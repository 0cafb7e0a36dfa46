"""The rules of ``MoEConfig``'s fields: the kinds of rule (a number in a range, a name from a
registry, a flag, a dtype, mesh axes) and the one error they raise, the rule of each field
(:data:`FIELD_RULES`) and the rules between fields (:data:`CROSS_FIELD_RULES`), which
``MoEConfig.__post_init__`` checks in order."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from fractions import Fraction
from typing import Any, NoReturn

import jax.numpy as jnp
import numpy as np

from jaxmoe.option_names import (
    ACTIVATIONS,
    CAPACITY_DROP_POLICIES,
    EP_DISPATCHES,
    EP_EXCHANGES,
    FP8_RECIPES,
    GROUPED_MATMUL_BACKENDS,
    SCORES,
)


def ceil_scaled(factor: float, count: int, divisor: int = 1) -> int:
    """``ceil(factor * count / divisor)`` in exact arithmetic, ``factor`` taken as the decimal
    it prints as (``1.1`` is 11/10, not the nearest double, 1.1000000000000000888...): the
    size that a factor of the config (a capacity, a receive bound) describes.

    A float product rounds: ``1.1 * 200 * 6 / 8`` is ``165.00000000000003`` in float64, whose
    ceil is 166, where the capacity the factor describes is exactly 165.
    """
    return math.ceil(Fraction(repr(float(factor))) * count / divisor)


def fail(field: str, rule: str, value: Any, fix: str) -> NoReturn:
    raise ValueError(f"MoEConfig.{field}: {rule}; got {value!r}. {fix}")


# ----------------------------------------------------------------------------- one-field rules
# Each rule is called as ``rule(field, value)``: it returns the value (normalised: numpy scalars
# to Python numbers, dtypes to ``jnp.dtype``, axes to a tuple) or raises through ``fail``.


@dataclasses.dataclass(frozen=True)
class Number:
    """A number of one kind (int, or float which takes ints too; never a bool), finite, >= low."""

    kind: type
    low: float
    rule: str
    fix: str
    low_open: bool = False  # value > low rather than >= low
    optional: bool = False  # None is allowed

    def __call__(self, field: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        kind = numbers.Integral if self.kind is int else numbers.Real
        if (
            isinstance(value, kind)
            and not isinstance(value, bool)
            and (self.kind is int or fits_a_float(value))
            and (value > self.low if self.low_open else value >= self.low)
        ):
            return value if type(value) in (int, float) else self.kind(value)
        fail(field, self.rule, value, self.fix.format(field=field))


def fits_a_float(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def positive_int(optional: bool = False) -> Number:
    return Number(int, 1, "must be a positive int", "Pass {field}=<int >= 1>.", optional=optional)


def factor(fix: str) -> Number:
    """A multiplier of a size: None (no bound) or a finite float > 0."""
    return Number(float, 0, "must be None (dropless) or a float > 0", fix, True, True)


LOSS_COEF = Number(float, 0, "must be a finite float >= 0", "Pass {field}=0.0 to disable.")


@dataclasses.dataclass(frozen=True)
class Name:
    """One of ``names``; with ``methods``, also an object that has them (a configured one)."""

    names: tuple[str, ...]
    fix: str
    optional: bool = False  # None is allowed (the platform's default)
    methods: tuple[str, ...] = ()
    # A configured object with these attributes (duck-typed: config imports no ops module).
    attributes: tuple[str, ...] = ()
    kind: str = ""  # what such an object is, for the message

    def __call__(self, field: str, value: Any) -> Any:
        if (value is None and self.optional) or (isinstance(value, str) and value in self.names):
            return value
        if self.methods and not isinstance(value, str) and implements(value, self.methods):
            return value
        if self.attributes and has_attributes(value, self.attributes):
            return value
        rule = f"must be {'None or ' if self.optional else ''}one of {self.names}"
        if self.methods:
            rule += f" or a hashable object with methods {self.methods}"
        if self.attributes:
            rule += f" or a {self.kind}"
        fail(field, rule, value, self.fix)


def hashable(value: Any) -> bool:
    try:
        hash(value)  # the config is a static jit argument: every field must hash
    except TypeError:
        return False
    return True


def has_attributes(value: Any, attributes: tuple[str, ...]) -> bool:
    return (
        not isinstance(value, str)
        and hashable(value)
        and all(hasattr(value, attribute) for attribute in attributes)
    )


def implements(value: Any, methods: tuple[str, ...]) -> bool:
    return hashable(value) and all(callable(getattr(value, method, None)) for method in methods)


@dataclasses.dataclass(frozen=True)
class Flag:
    """A bool (``numpy.bool_`` too); with ``optional``, None as well."""

    fix: str
    optional: bool = False

    def __call__(self, field: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        if isinstance(value, bool | np.bool_):
            return bool(value)
        fail(field, f"must be {'None or ' if self.optional else ''}a bool", value, self.fix)


def float_dtype(field: str, value: Any) -> jnp.dtype:
    try:
        dtype = jnp.dtype(value)
    except (TypeError, ValueError):
        fail(field, "must be a dtype", value, "Use e.g. jnp.float32 or jnp.bfloat16.")
    if not jnp.issubdtype(dtype, jnp.floating):
        fix = "Use jnp.float32, jnp.bfloat16 or jnp.float16."
        fail(field, "must be a floating dtype", value, fix)
    return dtype


def axis_name(field: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    fail(field, "must be None or a mesh axis name (a str)", value, "Pass e.g. ep_axis='expert'.")


def axis_names(field: str, value: Any) -> tuple[str, ...]:
    axes = (value,) if isinstance(value, str) else value
    try:
        axes = tuple(axes)
    except TypeError:
        axes = None
    if axes is None or not all(isinstance(axis, str) for axis in axes):
        fail(
            field,
            "must be a mesh axis name or a tuple of them",
            value,
            "Pass e.g. data_axes=('data',), or () for none.",
        )
    return axes


FIELD_RULES: dict[str, Callable[[str, Any], Any]] = {
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


CROSS_FIELD_RULES: tuple[tuple[str, Callable, Callable, Callable], ...] = (
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
