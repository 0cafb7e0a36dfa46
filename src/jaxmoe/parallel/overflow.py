r"""The window schedule shared by both expert-parallel dispatches: every chunk's fast window,
then one ``lax.while_loop`` (with a custom VJP that loops again) for the windows past it.

``path(window, x, weights, params, experts, layout) -> (y, aux)`` is one window's exchange,
experts and combine for one chunk of a rank's tokens (:func:`jaxmoe.parallel.ep_apply_experts`:
slots of copies, ``aux`` the :class:`~jaxmoe.parallel.EPHandle`;
:mod:`jaxmoe.parallel.token_dispatch`: slots of pairs, ``aux`` the copies sent).
:func:`chunked` runs it on each of ``num_chunks`` equal chunks of the token rows
(``layouts[c]``: chunk ``c``'s int32 layout operand, the all-gathered counts or the token
dispatch's pair prefix counts) and concatenates the outputs::

    y = chunked(path)(0, ...)                                   # chunk 0, ..., C-1: window 0
      + overflow_windows(chunked(path), W, ...)                 # w = 1 .. W-1: window w of
                                                                #   chunk 0, ..., C-1

All chunks' fast windows come first in program order and the overflow is one loop after them,
so no loop holding collectives sits between two chunks' exchanges (XLA's GPU scheduler does not
move an async collective across such a loop; it can then overlap one chunk's fast exchange
with another's expert matmuls). ``W`` is the most windows any chunk needs; a window past a
chunk's own last one sends nothing and adds exact zeros (both layouts clip it to empty slots:
:func:`jaxmoe.parallel.layout.slot_layout`, :func:`jaxmoe.parallel.token_dispatch.window_end`),
so the result is the per-chunk sum. Every rank of the ep group runs the same ``W`` (computed by the
caller from all-gathered counts or a ``pmax``), so all enter the same collectives; the loop
holds one window's buffers at a time and the backward recomputes each window instead of
keeping it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe import compat


def chunked(path, num_chunks: int):
    """``path`` over all of a rank's tokens: ``run(window, x, weights, params, experts,
    layouts) -> (y, [aux per chunk])`` cuts the rows of ``x``, ``weights`` and ``experts`` into
    ``num_chunks`` equal chunks, runs ``path`` on chunk ``c`` with ``layouts[c]`` (chunks in
    order, each its own exchanges and experts) and concatenates the chunks' ``y``."""

    def run(window, x, weights, params, experts, layouts):
        size = x.shape[0] // num_chunks
        outs = [
            path(
                window,
                x[c * size : (c + 1) * size],
                weights[c * size : (c + 1) * size],
                params,
                experts[c * size : (c + 1) * size],
                layouts[c],
            )
            for c in range(num_chunks)
        ]
        ys = [y for y, _ in outs]
        return (ys[0] if num_chunks == 1 else jnp.concatenate(ys, axis=0)), [a for _, a in outs]

    return run


def overflow_windows(path, needed, like, x, weights, params, experts, layout_operand):
    """``sum_{w=1}^{needed-1} path(w, ...)[0]`` in a while loop (``needed``: int32, the same on
    every rank of the ep group); its custom VJP loops again, recomputing each window (see
    :func:`~jaxmoe.parallel.ep_apply_experts`). ``path`` returns ``(y, aux)`` (``aux`` is
    dropped), e.g. a :func:`chunked` path. ``like`` is the fast window's output: the sum's
    shape, dtype and mesh-variance type. ``layout_operand`` is the int32 array the windows are
    cut from (for a :func:`chunked` path, the chunks' layouts stacked)."""

    def output(window, x, weights, params, experts, counts):
        return path(window, x, weights, params, experts, counts)[0]

    def windows_loop(step, init, needed):
        return jax.lax.while_loop(
            lambda carry: carry[0] < needed,
            lambda carry: (carry[0] + 1, step(carry[0], carry[1])),
            (jnp.ones((), jnp.int32), init),
        )[1]

    @jax.custom_vjp
    def overflow(like, x, weights, params, experts, counts, needed):
        return windows_loop(
            lambda window, y: y + output(window, x, weights, params, experts, counts),
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
                lambda x, w, p: output(window, x, w, p, experts, counts), x, weights, params
            )
            return jax.tree.map(jnp.add, grads, pullback(grad_y))

        init = jax.tree.map(compat.zeros_like_typed, (x, weights, params))
        return (None, *windows_loop(step, init, needed), None, None, None)

    overflow.defvjp(overflow_fwd, overflow_bwd)
    return overflow(like, x, weights, params, experts, layout_operand, needed)
