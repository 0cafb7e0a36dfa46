r"""FP8 expert weights quantized once and reused: :class:`Fp8Weights` and its checks.

:func:`jaxmoe.ops.fp8.fp8_grouped_matmul` quantizes its weight ``rhs [G, K, N]`` on every call,
twice for the rowwise recipe (the forward operand and the dgrad's transposed one). Within one
optimizer step the weights do not change, so with gradient accumulation every micro-batch
repeats the same casts (on an H100 1.08 ms per Mixtral weight for both operands, by
:mod:`.weight_quantize_pallas`; 2.9 ms with XLA's casts). An
:class:`Fp8Weights` holds both operands, made once per step by
:func:`jaxmoe.ops.fp8.quantize_fp8_weights` and passed to every micro-batch's
``fp8_grouped_matmul(..., rhs_fp8=...)`` (TransformerEngine's ``is_first_microbatch``, as a
value instead of a flag)::

    forward:  (q, scale)     = quantize(rhs,              recipe.rhs_blocks)  # [G, K, N]
    dgrad:    (q_t, scale_t) = quantize(swapaxes(rhs, 1, 2), recipe.rhs_blocks)  # [G, N, K]
              (logical shapes; stored in the layout each kernel reads, see Fp8Weights)
              (blockwise: b x b blocks give quantize(w^T) == quantize(w)^T, so the dgrad
               operand is the forward one transposed and is not stored)

Every quantization block has extent 1 along the expert dim ``G`` (rowwise ``(1, K, 1)`` and
``(1, N, 1)``, blockwise ``(1, b, b)``), so quantizing a slice of whole experts gives the same
slice of the whole weight's quantization: the cache of all experts, sharded over ``G`` like the
weights, is what each expert-parallel rank would have made from its own experts.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.ops.fp8 import weight_quantize_pallas
from jaxmoe.ops.fp8.quantize import quantize, scale_shape
from jaxmoe.ops.fp8.recipe import Fp8Recipe


@dataclasses.dataclass(frozen=True)
class Fp8Weights:
    """One ``[G, K, N]`` weight in FP8, as the forward and dgrad of one recipe consume it.

    A pytree: the arrays are its leaves (``None`` is an empty subtree), ``recipe`` and
    ``k_major`` are static metadata, so it passes through ``jit``, ``scan`` and ``shard_map``.
    The FP8 arrays are held in the memory layout the backend's kernel reads, so that a cache
    made in one ``jit`` and read in another costs no transpose: FP8 ``wgmma`` reads both
    operands K-major (the contraction dim contiguous), i.e. ``[G, N, K]`` for the forward
    (contraction over K) and ``[G, K, N]``, the master weight's own layout, for the dgrad
    (contraction over N). :meth:`forward_operand` and :meth:`dgrad_operand` give the logical
    operands; the kernel's own swap to K-major cancels their transposes.

    Attributes:
      q: the forward operand ``quantize(rhs, recipe.rhs_blocks)``: FP8 (``recipe.dtype``)
        ``[G, N, K]`` with ``k_major``, ``[G, K, N]`` without.
      scale: float32 ``[G, 1, N]`` (rowwise) or ``[G, ceil(K/b), ceil(N/b)]`` (blockwise).
      q_t: the rowwise dgrad operand ``quantize(rhs^T, recipe.rhs_blocks)`` (one scale per
        (g, k)): ``[G, K, N]`` with ``k_major``, ``[G, N, K]`` without; ``None`` for blockwise,
        whose dgrad operand is the forward one transposed (:meth:`dgrad_operand`).
      scale_t: float32 ``[G, 1, K]`` (rowwise); ``None`` for blockwise.
      recipe: the :class:`Fp8Recipe` it was quantized with.
      k_major: whether it was made for a backend reading K-major weights (the Mosaic GPU
        kernel on a GPU); the values are the same bits either way.
    """

    q: jax.Array
    scale: jax.Array
    q_t: jax.Array | None
    scale_t: jax.Array | None
    recipe: Fp8Recipe
    k_major: bool

    def forward_operand(self) -> tuple[jax.Array, jax.Array]:
        """``(q, scale)``: ``[G, K, N]`` weights for ``out = lhs @ w[g]``."""
        return _logical(self.q, self.k_major), self.scale

    def dgrad_operand(self) -> tuple[jax.Array, jax.Array]:
        """``(q_t, scale_t)``: ``[G, N, K]`` weights for ``d lhs = d out @ w[g]^T``."""
        if self.q_t is None:  # blockwise: b x b blocks, quantize(w^T) == quantize(w)^T
            q, scale = self.forward_operand()
            return jnp.swapaxes(q, 1, 2), jnp.swapaxes(scale, 1, 2)
        return _logical(self.q_t, self.k_major), self.scale_t


jax.tree_util.register_dataclass(
    Fp8Weights, data_fields=["q", "scale", "q_t", "scale_t"], meta_fields=["recipe", "k_major"]
)


def _logical(stored: jax.Array, k_major: bool) -> jax.Array:
    """A stored FP8 operand as its logical ``[G, contraction, out]`` array."""
    return jnp.swapaxes(stored, 1, 2) if k_major else stored


def _quantize_last_axis_contracted(rhs, recipe: Fp8Recipe, transpose: bool):
    """``quantize`` of ``rhs`` (or ``rhs^T`` with ``transpose``) contracted over its middle dim,
    written with the contraction dim last (K-major): ``(q [G, out, contraction], scale [G, 1,
    out])`` (blockwise: the scale ``[G, ceil(contraction / b), ceil(out / b)]``).

    Why a pass of its own for the transpose: the bf16 transpose alone (the barrier keeps it out
    of the cast's fusion), then the quantization along the now-last axis, is faster than letting
    the transpose fuse into the cast (docs/kernels.md, 'FP8 quantizers'). Amax, scale and cast
    see the same values either way: the same bits.
    """
    group_block, contraction_block, out_block = recipe.rhs_blocks
    if transpose:
        rhs = jax.lax.optimization_barrier(jnp.swapaxes(rhs, 1, 2))
    q, scale = quantize(rhs, (group_block, out_block, contraction_block), recipe.dtype)
    return q, jnp.swapaxes(scale, 1, 2)


def make_fp8_weights(rhs, recipe: Fp8Recipe, k_major: bool) -> Fp8Weights:
    """Both operands of ``rhs`` (see :class:`Fp8Weights`), as constants: no gradient flows from
    them back to ``rhs`` (the master weight's gradient is the op's wgrad).

    Rowwise for a K-major backend on a GPU: both in two passes over ``rhs`` by
    :func:`.weight_quantize_pallas.quantize_weights_rowwise_pallas` (bit for bit XLA's and
    faster: docs/kernels.md, 'FP8 quantizers'). Otherwise XLA's :func:`quantize`, each operand
    in its kernel's layout.
    """
    rhs = jax.lax.stop_gradient(jnp.asarray(rhs))
    if recipe.name == "blockwise":
        if k_major:  # the forward reads [G, N, K]
            q, scale = _quantize_last_axis_contracted(rhs, recipe, transpose=True)
        else:
            q, scale = quantize(rhs, recipe.rhs_blocks, recipe.dtype)
        return Fp8Weights(q, scale, None, None, recipe, bool(k_major))
    if k_major and weight_quantize_pallas.supports(rhs.shape, rhs.dtype, recipe.dtype):
        q, scale, q_t, scale_t = weight_quantize_pallas.quantize_weights_rowwise_pallas(rhs)
        return Fp8Weights(q, scale, q_t, jnp.swapaxes(scale_t, 1, 2), recipe, True)
    if k_major:
        q, scale = _quantize_last_axis_contracted(rhs, recipe, transpose=True)
        # The dgrad contracts over N, rhs's last dim: rhs's own layout is its K-major.
        q_t, scale_t = _quantize_last_axis_contracted(rhs, recipe, transpose=False)
        return Fp8Weights(q, scale, q_t, scale_t, recipe, True)
    q, scale = quantize(rhs, recipe.rhs_blocks, recipe.dtype)
    q_t, scale_t = quantize(jnp.swapaxes(rhs, 1, 2), recipe.rhs_blocks, recipe.dtype)
    return Fp8Weights(q, scale, q_t, scale_t, recipe, False)


def _expected_leaves(rhs_shape: tuple, recipe: Fp8Recipe, k_major: bool) -> dict:
    groups, k, n = rhs_shape
    transposed = (groups, n, k)
    leaves = {
        "q": (transposed if k_major else rhs_shape, recipe.dtype),
        "scale": (scale_shape(rhs_shape, recipe.rhs_blocks), jnp.dtype(jnp.float32)),
    }
    if recipe.name != "blockwise":
        leaves["q_t"] = (rhs_shape if k_major else transposed, recipe.dtype)
        leaves["scale_t"] = (scale_shape(transposed, recipe.rhs_blocks), jnp.dtype(jnp.float32))
    return leaves


def check_fp8_weights(
    rhs_fp8,
    rhs_shape: tuple,
    recipe: Fp8Recipe,
    k_major: bool,
    *,
    name: str,
    caller: str,
    fix: str = "Make it with jaxmoe.ops.fp8.quantize_fp8_weights(rhs, recipe, backend) from rhs.",
) -> None:
    """Raises ValueError, naming ``name``, unless ``rhs_fp8`` is an :class:`Fp8Weights` of a
    ``rhs_shape`` weight made with ``recipe`` for a backend reading ``k_major`` weights.

    Python-side (shapes, dtypes, static metadata): values cannot be checked under ``jit``, so
    that the cache was made from the same weight values is the caller's promise. ``fix`` ends
    each message: how to make the right cache.
    """
    if not isinstance(rhs_fp8, Fp8Weights):
        raise ValueError(
            f"{caller}: `{name}` must be a jaxmoe.ops.fp8.Fp8Weights or None; got "
            f"{type(rhs_fp8).__name__}. {fix}"
        )
    if not rhs_fp8.recipe.quantizes_like(recipe):
        raise ValueError(
            f"{caller}: `{name}` was quantized with recipe {rhs_fp8.recipe}, but the matmul runs "
            f"{recipe}. Quantize with the recipe the matmul uses. {fix}"
        )
    if rhs_fp8.k_major != k_major:
        raise ValueError(
            f"{caller}: `{name}` was made for a backend reading {_layout(rhs_fp8.k_major)} "
            f"weights; this backend reads {_layout(k_major)}. Pass the same `backend` to "
            f"quantize_fp8_weights as to the matmul. {fix}"
        )
    for field, (shape, dtype) in _expected_leaves(tuple(rhs_shape), recipe, k_major).items():
        value = getattr(rhs_fp8, field)
        got = None if value is None else (tuple(np.shape(value)), jnp.result_type(value))
        if got != (tuple(shape), dtype):
            raise ValueError(
                f"{caller}: `{name}`.{field} must be {dtype} of shape {tuple(shape)} for a weight "
                f"of shape {tuple(rhs_shape)} ({recipe.name}); got "
                f"{'None' if got is None else f'{got[1]} {got[0]}'}. {fix}"
            )


def _layout(k_major: bool) -> str:
    return "K-major ([G, N, K] in memory)" if k_major else "N-major ([G, K, N] in memory)"
