"""The kinds of rule a ``MoEConfig`` field obeys (a number in a range, a name from a registry,
a flag, a dtype, mesh axes) and the one error they raise; ``config.py`` lists which field obeys
which."""

from __future__ import annotations

import dataclasses
import math
import numbers
from fractions import Fraction
from typing import Any, NoReturn

import jax.numpy as jnp
import numpy as np


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
