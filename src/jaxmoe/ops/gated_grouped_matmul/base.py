"""Shared pieces of the gated grouped matmul op: the gate activations, argument checks and the
backend interface.

A backend implements one function on already-validated arguments::

    fused(lhs [M, K], rhs_gate [G, K, F], rhs_up [G, K, F], group_sizes [G], activation,
          residuals) -> (h,) or (h, gate, up)

    gate = gmm(lhs, rhs_gate), up = gmm(lhs, rhs_up), h = act(gate) * up   ([M, F] each)

with rows at or past ``sum(group_sizes)`` zero in every output (act(0) * 0 = 0). ``residuals``
asks for ``gate`` and ``up`` as well: the derivative needs them (:mod:`.primitives`). Each
backend names the grouped matmul backend (``grouped``) that runs the derivative's products.

A backend may also fuse the gated FFN's backward through its down projection
(:mod:`.ffn_primitives`)::

    down_dgrad(out_bar [M, H], gate [M, F], up [M, F], rhs_down [G, F, H], group_sizes,
               activation) -> (gate_bar, up_bar)

    h_bar = gmm(out_bar, rhs_down^T), gate_bar = h_bar * up * act'(gate), up_bar = h_bar * act(gate)

where it applies (``down_dgrad_unsupported_reason`` is ``None``); elsewhere the derivative takes
the unfused form on ``grouped``. And, with ``fused_input_dgrad``, the input gradient of the two
projections (:mod:`.primitives`)::

    input_dgrad(gate_bar [M, F], up_bar [M, F], rhs_gate, rhs_up, group_sizes) -> [M, K]

    gmm(gate_bar, rhs_gate^T) + gmm(up_bar, rhs_up^T)

where ``input_dgrad_unsupported_reason`` is ``None``; elsewhere the two products and their sum
on ``grouped``.
"""

from __future__ import annotations

import abc
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.ops.grouped_matmul.api import resolve_backend
from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend, check_grouped_matmul_args

Array = jax.Array


def _gelu_tanh(x):
    return jax.nn.gelu(x, approximate=True)


# The nonlinearity of each gated activation (GELU is the tanh approximation).
GATE_ACTIVATIONS = {"swiglu": jax.nn.silu, "geglu": _gelu_tanh}


def check_gated_args(lhs, rhs_gate, rhs_up, group_sizes, activation) -> None:
    """Raises ValueError, naming the argument, for anything the op cannot take."""
    if activation not in GATE_ACTIVATIONS:
        raise ValueError(
            f"gated_grouped_matmul: `activation` must be one of {tuple(GATE_ACTIVATIONS)}; got "
            f"{activation!r}. Plain activations (gelu, relu) have no gate: use grouped_matmul."
        )
    if np.shape(rhs_gate) != np.shape(rhs_up):
        raise ValueError(
            f"gated_grouped_matmul: `rhs_gate` {np.shape(rhs_gate)} and `rhs_up` "
            f"{np.shape(rhs_up)} must have one shape [G, K, F]."
        )
    check_grouped_matmul_args(lhs, rhs_gate, group_sizes)
    check_grouped_matmul_args(lhs, rhs_up, group_sizes)


def check_down_args(rhs_gate, rhs_down) -> None:
    """Raises ValueError unless ``rhs_down`` is ``[G, F, H]`` for ``rhs_gate`` ``[G, K, F]``,
    in its dtype."""
    gate_shape, down_shape = np.shape(rhs_gate), np.shape(rhs_down)
    if len(down_shape) != 3 or down_shape[:2] != (gate_shape[0], gate_shape[2]):
        raise ValueError(
            f"gated_ffn: `rhs_down` must be [G, F, H] = [{gate_shape[0]}, {gate_shape[2]}, H] "
            f"for `rhs_gate` [G, K, F] = {list(gate_shape)}; got shape {down_shape}."
        )
    if jnp.result_type(rhs_down) != jnp.result_type(rhs_gate):
        raise ValueError(
            f"gated_ffn: `rhs_down` ({jnp.result_type(rhs_down)}) must have `rhs_gate`'s dtype "
            f"({jnp.result_type(rhs_gate)}); cast it (rhs_down.astype(rhs_gate.dtype))."
        )


@dataclasses.dataclass(frozen=True)
class GatedGroupedMatmulBackend(abc.ABC):
    """One implementation of ``fused`` (see the module docstring).

    Attributes:
      grouped: the grouped matmul backend of the derivative's products (and of everything a
        backend leaves to the unfused composition); ``None``: ``grouped_matmul``'s ``"auto"``.
      residuals_from_kernel: under differentiation, whether ``fused`` writes ``h``, ``gate`` and
        ``up`` in one call (``True``), or the unfused composition on ``grouped`` computes them
        (``False``: the kernel then runs only where nothing is differentiated). Either way the
        derivatives are the unfused path's; it is a speed choice (see :mod:`.primitives`).
      fused_input_dgrad: under differentiation, the input gradient of the two projections as
        one linear primitive whose evaluation is ``input_dgrad`` where it applies (``False``: the
        two transposed products, which reverse mode sums; the same value up to rounding).
    """

    grouped: GroupedMatmulBackend | None = None
    residuals_from_kernel: bool = True
    fused_input_dgrad: bool = False
    name: str = dataclasses.field(default="", init=False)

    def __post_init__(self):
        if self.grouped is None:  # frozen dataclass: fill the default in place
            object.__setattr__(self, "grouped", resolve_backend("auto"))

    @abc.abstractmethod
    def unsupported_reason(self, lhs, rhs_gate, group_sizes) -> str | None:
        """Why ``fused`` cannot take these operands (``None`` if it can); decided before
        tracing, from shapes and dtypes."""

    @abc.abstractmethod
    def fused(
        self, lhs, rhs_gate, rhs_up, group_sizes, *, activation: str, residuals: bool
    ) -> tuple[Array, ...]: ...

    def down_dgrad_unsupported_reason(self, out_bar, rhs_down, group_sizes) -> str | None:
        """Why ``down_dgrad`` cannot take these operands (``None`` if it can); decided from
        shapes and dtypes. By default a backend has no fused down dgrad."""
        del out_bar, rhs_down, group_sizes
        return f"backend {self.name!r} has no fused down-projection backward"

    def down_dgrad(
        self, out_bar, gate, up, rhs_down, group_sizes, *, activation: str
    ) -> tuple[Array, Array]:
        """``(gate_bar, up_bar)`` in one kernel (see the module docstring)."""
        raise NotImplementedError(
            self.down_dgrad_unsupported_reason(out_bar, rhs_down, group_sizes)
        )

    def input_dgrad_unsupported_reason(self, gate_bar, rhs_gate, group_sizes) -> str | None:
        """Why ``input_dgrad`` cannot take these operands (``None`` if it can); decided from
        shapes and dtypes. By default a backend has no fused input dgrad."""
        del gate_bar, rhs_gate, group_sizes
        return f"backend {self.name!r} has no fused input dgrad"

    def input_dgrad(self, gate_bar, up_bar, rhs_gate, rhs_up, group_sizes) -> Array:
        """``gmm(gate_bar, rhs_gate^T) + gmm(up_bar, rhs_up^T)`` as one op (see the module
        docstring)."""
        raise NotImplementedError(
            self.input_dgrad_unsupported_reason(gate_bar, rhs_gate, group_sizes)
        )
