r"""FP8 rows on the expert-parallel wire (``MoEConfig.ep_fp8_dispatch``).

Without it the dispatch sends each row in the layer's dtype and the experts quantize what they
receive. With it each token is quantized once, before the exchange, with the recipe's
activation blocks, and its FP8 row and float32 scales travel packed as bytes::

    x[T, H] --quantize--> q[T, H] e4m3, scale[T, S] f32 --pack--> rows[T, H + 4S] uint8
      --the dispatch's own gathers and exchange (copies or pairs)--> rows[R, H + 4S] uint8
      --unpack--> (q[R, H], scale[R, S]): the experts' FP8 operand, used as it arrives

``S = 1`` for rowwise (one scale per row), ``ceil(H / b)`` for blockwise (1 x b tiles), so a
row costs ``H + 4S`` bytes instead of ``2H`` in bf16: 0.508x at H = 256 rowwise, 0.516x
blockwise. One exchange carries rows and scales together (one collective, not two).

**The same bits as quantizing after the exchange.** Both recipes' activation blocks lie
inside one row, and the exchange and every permutation move whole rows without changing them:
a received row's quantization is the sender's. Rows that hold no copy (padding) arrive as zero
bytes, a zero row and a zero scale, where quantizing the padding gives a zero row and the
smallest scale: their products are zero either way, so the experts' outputs are bitwise equal.

**The backward stays in the layer's dtype.** The dispatch is linear in ``x``; its VJP is the
reverse path (the combine's gathers and exchange with unit weights) applied to the cotangent of
the received rows, in ``x``'s dtype, exactly what differentiating the unquantized dispatch
gives (:func:`with_gradient_of`). The combine's forward is unchanged (its rows are expert
outputs, in the layer's dtype). Each window of the dropless overflow quantizes its tokens
again (the same bits: quantization is deterministic); the fast window, usually the only one,
quantizes each token once.

The FP8 weight gradient (``Fp8Recipe(wgrad="fp8")``) re-quantizes the experts' input rows from
high precision per column, so it needs the rows that no longer cross the wire: ``MoEConfig``
refuses that combination.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxmoe import debug
from jaxmoe.forward_mode import FP8_FORWARD_MODE_REASON, refuse_forward_mode
from jaxmoe.ops.fp8 import Fp8Recipe, dequantize, quantize
from jaxmoe.ops.fp8.quantize import scale_shape

_SCALE_BYTES = 4  # float32


def scales_per_row(hidden_size: int, recipe: Fp8Recipe) -> int:
    """``S``: the float32 scales one ``H``-wide row carries under ``recipe``'s activation blocks."""
    return scale_shape((1, hidden_size), recipe.lhs_blocks)[1]


def row_bytes(hidden_size: int, recipe: Fp8Recipe) -> int:
    """Bytes of one packed row on the wire: ``H`` FP8 values and ``S`` float32 scales."""
    return hidden_size * jnp.dtype(recipe.dtype).itemsize + _SCALE_BYTES * scales_per_row(
        hidden_size, recipe
    )


def pack_rows(x: jax.Array, recipe: Fp8Recipe) -> jax.Array:
    """``x[T, H]`` quantized per row block and packed: ``[T, H + 4S]`` uint8 (no gradient)."""
    q, scale = quantize(jax.lax.stop_gradient(x), recipe.lhs_blocks, recipe.dtype)
    q_bytes = jax.lax.bitcast_convert_type(q, jnp.uint8)
    scale_bytes = jax.lax.bitcast_convert_type(scale, jnp.uint8)  # [T, S, 4]
    return jnp.concatenate([q_bytes, scale_bytes.reshape(x.shape[0], -1)], axis=1)


def unpack_rows(rows: jax.Array, hidden_size: int, recipe: Fp8Recipe, live_rows=None):
    """``rows[R, H + 4S]`` uint8 -> ``(q[R, H], scale[R, S])``, the pair
    ``quantize(buffer, recipe.lhs_blocks, recipe.dtype)`` gives for the received rows. Under
    ``JAXMOE_POISON`` the scales of rows at or past ``live_rows`` are NaN."""
    q = jax.lax.bitcast_convert_type(rows[:, :hidden_size], recipe.dtype)
    scale_bytes = rows[:, hidden_size:].reshape(rows.shape[0], -1, _SCALE_BYTES)
    scale = jax.lax.bitcast_convert_type(scale_bytes, jnp.float32)
    if live_rows is not None:
        scale = debug.poison_rows(scale, live_rows)
    return q, scale


def dequantized(q: jax.Array, scale: jax.Array, recipe: Fp8Recipe, dtype) -> jax.Array:
    """The received rows as the wire delivered them, ``q * scale`` in ``dtype`` (what an
    expert function that ignores the FP8 operand computes on; dead code where it uses it)."""
    return dequantize(q, scale, recipe.lhs_blocks, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _carry(transpose, x, value, operands):
    del x, operands
    return value


def _carry_fwd(transpose, x, value, operands):
    del x
    return value, operands


def _carry_bwd(transpose, operands, grad_value):
    # The received rows' cotangent, pulled back through the reverse path in its own dtype
    # (x's: the value was cast to it); the value itself is a constant of the FP8 path.
    return transpose(grad_value, operands).astype(grad_value.dtype), None, None


_carry.defvjp(_carry_fwd, _carry_bwd)


def with_gradient_of(x: jax.Array, value: jax.Array, transpose, operands) -> jax.Array:
    """``value`` (the received rows, computed from FP8 bytes: no gradient of its own) as a
    function of ``x`` whose VJP is ``transpose(cotangent, operands)`` cast to ``x``'s dtype.

    ``transpose`` must be the transpose of the linear map ``x -> received rows`` (the
    dispatch's gathers and exchange), built from the reverse path's forward functions, so that
    the gradient is the one differentiating the unquantized dispatch gives, bit for bit.
    ``operands``: the integer layout arrays it reads (a pytree). Forward mode through it is
    refused (:data:`jaxmoe.forward_mode.FP8_FORWARD_MODE_REASON`)."""
    x = refuse_forward_mode(x, FP8_FORWARD_MODE_REASON)
    return _carry(transpose, x, value.astype(x.dtype), operands)
