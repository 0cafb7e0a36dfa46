r"""The dropless overflow loop shared by both expert-parallel dispatches: the windows past the
fast one, in a ``lax.while_loop`` whose custom VJP loops again.

``path(window, x, weights, params, experts, layout_operand) -> y`` is one window's exchange,
experts and combine (:func:`jaxmoe.parallel.ep_apply_experts`: slots of copies;
:mod:`jaxmoe.parallel.dedup`: slots of pairs). Every rank of the ep group runs the same number
of windows (``needed``, computed by the caller from all-gathered counts or a ``pmax``), so all
enter the same collectives; the loop holds one window's buffers at a time and the backward
recomputes each window instead of keeping it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe import compat


def overflow_windows(path, needed, like, x, weights, params, experts, layout_operand):
    """``sum_{w=1}^{needed-1} path(w, ...)`` in a while loop (``needed``: int32, the same on
    every rank of the ep group); its custom VJP loops again, recomputing each window (see
    :func:`ep_apply_experts`). ``like`` is the fast window's output: the sum's shape, dtype and
    mesh-variance type. ``layout_operand`` is the int32 array the windows are cut from (the
    all-gathered counts, or the dedup path's pair prefix counts)."""

    def windows_loop(step, init, needed):
        return jax.lax.while_loop(
            lambda carry: carry[0] < needed,
            lambda carry: (carry[0] + 1, step(carry[0], carry[1])),
            (jnp.ones((), jnp.int32), init),
        )[1]

    @jax.custom_vjp
    def overflow(like, x, weights, params, experts, counts, needed):
        return windows_loop(
            lambda window, y: y + path(window, x, weights, params, experts, counts),
            compat.zeros_like_typed(like),
            needed,
        )

    def overflow_fwd(like, x, weights, params, experts, counts, needed):
        out = overflow(like, x, weights, params, experts, counts, needed)
        return out, (x, weights, params, experts, counts, needed)

    def overflow_bwd(residuals, grad_y):
        x, weights, params, experts, counts, needed = residuals

        def step(window, grads):
            _, pullback = jax.vjp(
                lambda x, w, p: path(window, x, w, p, experts, counts), x, weights, params
            )
            return jax.tree.map(jnp.add, grads, pullback(grad_y))

        init = jax.tree.map(compat.zeros_like_typed, (x, weights, params))
        return (None, *windows_loop(step, init, needed), None, None, None)

    overflow.defvjp(overflow_fwd, overflow_bwd)
    return overflow(like, x, weights, params, experts, layout_operand, needed)
