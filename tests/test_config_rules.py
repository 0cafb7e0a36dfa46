"""MoEConfig's rule table: every field has a rule; each rule holds over its whole range."""

from __future__ import annotations

import ast
import dataclasses
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxmoe
import jaxmoe.parallel
from jaxmoe import config, field_rules, option_names

BASE = {"num_experts": 8, "top_k": 2, "hidden_size": 16, "ffn_size": 32}
# Fields that need other fields set to be valid at all (the value under test aside).
CONTEXT = {
    "shared_ffn_size": {"num_shared_experts": 1},
    "shared_expert_gate": {"num_shared_experts": 1},
    "swiglu_alpha": {"activation": "swiglu_clamped"},
    "swiglu_limit": {"activation": "swiglu_clamped"},
    "ep_fp8_dispatch": {"fp8_recipe": "rowwise", "ep_axis": "ep"},
}

# field -> (kind, lowest valid value, lowest excluded?, None allowed?)
NUMERIC = {
    "num_experts": (int, 1, False, False),
    "top_k": (int, 1, False, False),
    "hidden_size": (int, 1, False, False),
    "ffn_size": (int, 1, False, False),
    "num_groups": (int, 1, False, False),
    "group_top_k": (int, 1, False, True),
    "num_shared_experts": (int, 0, False, False),
    "shared_ffn_size": (int, 1, False, True),
    "alignment": (int, 1, False, True),
    "ep_chunks": (int, 1, False, False),
    "routed_scaling": (float, 0.0, True, False),
    "aux_loss_coef": (float, 0.0, False, False),
    "seq_aux_loss_coef": (float, 0.0, False, False),
    "z_loss_coef": (float, 0.0, False, False),
    "capacity_factor": (float, 0.0, True, True),
    "ep_receive_factor": (float, 0.0, True, True),
    "ep_fast_slot_factor": (float, 1.0, False, True),
    "swiglu_alpha": (float, 0.0, True, False),
    "swiglu_limit": (float, 0.0, True, False),
}
NAMES = {
    "activation": option_names.ACTIVATIONS,
    "score": option_names.SCORES,
    "grouped_matmul_backend": option_names.GROUPED_MATMUL_BACKENDS,
    "ep_exchange": option_names.EP_EXCHANGES,
    "ep_dispatch": option_names.EP_DISPATCHES,
    "fp8_recipe": option_names.FP8_RECIPES,
    "capacity_drop_policy": option_names.CAPACITY_DROP_POLICIES,
}
FLAGS = (
    "pre_softmax",
    "use_expert_bias",
    "fsdp_expert_weights",
    "normalize_weights",
    "shared_expert_gate",
    "router_bias",
    "expert_ffn_bias",
    "ep_fp8_dispatch",
)
PROPERTY = settings(max_examples=40, deadline=None)


def _make(field, value, **extra):
    return jaxmoe.MoEConfig(**{**BASE, **CONTEXT.get(field, {}), **extra, field: value})


def _rejects(field, value, **extra):
    with pytest.raises(ValueError, match=rf"^MoEConfig\.{field}: .*; got .*\. \S"):
        _make(field, value, **extra)


def test_every_field_has_exactly_one_rule():
    fields = [f.name for f in dataclasses.fields(jaxmoe.MoEConfig)]
    assert list(field_rules.FIELD_RULES) == fields  # checked in declaration order
    assert set(NUMERIC) | set(NAMES) | set(FLAGS) | {"dtype", "param_dtype", "ep_axis"} | {
        "data_axes"
    } == set(fields)


# ----------------------------------------------------------------------------- numbers


def _invalid_numbers(field):
    kind, low, low_open, _ = NUMERIC[field]
    below = st.floats(max_value=low, exclude_max=not low_open, allow_nan=False)
    bad = [
        st.sampled_from([math.nan, math.inf, -math.inf, True, False, "1", [1], np.bool_(True)]),
        st.just(10**400) if kind is float else st.nothing(),  # an int no float can hold
        below if kind is float else st.integers(max_value=low - 1),
    ]
    if kind is int:  # an int field takes no float, not even a whole one
        bad.append(st.floats(min_value=low, max_value=1e6).map(lambda v: v + 0.5))
        bad.append(st.integers(low, 8).map(float))
    return st.one_of(*bad)


@pytest.mark.parametrize("field", sorted(NUMERIC))
@PROPERTY
@given(data=st.data())
def test_numeric_fields_reject_nan_inf_bool_and_out_of_range(field, data):
    _rejects(field, data.draw(_invalid_numbers(field)))


