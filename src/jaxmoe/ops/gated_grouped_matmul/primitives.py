r"""The fused gated grouped matmul as a JAX primitive whose derivatives are grouped matmuls.

``gated_gmm_p(lhs, rhs_gate, rhs_up, group_sizes) -> (h,)`` or ``(h, gate, up)`` (with
``residuals``); the ``kernel`` parameter (a :class:`.base.GatedGroupedMatmulBackend`) computes
it. Why a primitive with a JVP rule rather than a ``jax.custom_vjp``: a custom VJP has no
forward mode and is differentiable again only through its own rules, whereas the layer is
differentiated to any order (``tests/test_higher_order.py``). The JVP rule below is the product
rule written with the grouped matmul primitives (:mod:`jaxmoe.ops.grouped_matmul.primitives`),
which are linear and transposable, so reverse mode, forward mode and every higher order follow::

    (h, gate, up) = gated_gmm_p(x, Wg, Wu, residuals=True)        the kernel, once
    d gate = gmm(dx, Wg) + gmm(x, dWg)      d up = gmm(dx, Wu) + gmm(x, dWu)
    d h    = act'(gate) d gate * up + act(gate) * d up

Under ``jax.grad`` the forward computes ``h`` and the residuals ``gate`` and ``up`` once (see
below); the backward is the transpose of the tangent lines: ``d gate = dh * up *
act'(gate)``, ``d up = dh * act(gate)`` (XLA elementwise), ``dx = gmm(d gate, Wg^T) + gmm(d up,
Wu^T)`` and ``dWg = tgmm(x, d gate)``, ``dWu = tgmm(x, d up)`` on ``kernel.grouped``. These are
the very operations reverse mode runs through the unfused composition ``act(gmm(x, Wg)) *
gmm(x, Wu)`` (``act``'s own JVP included), so the gradients equal the unfused ones given equal
``gate`` and ``up``.

Where ``gate`` and ``up`` come from (``kernel.residuals_from_kernel``): never from the fused
``h`` plus two more ``gmm`` calls (every forward FLOP twice). Either the kernel writes them from
its epilogue beside ``h`` (two ``[M, F]`` stores the unfused path makes anyway), or the unfused
composition computes all three (``composition``), and the kernel runs only when nothing is
differentiated. The Mosaic backend takes the first by measurement (see its docstring); the
derivatives are the same either way.

**The input gradient in one kernel** (``kernel.fused_input_dgrad``): the two projections'
tangents in ``x`` are then one linear primitive, ``input_tangent_p(x_dot; Wg, Wu) -> (gmm(x_dot,
Wg), gmm(x_dot, Wu))``, whose transpose ``input_dgrad_p(gate_bar, up_bar; Wg, Wu) -> gmm(gate_bar,
Wg^T) + gmm(up_bar, Wu^T)`` the backend runs as one kernel (``kernel.input_dgrad``: one K loop
over both products, one rounding, one ``[M, K]`` result written) where it applies, and as the
two products and their sum elsewhere. The two are each other's transposes; their JVPs in the
weights are those of their unfused forms, so every order of differentiation holds.

**Batching** (``jax.vmap``): the unfused composition on ``kernel.grouped``, whose grouped
matmuls batch by their own rule (one grouped matmul over the batch's groups). The fused kernel
is not run under ``vmap``; the layer calls this op unbatched.

**shard_map**: the operands are cast to vary over the same manual axes before binding, as for
the grouped matmul primitives.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jaxmoe.ops.gated_grouped_matmul.base import GATE_ACTIVATIONS
from jaxmoe.ops.gated_grouped_matmul.reference import unfused
from jaxmoe.ops.grouped_matmul import primitives as gmm_primitives

Array = jax.Array

gated_gmm_p = Primitive("jaxmoe_gated_grouped_matmul")
gated_gmm_p.multiple_results = True


def gated_gmm(lhs, rhs_gate, rhs_up, group_sizes, *, kernel, activation: str, residuals: bool):
    """``(h,)`` or ``(h, gate, up)``; see the module docstring."""
    return tuple(
        gmm_primitives.bind_varying(
            gated_gmm_p,
            lhs,
            rhs_gate,
            rhs_up,
            group_sizes,
            kernel=kernel,
            activation=activation,
            residuals=residuals,
        )
    )


def _kernel_call(lhs, rhs_gate, rhs_up, group_sizes, *, kernel, activation, residuals):
    return kernel.fused(
        lhs, rhs_gate, rhs_up, group_sizes, activation=activation, residuals=residuals
    )


def _abstract(lhs, rhs_gate, rhs_up, group_sizes, *, kernel, activation, residuals):
    shape = (lhs.shape[0], rhs_gate.shape[2])
    out = gmm_primitives.out_aval(lhs, shape, lhs.dtype, leading_from_like=True)
    return [out] * (3 if residuals else 1)


gated_gmm_p.def_effectful_abstract_eval(gmm_primitives.with_kernel_effects(_abstract, _kernel_call))
gated_gmm_p.def_impl(_kernel_call)
mlir.register_lowering(gated_gmm_p, mlir.lower_fun(_kernel_call, multiple_results=True))


def composition(lhs, rhs_gate, rhs_up, group_sizes, *, kernel, activation, residuals):
    gate, up = (
        gmm_primitives.gmm(
            lhs, rhs, group_sizes, impl=kernel.grouped, transpose_rhs=False, out_dtype=lhs.dtype
        )
        for rhs in (rhs_gate, rhs_up)
    )
    hidden = unfused(gate, up, activation).astype(lhs.dtype)
    return (hidden, gate, up) if residuals else (hidden,)


# --- differentiation: the product rule on grouped matmul primitives ---------------------------


def product_tangent(lhs, rhs, lhs_dot, rhs_dot, group_sizes, grouped, like, lhs_term=None):
    """``gmm(lhs_dot, rhs) + gmm(lhs, rhs_dot)``, skipping symbolic zeros; ``lhs_term``, where
    given, stands for the first product (computed elsewhere: :func:`input_tangent`)."""
    gmm = functools.partial(
        gmm_primitives.gmm, impl=grouped, transpose_rhs=False, out_dtype=lhs.dtype
    )
    terms = []
    if lhs_term is not None:
        terms.append(lhs_term)
    elif type(lhs_dot) is not ad.Zero:
        terms.append(gmm(lhs_dot, rhs, group_sizes))
    if type(rhs_dot) is not ad.Zero:
        terms.append(gmm(lhs, rhs_dot, group_sizes))
    if not terms:
        return jnp.zeros_like(like)
    return functools.reduce(jnp.add, terms)


def hidden_tangent(gate, up, gate_dot, up_dot, activation: str):
    """The tangent of ``h = act(gate) * up``: ``act'(gate) gate_dot * up + act(gate) * up_dot``,
    with act's own JVP, as reverse mode applies it to the unfused ``act(gate) * up``."""
    activated, activated_dot = jax.jvp(GATE_ACTIVATIONS[activation], (gate,), (gate_dot,))
    return activated_dot * up + activated * up_dot


