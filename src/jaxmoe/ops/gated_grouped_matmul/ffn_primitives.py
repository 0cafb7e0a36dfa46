r"""The gated FFN ``y = gmm(act(x Wg) * (x Wu), Wd)`` as one primitive, so that its backward can
run the activation's derivative in the down projection's dgrad epilogue.

Three primitives::

    gated_ffn_p(x, Wg, Wu, Wd, group_sizes) -> y
        the op: the gated grouped matmul (:mod:`.primitives`, the backend's fused forward) then
        the down projection.

    glu_down_p(gate_dot, up_dot, gate, up, Wd, group_sizes) -> y_dot
        linear in (gate_dot, up_dot): gmm(act'(gate) gate_dot * up + act(gate) * up_dot, Wd),
        the down projection of the hidden tangent.

    glu_dgrad_p(y_bar, gate, up, Wd, group_sizes) -> (gate_bar, up_bar)
        its transpose, linear in y_bar:
        h_bar = gmm(y_bar, Wd^T);  gate_bar = h_bar * up * act'(gate);  up_bar = h_bar * act(gate)
        by ``kernel.down_dgrad`` where it applies (the Mosaic backend with ``fused_backward``:
        one kernel, the derivative in the dgrad's epilogue, ``h_bar`` never written), else the
        unfused form.

``gated_ffn_p``'s JVP is the product rule of :mod:`.primitives` with the down projection::

    (h, gate, up) = the gated forward with residuals;   y = gmm(h, Wd)
    gate_dot = gmm(x_dot, Wg) + gmm(x, Wg_dot)          up_dot = gmm(x_dot, Wu) + gmm(x, Wu_dot)
    y_dot    = glu_down(gate_dot, up_dot, gate, up, Wd) + gmm(h, Wd_dot)

so reverse mode transposes ``glu_down`` into one ``glu_dgrad``, where the unfused path runs the
down projection's dgrad, writes ``h_bar``, and reads it back with ``gate`` and ``up`` in an
elementwise pass that writes ``gate_bar`` and ``up_bar``. The two linear primitives are each
other's transposes; their JVPs in the nonlinear operands (``gate``, ``up``, ``Wd``) are those of
their unfused forms, so forward mode and every higher order are defined (and exact: they are the
unfused derivatives). Only ``glu_dgrad``'s first evaluation runs the fused kernel, whose result is
more accurate than the unfused form's (it rounds once, where the unfused form rounds ``h_bar`` and
each elementwise step to the operands' dtype).

**Batching** (``jax.vmap``): the unfused forms, batched by the grouped matmul's rule.
**shard_map**: the operands vary over the same manual axes before binding, as for the others.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxmoe.ops.gated_grouped_matmul import primitives as gated_primitives
from jaxmoe.ops.grouped_matmul import primitives as gmm_primitives

gated_ffn_p = Primitive("jaxmoe_gated_ffn")
glu_down_p = Primitive("jaxmoe_glu_down")
glu_dgrad_p = Primitive("jaxmoe_glu_dgrad")
glu_dgrad_p.multiple_results = True


def gated_ffn(lhs, rhs_gate, rhs_up, rhs_down, group_sizes, *, kernel, activation: str):
    """``[M, H]``: ``gmm(act(gmm(lhs, rhs_gate)) * gmm(lhs, rhs_up), rhs_down)``."""
    return gmm_primitives.bind_varying(
        gated_ffn_p,
        lhs,
        rhs_gate,
        rhs_up,
        rhs_down,
        group_sizes,
        kernel=kernel,
        activation=activation,
    )


def glu_down(gate_dot, up_dot, gate, up, rhs_down, group_sizes, *, kernel, activation: str):
    """``[M, H]``: the down projection of the hidden tangent (see the module docstring)."""
    return gmm_primitives.bind_varying(
        glu_down_p,
        gate_dot,
        up_dot,
        gate,
        up,
        rhs_down,
        group_sizes,
        kernel=kernel,
        activation=activation,
    )


def glu_dgrad(out_bar, gate, up, rhs_down, group_sizes, *, kernel, activation: str):
    """``(gate_bar, up_bar)``, ``[M, F]`` each: ``glu_down``'s transpose."""
    return tuple(
        gmm_primitives.bind_varying(
            glu_dgrad_p,
            out_bar,
            gate,
            up,
            rhs_down,
            group_sizes,
            kernel=kernel,
            activation=activation,
        )
    )


# --- evaluation ---------------------------------------------------------------------------------


def _ffn_call(lhs, rhs_gate, rhs_up, rhs_down, group_sizes, *, kernel, activation):
    (hidden,) = gated_primitives.gated_gmm(
        lhs, rhs_gate, rhs_up, group_sizes, kernel=kernel, activation=activation, residuals=False
    )
    return gmm_primitives.gmm(
        hidden, rhs_down, group_sizes, impl=kernel.grouped, transpose_rhs=False, out_dtype=lhs.dtype
    )


def unfused_glu_down(gate_dot, up_dot, gate, up, rhs_down, group_sizes, *, kernel, activation):
    """``glu_down`` as the unfused path computes it: the hidden tangent in ``jnp`` (act's own
    JVP), then a grouped matmul on ``kernel.grouped``."""
    hidden_dot = gated_primitives.hidden_tangent(gate, up, gate_dot, up_dot, activation)
    return gmm_primitives.gmm(
        hidden_dot,
        rhs_down,
        group_sizes,
        impl=kernel.grouped,
        transpose_rhs=False,
        out_dtype=gate.dtype,
    )


