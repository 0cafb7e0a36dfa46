r"""A marker that refuses forward-mode autodiff through a value with a message of our own.

The FP8 path's gradients are ``jax.custom_vjp`` functions (a quantized backward, by design not
the derivative of the forward), and JAX has no forward mode for a custom VJP; its own error
names neither the layer nor the fix. :func:`refuse_forward_mode` is the identity on a value and
on its cotangent, and its tangent is a primitive that raises ``TypeError(message)`` when it is
computed: eagerly at once, under ``jax.jit`` when the program is lowered, under ``jax.vmap``
(``jax.jacfwd``) when it is batched (before the custom
VJP's own error, as the marker comes first). Reverse mode never computes a tangent (it only
transposes the tangent map: the identity), so ``jax.grad``, ``jax.vjp`` and ``jax.jacrev``
run exactly as without the marker::

    y = refuse_forward_mode(x, message)
      y = x;  dy = refusal(dx) (raises where computed);  x_bar = y_bar
"""

from __future__ import annotations

from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

FP8_FORWARD_MODE_REASON = (
    "jaxmoe: forward-mode autodiff (jax.jvp, jax.jacfwd) cannot run through the FP8 path "
    "(MoEConfig.fp8_recipe, fp8_grouped_matmul, ep_fp8_dispatch): its gradients are "
    "jax.custom_vjp functions (the FP8 recipe's quantized backward, by design not the derivative "
    "of the quantized forward), and JAX has no forward mode for a custom VJP. Use reverse mode "
    "(jax.grad, jax.vjp, jax.jacrev), or run the layer without fp8_recipe (bfloat16 or float32), "
    "where forward mode works."
)

refuse_p = Primitive("jaxmoe_refuse_forward_mode")  # the identity; its tangent raises
refusal_p = Primitive("jaxmoe_forward_mode_refusal")  # the tangent: raises where computed


def refuse_forward_mode(x, message: str):
    """``x``, with forward-mode autodiff through it refused by ``TypeError(message)``."""
    return refuse_p.bind(x, message=message)


def _identity(x, *, message):
    del message
    return x


def _abstract_identity(aval, *, message):
    del message
    return aval


def _raise(x, *, message):
    raise TypeError(message)


refuse_p.def_impl(_identity)
refuse_p.def_abstract_eval(_abstract_identity)
mlir.register_lowering(refuse_p, mlir.lower_fun(_identity, multiple_results=False))
refusal_p.def_impl(_raise)
refusal_p.def_abstract_eval(_abstract_identity)
mlir.register_lowering(refusal_p, mlir.lower_fun(_raise, multiple_results=False))


def _refuse_jvp(primals, tangents, *, message):
    ((x,), (tangent,)) = primals, tangents
    if type(tangent) is ad.Zero:
        return x, tangent
    return x, refusal_p.bind(tangent, message=message)


def _refusal_jvp(primals, tangents, *, message):
    return refusal_p.bind(primals[0], message=message), refusal_p.bind(
        ad.instantiate_zeros(tangents[0]), message=message
    )


def _transpose_identity(cotangent, x, *, message):
    del x, message
    return [cotangent]


def _batcher(primitive):
    def batch(arrays, dims, *, message):
        return primitive.bind(arrays[0], message=message), dims[0]

    return batch


ad.primitive_jvps[refuse_p] = _refuse_jvp
ad.primitive_jvps[refusal_p] = _refusal_jvp
ad.primitive_transposes[refuse_p] = _transpose_identity
ad.primitive_transposes[refusal_p] = _transpose_identity
batching.primitive_batchers[refuse_p] = _batcher(refuse_p)
# A batched tangent (jax.jacfwd) is one being computed: refused while tracing, before JAX's own
# custom VJP batching rule raises its error. Reverse mode never batches the tangent map (it
# transposes it first).
batching.primitive_batchers[refusal_p] = lambda arrays, dims, *, message: _raise(
    arrays[0], message=message
)