def projections_jvp(
    lhs, rhs_gate, rhs_up, group_sizes, lhs_dot, gate_w_dot, up_w_dot, *, kernel, activation
):
    """``(hidden, gate, up), (gate_dot, up_dot)``: the primal with its residuals (from the
    kernel or the unfused composition, ``kernel.residuals_from_kernel``) and the tangents of the
    two projections by the product rule."""
    primal = gated_gmm if kernel.residuals_from_kernel else composition
    hidden, gate, up = primal(
        lhs, rhs_gate, rhs_up, group_sizes, kernel=kernel, activation=activation, residuals=True
    )
    tangent = functools.partial(
        product_tangent, group_sizes=group_sizes, grouped=kernel.grouped, like=gate
    )
    gate_term = up_term = None
    if kernel.fused_input_dgrad and type(lhs_dot) is not ad.Zero:
        gate_term, up_term = input_tangent(lhs_dot, rhs_gate, rhs_up, group_sizes, kernel=kernel)
    gate_dot = tangent(lhs, rhs_gate, lhs_dot, gate_w_dot, lhs_term=gate_term)
    up_dot = tangent(lhs, rhs_up, lhs_dot, up_w_dot, lhs_term=up_term)
    return (hidden, gate, up), (gate_dot, up_dot)


def _jvp(primals, tangents, *, kernel, activation, residuals):
    (hidden, gate, up), (gate_dot, up_dot) = projections_jvp(
        *primals, *tangents[:3], kernel=kernel, activation=activation
    )
    hidden_dot = hidden_tangent(gate, up, gate_dot, up_dot, activation)
    if residuals:
        return (hidden, gate, up), (hidden_dot, gate_dot, up_dot)
    return (hidden,), (hidden_dot,)