def unfused_glu_dgrad(out_bar, gate, up, rhs_down, group_sizes, *, kernel, activation):
    """What reverse mode of the unfused composition computes: the transpose of
    :func:`unfused_glu_down` in ``(gate_dot, up_dot)``."""

    def down(gate_dot, up_dot):
        return unfused_glu_down(
            gate_dot, up_dot, gate, up, rhs_down, group_sizes, kernel=kernel, activation=activation
        )

    return tuple(jax.linear_transpose(down, gate, up)(out_bar.astype(gate.dtype)))


def _glu_dgrad_call(out_bar, gate, up, rhs_down, group_sizes, *, kernel, activation):
    if kernel.down_dgrad_unsupported_reason(out_bar, rhs_down, group_sizes) is None:
        return tuple(
            kernel.down_dgrad(out_bar, gate, up, rhs_down, group_sizes, activation=activation)
        )
    return unfused_glu_dgrad(
        out_bar, gate, up, rhs_down, group_sizes, kernel=kernel, activation=activation
    )


def _ffn_abstract(lhs, rhs_gate, rhs_up, rhs_down, group_sizes, **params):
    shape = (lhs.shape[0], rhs_down.shape[2])
    return gmm_primitives.out_aval(lhs, shape, lhs.dtype, leading_from_like=True)


def _glu_down_abstract(gate_dot, up_dot, gate, up, rhs_down, group_sizes, **params):
    shape = (gate.shape[0], rhs_down.shape[2])
    return gmm_primitives.out_aval(gate, shape, gate.dtype, leading_from_like=True)


def _glu_dgrad_abstract(out_bar, gate, up, rhs_down, group_sizes, **params):
    aval = gmm_primitives.out_aval(gate, gate.shape, gate.dtype, leading_from_like=True)
    return [aval, aval]


for _primitive, _abstract, _call, _multiple in (
    (gated_ffn_p, _ffn_abstract, _ffn_call, False),
    (glu_down_p, _glu_down_abstract, unfused_glu_down, False),
    (glu_dgrad_p, _glu_dgrad_abstract, _glu_dgrad_call, True),
):
    _primitive.def_effectful_abstract_eval(gmm_primitives.with_kernel_effects(_abstract, _call))
    _primitive.def_impl(_call)
    mlir.register_lowering(_primitive, mlir.lower_fun(_call, multiple_results=_multiple))


# --- differentiation ----------------------------------------------------------------------------


def _ffn_jvp(primals, tangents, *, kernel, activation):
    lhs, rhs_gate, rhs_up, rhs_down, group_sizes = primals
    lhs_dot, gate_w_dot, up_w_dot, down_w_dot, _ = tangents
    (hidden, gate, up), (gate_dot, up_dot) = gated_primitives.projections_jvp(
        lhs,
        rhs_gate,
        rhs_up,
        group_sizes,
        lhs_dot,
        gate_w_dot,
        up_w_dot,
        kernel=kernel,
        activation=activation,
    )
    gmm = functools.partial(
        gmm_primitives.gmm, impl=kernel.grouped, transpose_rhs=False, out_dtype=lhs.dtype
    )
    out = gmm(hidden, rhs_down, group_sizes)
    terms = []
    if not all(type(t) is ad.Zero for t in (lhs_dot, gate_w_dot, up_w_dot)):
        terms.append(
            glu_down(
                gate_dot,
                up_dot,
                gate,
                up,
                rhs_down,
                group_sizes,
                kernel=kernel,
                activation=activation,
            )
        )
    if type(down_w_dot) is not ad.Zero:
        terms.append(gmm(hidden, down_w_dot, group_sizes))
    if not terms:
        return out, ad.Zero.from_primal_value(out)
    return out, functools.reduce(jnp.add, terms)


def _glu_down_transpose(out_bar, gate_dot, up_dot, gate, up, rhs_down, group_sizes, **params):
    assert not any(ad.is_undefined_primal(v) for v in (gate, up, rhs_down)), "nonlinear operands"
    if type(out_bar) is ad.Zero:
        return [None] * 6
    gate_bar, up_bar = glu_dgrad(out_bar, gate, up, rhs_down, group_sizes, **params)
    return [
        gate_bar if ad.is_undefined_primal(gate_dot) else None,
        up_bar if ad.is_undefined_primal(up_dot) else None,
        None,
        None,
        None,
        None,
    ]


def _glu_dgrad_transpose(cotangents, out_bar, gate, up, rhs_down, group_sizes, **params):
    assert not any(ad.is_undefined_primal(v) for v in (gate, up, rhs_down)), "nonlinear operands"
    if all(type(ct) is ad.Zero for ct in cotangents):
        return [None] * 5
    gate_bar_bar, up_bar_bar = (ad.instantiate_zeros(ct) for ct in cotangents)
    out_bar_bar = glu_down(gate_bar_bar, up_bar_bar, gate, up, rhs_down, group_sizes, **params)
    return [out_bar_bar.astype(out_bar.aval.dtype), None, None, None, None]


ad.primitive_jvps[gated_ffn_p] = _ffn_jvp
ad.primitive_jvps[glu_down_p] = functools.partial(gated_primitives.unfused_jvp, unfused_glu_down)
ad.primitive_jvps[glu_dgrad_p] = functools.partial(gated_primitives.unfused_jvp, unfused_glu_dgrad)
ad.primitive_transposes[glu_down_p] = _glu_down_transpose
ad.primitive_transposes[glu_dgrad_p] = _glu_dgrad_transpose


# --- batching: the unfused forms, batched by the grouped matmul's rule --------------------------

for _primitive, _unfused in (
    (gated_ffn_p, _ffn_call),
    (glu_down_p, unfused_glu_down),
    (glu_dgrad_p, unfused_glu_dgrad),
):
    batching.primitive_batchers[_primitive] = functools.partial(
        gated_primitives.batch_by_vmap, _unfused
    )