_VALID_FLOATS = {
    "routed_scaling": st.floats(1e-30, 1e30),
    "aux_loss_coef": st.floats(0, 1e30),
    "seq_aux_loss_coef": st.floats(0, 1e30),
    "z_loss_coef": st.floats(0, 1e30),
    "capacity_factor": st.floats(1e-30, 1e308),
    "ep_receive_factor": st.floats(1e-30, 1e308),
    "ep_fast_slot_factor": st.floats(1, 1e308),
    "swiglu_alpha": st.floats(1e-30, 1e30),
    "swiglu_limit": st.floats(1e-30, 1e30),
}


@pytest.mark.parametrize("field", sorted(_VALID_FLOATS))
@PROPERTY
@given(data=st.data())
def test_float_fields_take_every_finite_value_in_range(field, data):
    value = data.draw(_VALID_FLOATS[field] | st.integers(math.ceil(NUMERIC[field][1]) + 1, 100))
    assert getattr(_make(field, value), field) == value


@pytest.mark.parametrize("field", ["hidden_size", "ffn_size", "alignment", "num_shared_experts"])
@PROPERTY
@given(value=st.integers(1, 2**40))
def test_int_fields_take_every_int_in_range(field, value):
    assert getattr(_make(field, value), field) == value


@pytest.mark.parametrize("field", sorted(f for f, spec in NUMERIC.items() if spec[3]))
def test_optional_numeric_fields_take_none(field):
    assert getattr(_make(field, None), field) is None


def test_numpy_scalars_are_numbers_and_become_python_numbers():
    cfg = jaxmoe.MoEConfig(**{**BASE, "num_experts": np.int64(8)}, capacity_factor=np.float32(1.5))
    assert type(cfg.num_experts) is int and type(cfg.capacity_factor) is float
    assert cfg == jaxmoe.MoEConfig(**BASE, capacity_factor=1.5)


def test_issue_18_factors_fail_at_construction():
    for value in (math.nan, math.inf):
        _rejects("ep_receive_factor", value)
    _rejects("num_shared_experts", True)  # an int subclass, but not a count


# ----------------------------------------------------------------------------- names


@pytest.mark.parametrize("field", sorted(NAMES))
@PROPERTY
@given(name=st.text(max_size=12))
def test_name_fields_reject_unknown_names_listing_the_valid_ones(field, name):
    if name in NAMES[field]:
        return
    with pytest.raises(ValueError, match=rf"^MoEConfig\.{field}: ") as error:
        _make(field, name)
    assert repr(name) in str(error.value)
    assert all(repr(valid) in str(error.value) for valid in NAMES[field])


@pytest.mark.parametrize("field", sorted(NAMES))
def test_name_fields_take_every_listed_name(field):
    for name in NAMES[field]:
        extra = {"use_expert_bias": False}
        assert getattr(_make(field, name, **extra), field) == name


@pytest.mark.parametrize("field", sorted(NAMES))
def test_name_fields_reject_other_types(field):
    for value in (1, 1.5, True, object(), ["xla"], b"xla"):
        _rejects(field, value)


def test_backend_and_exchange_objects_are_accepted():
    backend = jaxmoe.ops.grouped_matmul.XlaGroupedMatmul()
    exchange = jaxmoe.parallel.exchange.AllGatherExchange()
    cfg = jaxmoe.MoEConfig(**BASE, grouped_matmul_backend=backend, ep_exchange=exchange)
    assert cfg.grouped_matmul_backend is backend and cfg.ep_exchange is exchange
    hash(cfg)


def test_registries_implement_exactly_the_listed_names():
    assert jaxmoe.ops.grouped_matmul.BACKEND_NAMES == option_names.GROUPED_MATMUL_BACKENDS
    assert jaxmoe.parallel.EXCHANGE_NAMES == option_names.EP_EXCHANGES
    with pytest.raises(RuntimeError, match="EP_EXCHANGES"):
        option_names.check_registry("EP_EXCHANGES", option_names.EP_EXCHANGES, ("all_to_all",))


def _jaxmoe_imports(module) -> set[str]:
    tree = ast.parse(open(module.__file__).read())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    return {name for name in imported if name.startswith("jaxmoe")}


def test_config_imports_nothing_of_jaxmoe_but_the_name_tables():
    """config.py sits below ops and parallel (they import it): it reads names from the option
    registry and its field rules from field_rules, which imports only the registry."""
    assert _jaxmoe_imports(config) == {"jaxmoe.option_names", "jaxmoe.field_rules"}
    assert _jaxmoe_imports(field_rules) == {"jaxmoe.option_names"}


# ----------------------------------------------------------------------------- flags, axes