ad.primitive_jvps[gated_gmm_p] = _jvp


# --- the input gradient as one kernel: a linear primitive and its transpose --------------------

input_tangent_p = Primitive("jaxmoe_gated_input_tangent")
input_tangent_p.multiple_results = True
input_dgrad_p = Primitive("jaxmoe_gated_input_dgrad")


def input_tangent(lhs_dot, rhs_gate, rhs_up, group_sizes, *, kernel):
    """``(gmm(lhs_dot, Wg), gmm(lhs_dot, Wu))``, linear in ``lhs_dot``; its transpose is
    :func:`input_dgrad`."""
    return tuple(
        gmm_primitives.bind_varying(
            input_tangent_p, lhs_dot, rhs_gate, rhs_up, group_sizes, kernel=kernel
        )
    )


def input_dgrad(gate_bar, up_bar, rhs_gate, rhs_up, group_sizes, *, kernel):
    """``[M, K]``: ``gmm(gate_bar, Wg^T) + gmm(up_bar, Wu^T)``, linear in ``(gate_bar,
    up_bar)``; one kernel where ``kernel.input_dgrad`` applies."""
    return gmm_primitives.bind_varying(
        input_dgrad_p, gate_bar, up_bar, rhs_gate, rhs_up, group_sizes, kernel=kernel
    )


def unfused_input_tangent(lhs_dot, rhs_gate, rhs_up, group_sizes, *, kernel):
    """:func:`input_tangent` as two grouped matmuls on ``kernel.grouped``."""
    return tuple(
        gmm_primitives.gmm(
            lhs_dot,
            rhs,
            group_sizes,
            impl=kernel.grouped,
            transpose_rhs=False,
            out_dtype=lhs_dot.dtype,
        )
        for rhs in (rhs_gate, rhs_up)
    )


def unfused_input_dgrad(gate_bar, up_bar, rhs_gate, rhs_up, group_sizes, *, kernel):
    """:func:`input_dgrad` as reverse mode of the unfused projections computes it: two
    transposed grouped matmuls on ``kernel.grouped``, then their sum."""
    dtype = rhs_gate.dtype
    gate_part, up_part = (
        gmm_primitives.gmm(
            bar.astype(dtype),
            rhs,
            group_sizes,
            impl=kernel.grouped,
            transpose_rhs=True,
            out_dtype=dtype,
        )
        for bar, rhs in ((gate_bar, rhs_gate), (up_bar, rhs_up))
    )
    return gate_part + up_part


def _input_dgrad_call(gate_bar, up_bar, rhs_gate, rhs_up, group_sizes, *, kernel):
    if kernel.input_dgrad_unsupported_reason(gate_bar, rhs_gate, group_sizes) is None:
        return kernel.input_dgrad(gate_bar, up_bar, rhs_gate, rhs_up, group_sizes)
    return unfused_input_dgrad(gate_bar, up_bar, rhs_gate, rhs_up, group_sizes, kernel=kernel)


