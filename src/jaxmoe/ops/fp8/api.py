"""``fp8_grouped_matmul`` and ``scaled_grouped_matmul``: dispatch to a backend, the custom VJP."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.forward_mode import FP8_FORWARD_MODE_REASON, refuse_forward_mode
from jaxmoe.ops.fp8 import columnwise_pallas
from jaxmoe.ops.fp8.base import ScaledGroupedMatmulBackend, check_scaled_args
from jaxmoe.ops.fp8.columnwise import quantize_columnwise
from jaxmoe.ops.fp8.quantize import dequantize, quantize, scale_shape
from jaxmoe.ops.fp8.recipe import Fp8Recipe, resolve_recipe
from jaxmoe.ops.fp8.reference import ReferenceScaledGroupedMatmul
from jaxmoe.ops.fp8.weights import (
    Fp8Weights,
    check_fp8_weights,
    make_fp8_weights,
)
from jaxmoe.ops.fp8.xla import XlaScaledGroupedMatmul
from jaxmoe.ops.grouped_matmul.api import default_backend_name
from jaxmoe.ops.grouped_matmul.base import check_grouped_matmul_args, clip_group_sizes
from jaxmoe.option_names import GROUPED_MATMUL_BACKENDS


# Imported lazily, as the bf16 grouped matmul does: Pallas pulls in Mosaic GPU lowering code that
# a CPU user never needs.
def _pallas_backend(fallback: ScaledGroupedMatmulBackend | None = None):
    from jaxmoe.ops.fp8.pallas_mosaic import PallasMosaicScaledGroupedMatmul

    return PallasMosaicScaledGroupedMatmul(fallback=fallback)


_BACKENDS = {
    "reference": ReferenceScaledGroupedMatmul,
    "xla": XlaScaledGroupedMatmul,
    "pallas": _pallas_backend,
}
FP8_BACKEND_NAMES = ("auto", *_BACKENDS)


def resolve_fp8_backend(backend, platform: str | None = None) -> ScaledGroupedMatmulBackend:
    """``None``/``"auto"``, a name, or a backend object.

    ``"auto"`` on a GPU ``platform`` (default: JAX's default backend) is the Mosaic GPU FP8
    kernel (``"pallas"``) where it applies (a Hopper, rowwise or 128-blockwise, e4m3,
    block-aligned shapes) with the XLA backend taking the rest; elsewhere ``"xla"``. The name
    ``"pallas"`` never falls back: it raises ``NotImplementedError`` saying why.

    Raises:
      NotImplementedError: a grouped-matmul backend with no FP8 kernel (``"pallas_triton"``):
        the FP8 path never falls back silently from a named backend.
      ValueError: any other value.
    """
    if isinstance(backend, ScaledGroupedMatmulBackend):
        return backend
    if backend is None or backend == "auto":
        if default_backend_name(platform) == "pallas":  # a GPU
            return _pallas_backend(fallback=XlaScaledGroupedMatmul())
        return XlaScaledGroupedMatmul()
    if isinstance(backend, str) and backend in _BACKENDS:
        return _BACKENDS[backend]()
    if isinstance(backend, str) and backend in GROUPED_MATMUL_BACKENDS:
        raise NotImplementedError(
            f"fp8_grouped_matmul: backend {backend!r} has no FP8 kernel yet; use one of "
            f"{FP8_BACKEND_NAMES} ('pallas' is the Mosaic GPU FP8 kernel; 'xla' runs "
            "lax.ragged_dot on the FP8 operands)."
        )
    raise ValueError(
        f"fp8_grouped_matmul: unknown `backend` {backend!r}; choose one of {FP8_BACKEND_NAMES} "
        "or pass a jaxmoe.ops.fp8.ScaledGroupedMatmulBackend object."
    )


def scaled_grouped_matmul(
    lhs_q: jax.Array,
    lhs_scale: jax.Array,
    rhs_q: jax.Array,
    rhs_scale: jax.Array,
    group_sizes: jax.Array,
    *,
    recipe: str | Fp8Recipe = "rowwise",
    backend: str | ScaledGroupedMatmulBackend | None = None,
    preferred_element_type=jnp.bfloat16,
) -> jax.Array:
    r"""The grouped matmul of already-quantized FP8 operands, scales applied: forward only.

    ``out[s_g : s_g + n_g] = dequantize(lhs)[s_g : s_g + n_g] @ dequantize(rhs)[g]``, rows past
    ``sum(group_sizes)`` zero, computed as FP8 products accumulated in float32 and scaled in the
    epilogue (rowwise) or per K block (blockwise); see :mod:`jaxmoe.ops.fp8.recipe`. This is the
    entry point for callers that quantize elsewhere (e.g. fused into the permutation); it is not
    differentiable (FP8 inputs): use :func:`fp8_grouped_matmul` for training.

    Args:
      lhs_q: ``[M, K]`` float8, rows sorted by group.
      lhs_scale: float32, ``[M, 1]`` (rowwise) or ``[M, ceil(K/b)]`` (blockwise).
      rhs_q: ``[G, K, N]`` float8.
      rhs_scale: float32, ``[G, 1, N]`` (rowwise) or ``[G, ceil(K/b), ceil(N/b)]`` (blockwise).
      group_sizes: ``[G]`` integer row counts.
      recipe: ``"rowwise"``, ``"blockwise"`` or an :class:`Fp8Recipe` (the scales' layout).
      backend: ``None``/``"auto"`` (see :func:`resolve_fp8_backend`), ``"reference"``, ``"xla"``,
        ``"pallas"`` (the Mosaic GPU kernel on a Hopper: e4m3, rowwise or blockwise with
        ``block_size`` 128) or a backend object.
      preferred_element_type: dtype of the result (default bfloat16).

    Example::

      >>> x = jnp.arange(1.0, 4.0)[:, None] * jnp.ones((3, 4)); w = jnp.ones((1, 4, 2))
      >>> recipe = Fp8Recipe("rowwise")
      >>> x_q, x_s = quantize(x, recipe.lhs_blocks); w_q, w_s = quantize(w, recipe.rhs_blocks)
      >>> scaled_grouped_matmul(x_q, x_s, w_q, w_s, jnp.array([3]), recipe=recipe)[:, 0]
      Array([4, 8, 12], dtype=bfloat16)
    """
    recipe = resolve_recipe(recipe, "scaled_grouped_matmul")
    check_scaled_args(lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, recipe)
    if not jnp.issubdtype(preferred_element_type, jnp.floating):
        raise ValueError(
            "scaled_grouped_matmul: `preferred_element_type` must be a floating dtype; got "
            f"{preferred_element_type}. Use jnp.bfloat16 or jnp.float32."
        )
    impl = resolve_fp8_backend(backend)
    group_sizes = clip_group_sizes(jnp.asarray(group_sizes), jnp.shape(lhs_q)[0])
    return impl.scaled_gmm(
        jnp.asarray(lhs_q),
        jnp.asarray(lhs_scale),
        jnp.asarray(rhs_q),
        jnp.asarray(rhs_scale),
        group_sizes,
        recipe=recipe,
        out_dtype=jnp.dtype(preferred_element_type),
    )


def _wgrad_operand(x, group_sizes, dtype, impl):
    """``quantize_columnwise(x, group_sizes, dtype)``: on a GPU with the Mosaic backend (the one
    reading K-major weights) by the two Pallas passes (:mod:`.columnwise_pallas`); XLA's
    fusion of the same gather, cast and transpose is several times slower (docs/kernels.md,
    'FP8 quantizers')."""
    if impl.k_major_weights and columnwise_pallas.supports(x.shape, x.dtype, dtype):
        return columnwise_pallas.quantize_columnwise_pallas(x, group_sizes)
    return quantize_columnwise(x, group_sizes, dtype)


def _forward(lhs, rhs, rhs_fp8, lhs_fp8, group_sizes, recipe, impl, out_dtype):
    # lhs_fp8: the caller quantized the rows already (e.g. each token once, before the
    # permutation copied it K times): the same bits as quantizing lhs here.
    lhs_q, lhs_scale = lhs_fp8 or quantize(lhs, recipe.lhs_blocks, recipe.dtype)
    if rhs_fp8 is None:
        rhs_fp8 = make_fp8_weights(rhs, recipe, impl.k_major_weights)
    rhs_q, rhs_scale = rhs_fp8.forward_operand()
    out = impl.scaled_gmm(
        lhs_q, lhs_scale, rhs_q, rhs_scale, group_sizes, recipe=recipe, out_dtype=out_dtype
    )
    # The wgrad's activations: FP8 wgrad re-quantizes them per (group, column), transposed and
    # padded (columnwise.py); the high-precision one reads the forward's FP8 operand.
    if recipe.fp8_wgrad(*rhs.shape[1:]):
        lhs_saved = _wgrad_operand(lhs, group_sizes, recipe.dtype, impl)
    else:
        lhs_saved = (lhs_q, lhs_scale)
    # Saved for backward: the FP8 activations (half the bytes of bf16: the exact operand the
    # forward used, or the wgrad's own), the weights as given (a parameter: alive anyway, read
    # for its dtype) and the FP8 weights with the dgrad's operand. Uncached, that operand is
    # made here with the forward's (one pass pair over the weights per step: on a GPU both in
    # two Pallas passes, 1.08 ms per Mixtral weight on an H100, against 2.9 ms for XLA's
    # forward operand then the dgrad's in the backward), at 0.5 bytes per weight of residual
    # memory (rowwise; blockwise reuses the forward's, transposed). A cache (rhs_fp8) costs no
    # pass at all.
    return out, (lhs_saved, rhs, rhs_fp8, group_sizes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _fp8_grouped_matmul(lhs, rhs, rhs_fp8, lhs_fp8, group_sizes, recipe, impl, out_dtype):
    return _forward(lhs, rhs, rhs_fp8, lhs_fp8, group_sizes, recipe, impl, out_dtype)[0]


def _fp8_grouped_matmul_bwd(recipe, impl, out_dtype, residuals, grad_out):
    lhs_saved, rhs, rhs_fp8, group_sizes = residuals
    # dgrad: d lhs = d out @ rhs[g]^T, a contraction over N. Both operands are quantized with the
    # forward's layout turned to that contraction: d out like an activation (rowwise: per row;
    # blockwise: 1 x b tiles along N), rhs^T [G, N, K] like a weight (rowwise: per (g, k);
    # blockwise: the same b x b blocks, transposed: Fp8Weights.dgrad_operand).
    grad_q, grad_scale = quantize(grad_out, recipe.lhs_blocks, recipe.grad_dtype)
    rhs_t_q, rhs_t_scale = rhs_fp8.dgrad_operand()
    grad_lhs = impl.scaled_gmm(  # rhs.dtype is lhs's dtype (checked)
        grad_q, grad_scale, rhs_t_q, rhs_t_scale, group_sizes, recipe=recipe, out_dtype=rhs.dtype
    )
    # wgrad: d rhs[g] = lhs_g^T @ d out_g, a contraction over the group's rows (tokens). The
    # forward's per-token scales vary along it, so no epilogue can apply them. FP8: both
    # operands re-quantized with one scale per (group, column), constant along the tokens.
    # High precision: the dequantized FP8 activations in the gradient's dtype (bf16 operands,
    # float32 accumulation: tensor cores; a float32 product here ran the Mixtral layer's
    # backward at 1/5 of the bf16 layer's speed on an H100).
    if recipe.fp8_wgrad(*rhs.shape[1:]):
        lhs_t_q, lhs_col_scale, starts = lhs_saved
        grad_t_q, grad_col_scale, _ = _wgrad_operand(grad_out, group_sizes, recipe.grad_dtype, impl)
        grad_rhs = impl.scaled_tgmm(
            lhs_t_q,
            lhs_col_scale,
            grad_t_q,
            grad_col_scale,
            starts,
            group_sizes,
            out_dtype=rhs.dtype,
        )
    else:
        lhs = dequantize(*lhs_saved, recipe.lhs_blocks).astype(grad_out.dtype)
        grad_rhs = impl.tgmm(lhs, grad_out, group_sizes, out_dtype=rhs.dtype)
    # The FP8 weights and activations given are constants (the master weight rhs and the
    # high-precision lhs take the gradients): None is their zero cotangent.
    return grad_lhs, grad_rhs, None, None, None


_fp8_grouped_matmul.defvjp(_forward, _fp8_grouped_matmul_bwd)


def fp8_grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    recipe: str | Fp8Recipe = "rowwise",
    backend: str | ScaledGroupedMatmulBackend | None = None,
    preferred_element_type=None,
    rhs_fp8: Fp8Weights | None = None,
    lhs_fp8: tuple[jax.Array, jax.Array] | None = None,
) -> jax.Array:
    r""":func:`jaxmoe.grouped_matmul` with both operands quantized to FP8 by ``recipe``.

    Forward: ``out = scaled_grouped_matmul(*quantize(lhs), *quantize(rhs))``, i.e. with
    ``Q`` the recipe's quantize-dequantize (:mod:`jaxmoe.ops.fp8.recipe`)::

        out[s_g : s_g + n_g] = Q_act(lhs)[s_g : s_g + n_g] @ Q_w(rhs)[g]      (rows past: 0)

    Backward (a custom VJP; ``Q`` passes gradients straight through, as in every FP8 recipe):

    * dgrad ``d lhs = Q_grad(d out) @ Q_w'(rhs[g])^T``: FP8 (``recipe.grad_dtype``, e4m3 by
      default) with the gradient scaled like an activation along N (rowwise: per token;
      blockwise: 1 x 128 tiles) and the weight re-quantized for a contraction over N (rowwise:
      one scale per input channel k; blockwise: the same 128 x 128 blocks, so the forward's
      FP8 weights are reused, transposed). Both weight operands are made in the forward
      (:func:`jaxmoe.ops.fp8.weights.make_fp8_weights`; on a GPU one two-pass Pallas kernel for
      rowwise) and the dgrad's is saved for the backward. This is the DeepSeek-V3 dgrad and
      TransformerEngine's "columnwise" weight copy.
    * wgrad ``d rhs[g] = Q_act(lhs)_g^T @ d out_g`` (``recipe.wgrad="high"``): high
      precision (the gradient's dtype, float32 accumulation) on the saved FP8 activations,
      dequantized. The row scales of both operands vary along this product's contraction (the
      tokens): no epilogue can apply them; this is torchao's ``rowwise_with_gw_hp`` recipe.
      ``recipe.wgrad="fp8"`` (rowwise): ``d rhs[g] = Q_col(lhs)_g^T @ Q_col(d out)_g`` with
      both operands re-quantized from high precision with one scale per (group, column)
      (:mod:`jaxmoe.ops.fp8.columnwise`: constant along the tokens, so applied in the
      epilogue), ``lhs`` in ``recipe.dtype`` and ``d out`` in ``recipe.grad_dtype``. The
      forward then saves ``Q_col(lhs)`` (transposed, groups padded to 128 rows) instead of
      ``Q_act(lhs)``. (DeepSeek-V3 re-quantizes in 128 x 1 tiles along the tokens instead.)
      ``recipe.wgrad="auto"`` (default) takes the FP8 one where ``2KN / (K + N)`` is large
      enough for it to be faster (:meth:`Fp8Recipe.fp8_wgrad`).

    Master weights and their gradients stay in ``rhs``'s dtype; ``d lhs`` has ``lhs``'s dtype.
    The activations' cast is XLA's, a pass of its own before the kernel, unless the caller
    made it where it is cheaper (``lhs_fp8``: the layer quantizes each token once, before the
    permutation copies it).

    Weights quantized once per step (``rhs_fp8``): ``Q_w(rhs)`` and ``Q_w'(rhs)^T`` above depend
    on ``rhs`` only, which does not change between an optimizer step's micro-batches; with
    ``rhs_fp8 = quantize_fp8_weights(rhs, recipe, backend)`` made once per step, the forward
    reads ``Q_w(rhs) = rhs_fp8.forward_operand()`` and the dgrad ``Q_w'(rhs)^T =
    rhs_fp8.dgrad_operand()`` instead of quantizing ``rhs`` again (TransformerEngine's
    ``is_first_microbatch``). Bit for bit the op without it; the wgrad is still ``d rhs``, in
    ``rhs``'s dtype (``rhs_fp8`` gets a zero gradient: it is a constant of the step). The
    caller promises that ``rhs_fp8`` was made from these ``rhs`` values: it cannot be checked
    under ``jit``, and a stale cache (the previous step's weights) silently runs the forward
    and dgrad on the old weights while the wgrad is taken at the new ones.

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      rhs: ``[G, K, N]``, same floating dtype as ``lhs``.
      group_sizes: ``[G]`` integer row counts (clipped to ``M``).
      recipe: ``"rowwise"`` (default), ``"blockwise"`` or an :class:`Fp8Recipe`.
      backend: ``None``/``"auto"`` (see :func:`resolve_fp8_backend`), ``"reference"``,
        ``"xla"``, ``"pallas"`` (the Mosaic GPU kernel: e4m3, rowwise or 128-blockwise, on a
        Hopper; forward and dgrad) or a :class:`ScaledGroupedMatmulBackend`;
        ``"pallas_triton"`` raises ``NotImplementedError``.
      preferred_element_type: dtype of the result (default ``lhs.dtype``).
      rhs_fp8: ``None`` (quantize ``rhs`` here) or an :class:`Fp8Weights` made from ``rhs``
        by :func:`quantize_fp8_weights` with the same ``recipe`` and ``backend``.
      lhs_fp8: ``None`` (quantize ``lhs`` here) or ``quantize(lhs, recipe.lhs_blocks,
        recipe.dtype)`` made by the caller where it is cheaper: the layer quantizes each token
        once, before the permutation copies it to its K experts' rows (per-row blocks commute
        with copying rows), and permutes the FP8 rows and scales. The forward then reads no
        ``lhs`` (with ``recipe.wgrad="high"`` its bf16 copy is dead code under ``jit``); ``lhs``
        still takes the gradient. Like ``rhs_fp8``, a promise the op cannot check.

    Returns:
      ``[M, N]``.

    Raises:
      ValueError: ``rhs_fp8`` does not match ``rhs`` (shape), ``recipe`` or the backend's
        weight layout; checked in Python, before tracing.

    Example::

      >>> x = jnp.ones((5, 256)); w = jnp.ones((2, 256, 8)) / 256
      >>> fp8_grouped_matmul(x, w, jnp.array([2, 1]), recipe="blockwise")[:, 0]
      Array([1.0000001, 1.0000001, 1.0000001, 0.       , 0.       ], dtype=float32)

    References: DeepSeek-AI 2024 (DeepSeek-V3, section 3.3: fine-grained FP8 training);
    Micikevicius et al. 2022 (FP8 formats); NVIDIA TransformerEngine (FP8 recipes);
    PyTorch torchao ``Float8LinearRecipeName`` (``ROWWISE``, ``ROWWISE_WITH_GW_HP``).
    """
    recipe = resolve_recipe(recipe)
    check_grouped_matmul_args(lhs, rhs, group_sizes, preferred_element_type)
    impl = resolve_fp8_backend(backend)
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    out_dtype = jnp.dtype(preferred_element_type or lhs.dtype)
    if rhs_fp8 is not None:
        check_fp8_weights(
            rhs_fp8,
            rhs.shape,
            recipe,
            impl.k_major_weights,
            name="rhs_fp8",
            caller="fp8_grouped_matmul",
        )
    if lhs_fp8 is not None:
        check_fp8_activations(lhs_fp8, lhs.shape, recipe)
        lhs_fp8 = tuple(jax.lax.stop_gradient(jnp.asarray(a)) for a in lhs_fp8)
    group_sizes = clip_group_sizes(jnp.asarray(group_sizes), lhs.shape[0])
    # Forward mode refused with the reason, eagerly and under jit (before JAX's own error).
    lhs, rhs = (refuse_forward_mode(a, FP8_FORWARD_MODE_REASON) for a in (lhs, rhs))
    return _fp8_grouped_matmul(lhs, rhs, rhs_fp8, lhs_fp8, group_sizes, recipe, impl, out_dtype)


def check_fp8_activations(lhs_fp8, lhs_shape: tuple, recipe: Fp8Recipe) -> None:
    """Raises ValueError unless ``lhs_fp8`` is a ``(q, scale)`` pair shaped like
    ``quantize(lhs, recipe.lhs_blocks, recipe.dtype)`` of an ``lhs_shape`` lhs."""
    expected = (
        (tuple(lhs_shape), recipe.dtype),
        (scale_shape(tuple(lhs_shape), recipe.lhs_blocks), jnp.dtype(jnp.float32)),
    )
    got = tuple(
        (tuple(np.shape(a)), jnp.result_type(a))
        for a in (lhs_fp8 if isinstance(lhs_fp8, tuple) else ())
    )
    if got != expected:
        raise ValueError(
            f"fp8_grouped_matmul: `lhs_fp8` must be the pair quantize(lhs, recipe.lhs_blocks, "
            f"recipe.dtype) returns, {expected}; got "
            f"{got or type(lhs_fp8).__name__}. Quantize lhs with the matmul's recipe."
        )


def quantize_fp8_weights(
    rhs: jax.Array,
    recipe: str | Fp8Recipe = "rowwise",
    backend: str | ScaledGroupedMatmulBackend | None = None,
) -> Fp8Weights:
    r"""``rhs [G, K, N]`` in FP8 once, for every ``fp8_grouped_matmul(rhs_fp8=...)`` of a step.

    Returns the :class:`Fp8Weights` whose forward operand is ``quantize(rhs,
    recipe.rhs_blocks)`` and whose dgrad operand is ``quantize(rhs^T, recipe.rhs_blocks)``
    (blockwise: the forward one transposed), held in the layout the resolved ``backend``'s
    kernel reads: exactly what :func:`fp8_grouped_matmul` computes from ``rhs`` on each call.
    Call it once per optimizer step, after the update, and pass the result to every
    micro-batch: a cache from before the update holds the previous step's weights. Its arrays
    carry no gradient.

    Example::

      >>> w = jnp.ones((2, 256, 8)) / 256; x = jnp.ones((5, 256))
      >>> w8 = quantize_fp8_weights(w, "blockwise", "xla")
      >>> fp8_grouped_matmul(x, w, jnp.array([2, 1]), recipe="blockwise", backend="xla",
      ...                    rhs_fp8=w8)[:, 0]
      Array([1.0000001, 1.0000001, 1.0000001, 0.       , 0.       ], dtype=float32)
    """
    recipe = resolve_recipe(recipe, "quantize_fp8_weights")
    if np.ndim(rhs) != 3 or not jnp.issubdtype(jnp.result_type(rhs), jnp.floating):
        raise ValueError(
            "quantize_fp8_weights: `rhs` must be a floating [G, K, N] weight; got "
            f"{jnp.result_type(rhs)} {np.shape(rhs)}. Pass the expert weight fp8_grouped_matmul "
            "takes as rhs."
        )
    impl = resolve_fp8_backend(backend)
    return make_fp8_weights(rhs, recipe, impl.k_major_weights)