@pytest.mark.parametrize("field", FLAGS)
def test_flags_are_bools(field):
    extra = {"score": "sigmoid"} if field == "use_expert_bias" else {}
    for value in (1, 0.0, "yes", [True]) + (() if field == "normalize_weights" else (None,)):
        _rejects(field, value, **extra)
    assert getattr(_make(field, np.bool_(True), **extra), field) is True


def test_axes_are_names():
    _rejects("ep_axis", 0)
    _rejects("data_axes", 3)
    _rejects("data_axes", ("data", 1))
    assert _make("data_axes", ["data", "fsdp"]).data_axes == ("data", "fsdp")


# ----------------------------------------------------------------------------- capacity


@PROPERTY
@given(
    factor=st.floats(1e-6, 1e308),
    num_tokens=st.integers(0, 4096),
    experts_and_k=st.integers(1, 64).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e))),
)
def test_capacity_is_the_formula_capped_at_the_tokens(factor, num_tokens, experts_and_k):
    num_experts, top_k = experts_and_k
    cfg = jaxmoe.MoEConfig(num_experts, top_k, 4, 4, pre_softmax=True, capacity_factor=factor)
    capacity = cfg.capacity(num_tokens)
    assert isinstance(capacity, int) and 0 <= capacity <= num_tokens
    # Exact: the factor as the decimal it prints as (a float product can round up past it).
    uncapped = Fraction(repr(factor)) * num_tokens * top_k / num_experts
    if uncapped < num_tokens:
        assert capacity == math.ceil(uncapped)
    else:
        assert capacity == num_tokens  # an expert receives at most one copy of each token


def test_huge_capacity_factor_sizes_for_the_tokens_that_exist():
    cfg = jaxmoe.MoEConfig(**BASE, capacity_factor=1e6)
    assert cfg.capacity(64) == 64
    assert jaxmoe.MoEConfig(**BASE, capacity_factor=1e308).capacity(2**40) == 2**40


def test_dtypes_reject_unreadable_values():
    for value in ("not-a-dtype", jnp.int32, object(), [1, 2]):
        _rejects("dtype", value)


# ----------------------------------------------------------------------------- a router to train


def _top1(**kwargs):
    return jaxmoe.MoEConfig(8, 1, 16, 32, **kwargs)


def test_top1_softmax_after_top_k_is_refused_naming_the_fixes():
    with pytest.raises(ValueError) as error:
        _top1()
    message = str(error.value)
    assert message.startswith("MoEConfig.top_k: must not be 1 with score='softmax' after the top-k")
    assert "got 1." in message and "no gradient" in message
    for fix in (
        "pre_softmax=True",
        "score='sigmoid'",
        "aux_loss_coef > 0",
        "seq_aux_loss_coef > 0",
    ):
        assert fix in message
    with pytest.raises(ValueError, match=r"^MoEConfig\.top_k: "):
        _top1(z_loss_coef=1e-3)  # the z-loss alone trains no routing


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pre_softmax": True},
        {"score": "sigmoid"},
        {"score": "sqrtsoftplus", "normalize_weights": False},
        {"aux_loss_coef": 1e-2},
        {"seq_aux_loss_coef": 1e-3},
    ],
)
def test_top1_configs_whose_router_trains_are_taken(kwargs):
    assert _top1(**kwargs).top_k == 1


@pytest.mark.parametrize(
    "kwargs", [{"score": "sigmoid"}, {"score": "sqrtsoftplus"}, {"pre_softmax": True}]
)
def test_top1_normalised_single_weight_is_refused(kwargs):
    with pytest.raises(ValueError) as error:
        _top1(normalize_weights=True, **kwargs)
    message = str(error.value)
    assert message.startswith("MoEConfig.normalize_weights: must not normalise a single weight")
    assert "got True." in message and "normalize_weights=None or False" in message
    assert _top1(normalize_weights=True, aux_loss_coef=1e-2, **kwargs).top_k == 1


def test_the_refused_routing_gives_the_router_no_task_gradient():
    """Why the rule exists: softmax of one logit is 1, so y does not depend on the router."""

    def router_grad(cfg):
        params = jaxmoe.init_params(jax.random.key(0), cfg)
        x = jax.random.normal(jax.random.key(1), (2, 5, 16))
        grads = jax.grad(lambda p: jnp.sum(jaxmoe.moe(p, x, cfg)[0] ** 2))(params)
        return np.asarray(grads["router"]["kernel"])

    # Allowed by its balancing loss, which the task loss above leaves out.
    assert np.all(router_grad(_top1(aux_loss_coef=1e-2)) == 0.0)
    assert np.any(router_grad(_top1(pre_softmax=True)) != 0.0)
    assert np.any(router_grad(_top1(score="sigmoid")) != 0.0)