def _input_tangent_abstract(lhs_dot, rhs_gate, rhs_up, group_sizes, **params):
    shape = (lhs_dot.shape[0], rhs_gate.shape[2])
    out = gmm_primitives.out_aval(lhs_dot, shape, lhs_dot.dtype, leading_from_like=True)
    return [out, out]


def _input_dgrad_abstract(gate_bar, up_bar, rhs_gate, rhs_up, group_sizes, **params):
    shape = (gate_bar.shape[0], rhs_gate.shape[1])
    return gmm_primitives.out_aval(gate_bar, shape, rhs_gate.dtype, leading_from_like=True)


for _primitive, _abstract, _call, _multiple in (
    (input_tangent_p, _input_tangent_abstract, unfused_input_tangent, True),
    (input_dgrad_p, _input_dgrad_abstract, _input_dgrad_call, False),
):
    _primitive.def_effectful_abstract_eval(gmm_primitives.with_kernel_effects(_abstract, _call))
    _primitive.def_impl(_call)
    mlir.register_lowering(_primitive, mlir.lower_fun(_call, multiple_results=_multiple))


def unfused_jvp(unfused_form, primals, tangents, **params):
    """The JVP of a linear primitive in all its operands: that of its unfused form (the integer
    ``group_sizes``, last, has none)."""
    *floats, group_sizes = primals
    float_tangents = [ad.instantiate_zeros(t) for t in tangents[:-1]]
    return jax.jvp(
        lambda *args: unfused_form(*args, group_sizes, **params),
        tuple(floats),
        tuple(float_tangents),
    )


def _input_tangent_transpose(cotangents, lhs_dot, rhs_gate, rhs_up, group_sizes, **params):
    assert not any(ad.is_undefined_primal(v) for v in (rhs_gate, rhs_up)), "nonlinear operands"
    if all(type(ct) is ad.Zero for ct in cotangents):
        return [None] * 4
    gate_bar, up_bar = (ad.instantiate_zeros(ct) for ct in cotangents)
    lhs_bar = input_dgrad(gate_bar, up_bar, rhs_gate, rhs_up, group_sizes, **params)
    return [lhs_bar.astype(lhs_dot.aval.dtype), None, None, None]


def _input_dgrad_transpose(lhs_bar, gate_bar, up_bar, rhs_gate, rhs_up, group_sizes, **params):
    assert not any(ad.is_undefined_primal(v) for v in (rhs_gate, rhs_up)), "nonlinear operands"
    if type(lhs_bar) is ad.Zero:
        return [None] * 5
    gate_dot, up_dot = input_tangent(lhs_bar, rhs_gate, rhs_up, group_sizes, **params)
    return [
        gate_dot.astype(gate_bar.aval.dtype) if ad.is_undefined_primal(gate_bar) else None,
        up_dot.astype(up_bar.aval.dtype) if ad.is_undefined_primal(up_bar) else None,
        None,
        None,
        None,
    ]


ad.primitive_jvps[input_tangent_p] = functools.partial(unfused_jvp, unfused_input_tangent)
ad.primitive_jvps[input_dgrad_p] = functools.partial(unfused_jvp, unfused_input_dgrad)
ad.primitive_transposes[input_tangent_p] = _input_tangent_transpose
ad.primitive_transposes[input_dgrad_p] = _input_dgrad_transpose


# --- batching: the unfused composition, batched by the grouped matmul's rule ------------------


def batch_by_vmap(call, args, dims, **params):
    """A batching rule: ``jax.vmap`` of ``call`` (an unfused form, written with primitives that
    batch by their own rules), every output batched along axis 0."""
    outs = jax.vmap(functools.partial(call, **params), in_axes=tuple(dims))(*args)
    return outs, (tuple(0 for _ in outs) if isinstance(outs, tuple) else 0)


batching.primitive_batchers[gated_gmm_p] = functools.partial(batch_by_vmap, composition)
batching.primitive_batchers[input_tangent_p] = functools.partial(
    batch_by_vmap, unfused_input_tangent
)
batching.primitive_batchers[input_dgrad_p] = functools.partial(batch_by_vmap, unfused_input_dgrad)
