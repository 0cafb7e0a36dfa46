r"""FP8 expert weights quantized once and reused: :class:`Fp8Weights` and its checks.

:func:`jaxmoe.ops.fp8.fp8_grouped_matmul` quantizes its weight ``rhs [G, K, N]`` on every call,
twice for the rowwise recipe (the forward operand and the dgrad's transposed one). Within one
optimizer step the weights do not change, so with gradient accumulation every micro-batch
repeats the same casts (on an H100 ~1.5 ms per Mixtral weight per pass). An
:class:`Fp8Weights` holds both operands, made once per step by
:func:`jaxmoe.ops.fp8.quantize_fp8_weights` and passed to every micro-batch's
``fp8_grouped_matmul(..., rhs_fp8=...)`` (TransformerEngine's ``is_first_microbatch``, as a
value instead of a flag)::

    forward:  (q, scale)     = quantize(rhs,              recipe.rhs_blocks)  # [G, K, N]
    dgrad:    (q_t, scale_t) = quantize(swapaxes(rhs, 1, 2), recipe.rhs_blocks)  # [G, N, K]
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

from jaxmoe.ops.fp8.quantize import quantize, scale_shape
from jaxmoe.ops.fp8.recipe import Fp8Recipe


@dataclasses.dataclass(frozen=True)
class Fp8Weights:
    """One ``[G, K, N]`` weight in FP8, as the forward and dgrad of one recipe consume it.

    A pytree: the arrays are its leaves (``None`` is an empty subtree), ``recipe`` and
    ``k_major`` are static metadata, so it passes through ``jit``, ``scan`` and ``shard_map``.

    Attributes:
      q: ``[G, K, N]`` FP8 (``recipe.dtype``), the forward operand as
        :func:`quantize_weights` returns it.
      scale: float32 ``[G, 1, N]`` (rowwise) or ``[G, ceil(K/b), ceil(N/b)]`` (blockwise).
      q_t: ``[G, N, K]`` FP8, the dgrad operand (rowwise: one scale per (g, k)); ``None`` for
        blockwise, whose dgrad operand is ``q`` transposed (:meth:`dgrad_operand`).
      scale_t: float32 ``[G, 1, K]`` (rowwise); ``None`` for blockwise.
      recipe: the :class:`Fp8Recipe` it was quantized with.
      k_major: whether ``q`` was written K-major (``[G, N, K]`` in memory), as the backend it
        was made for reads it; the values are the same bits either way.
    """

    q: jax.Array
    scale: jax.Array
    q_t: jax.Array | None
    scale_t: jax.Array | None
    recipe: Fp8Recipe
    k_major: bool

    def forward_operand(self) -> tuple[jax.Array, jax.Array]:
        """``(q, scale)``: ``[G, K, N]`` weights for ``out = lhs @ w[g]``."""
        return self.q, self.scale

    def dgrad_operand(self) -> tuple[jax.Array, jax.Array]:
        """``(q_t, scale_t)``: ``[G, N, K]`` weights for ``d lhs = d out @ w[g]^T``."""
        if self.q_t is None:  # blockwise: b x b blocks, quantize(w^T) == quantize(w)^T
            return jnp.swapaxes(self.q, 1, 2), jnp.swapaxes(self.scale, 1, 2)
        return self.q_t, self.scale_t


jax.tree_util.register_dataclass(
    Fp8Weights, data_fields=["q", "scale", "q_t", "scale_t"], meta_fields=["recipe", "k_major"]
)


def quantize_weights(rhs, recipe: Fp8Recipe, k_major: bool):
    """``quantize(rhs, recipe.rhs_blocks, recipe.dtype)``, bit for bit; with ``k_major`` the FP8
    weights are laid out ``[G, N, K]`` in memory (returned as their ``[G, K, N]`` transpose,
    which a kernel's own swap to K-major cancels).

    Why: FP8 ``wgmma`` reads the weights K-major. Quantizing ``[G, K, N]`` and letting the
    kernel's transpose fuse into the cast ran at 1.0 TB/s on an H100 (2.29 ms for a Mixtral
    ``[8, 4096, 14336]`` weight); the bf16 transpose in a pass of its own (the barrier keeps it
    out of the cast's fusion), then the quantization along the now-last K axis, took 1.56 ms
    (``benchmarks/results/raw/h100-run8/call1``). Amax, scale and cast see the same values
    either way, so the result is the same bits.
    """
    if not k_major:
        return quantize(rhs, recipe.rhs_blocks, recipe.dtype)
    rhs_t = jax.lax.optimization_barrier(jnp.swapaxes(rhs, 1, 2))
    group_block, k_block, n_block = recipe.rhs_blocks
    rhs_t_q, rhs_t_scale = quantize(rhs_t, (group_block, n_block, k_block), recipe.dtype)
    return jnp.swapaxes(rhs_t_q, 1, 2), jnp.swapaxes(rhs_t_scale, 1, 2)


def dgrad_weights(rhs, recipe: Fp8Recipe):
    """The rowwise dgrad operand: ``rhs^T [G, N, K]`` quantized for a contraction over N (one
    scale per (g, k)); ``(None, None)`` for blockwise, which transposes the forward operand."""
    if recipe.name == "blockwise":
        return None, None
    return quantize(jnp.swapaxes(rhs, 1, 2), recipe.rhs_blocks, recipe.dtype)


def make_fp8_weights(rhs, recipe: Fp8Recipe, k_major: bool) -> Fp8Weights:
    """Both operands of ``rhs`` (see the module docstring), as constants: no gradient flows
    from them back to ``rhs`` (the master weight's gradient is the op's wgrad)."""
    rhs = jax.lax.stop_gradient(jnp.asarray(rhs))
    q, scale = quantize_weights(rhs, recipe, k_major)
    q_t, scale_t = dgrad_weights(rhs, recipe)
    return Fp8Weights(q, scale, q_t, scale_t, recipe, bool(k_major))


def _expected_leaves(rhs_shape: tuple, recipe: Fp8Recipe) -> dict:
    groups, k, n = rhs_shape
    transposed = (groups, n, k)
    leaves = {
        "q": (rhs_shape, recipe.dtype),
        "scale": (scale_shape(rhs_shape, recipe.rhs_blocks), jnp.dtype(jnp.float32)),
    }
    if recipe.name != "blockwise":
        leaves["q_t"] = (transposed, recipe.dtype)
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
    if rhs_fp8.recipe != recipe:
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
    for field, (shape, dtype) in _expected_leaves(tuple(rhs_shape), recipe).items():
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
