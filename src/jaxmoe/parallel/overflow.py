r"""The window schedule shared by both expert-parallel dispatches: every chunk's fast window,
then one ``lax.while_loop`` (its transpose loops again) for the windows past it.

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
from jaxmoe.multilinear import multilinear


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
    every rank of the ep group). ``path`` returns ``(y, aux)`` (``aux`` is dropped), e.g. a
    :func:`chunked` path. ``like`` is the fast window's output: the sum's shape, dtype and
    mesh-variance type. ``layout_operand`` is the int32 array the windows are cut from (for a
    :func:`chunked` path, the chunks' layouts stacked).

    Its tangent is a :func:`~jaxmoe.multilinear.multilinear` map of the inputs' tangents: forward
    mode runs the loop's JVP (JAX's, through the windows' own rules); reverse mode transposes it
    into a second loop that recomputes each window's pullback instead of keeping its buffers (a
    while loop has no reverse mode of its own)."""

    def output(window, x, weights, params, experts, counts):
        return path(window, x, weights, params, experts, counts)[0]

    def windows_loop(step, init, needed):
        return jax.lax.while_loop(
            lambda carry: carry[0] < needed,
            lambda carry: (carry[0] + 1, step(carry[0], carry[1])),
            (jnp.ones((), jnp.int32), init),
        )[1]

    def forward(zeros, x, weights, params, experts, counts, needed):
        return windows_loop(
            lambda window, y: y + output(window, x, weights, params, experts, counts),
            zeros,
            needed,
        )

    # The tangent map's arrays: the tangents of (x, weights, params) (the linear group), then
    # their primals, experts, counts, needed and the zeros (the operands).
    differentiable_tree = jax.tree.structure((x, weights, params))
    size = differentiable_tree.num_leaves

    def split(arrays):
        primals = differentiable_tree.unflatten(arrays[:size])
        return primals, arrays[size:]

    def tangent_map(*arrays):
        tangents = differentiable_tree.unflatten(arrays[:size])
        primals, (experts, counts, needed, zeros) = split(arrays[size:])

        def loop(x, weights, params):
            return forward(zeros, x, weights, params, experts, counts, needed)

        return jax.jvp(loop, primals, tangents)[1]

    def tangent_transpose(grad_y, *arrays):
        (x, weights, params), (experts, counts, needed, zeros) = split(arrays)

        def step(window, grads):
            _, pullback = jax.vjp(
                lambda x, w, p: output(window, x, w, p, experts, counts), x, weights, params
            )
            return jax.tree.map(jnp.add, grads, pullback(grad_y))

        init = jax.tree.map(compat.zeros_like_typed, (x, weights, params))
        return tuple(jax.tree.leaves(windows_loop(step, init, needed)))

    @jax.custom_jvp
    def overflow(zeros, x, weights, params, experts, counts, needed):
        return forward(zeros, x, weights, params, experts, counts, needed)

    @overflow.defjvp
    def overflow_jvp(primals, tangents):
        zeros, x, weights, params, experts, counts, needed = primals
        out = overflow(*primals)
        tangent = multilinear(
            tangent_map,
            (tangent_transpose,),
            (tuple(jax.tree.leaves(tangents[1:4])),),
            (*jax.tree.leaves((x, weights, params)), experts, counts, needed, zeros),
            out=jax.ShapeDtypeStruct(zeros.shape, zeros.dtype),
        )
        return out, tangent

    zeros = compat.zeros_like_typed(like)
    return overflow(zeros, x, weights, params, experts, layout_operand, needed)
