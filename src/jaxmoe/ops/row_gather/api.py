"""``gather_rows``: the public entry point. Checks the arguments and dispatches to a backend.

``out[i] = values[index[i]]`` for ``values`` ``[T, H]`` and ``index`` ``[R]``, zeros where
``index[i]`` is outside ``[0, T)`` (the permutation's sentinel for padding and dropped rows);
with ``row_scale`` ``[R]``, ``out[i] = row_scale[i] * values[index[i]]``, the product in float32
and cast back to ``values.dtype``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.ops.row_gather import pallas_triton, xla

BACKEND_NAMES = ("auto", "xla", "pallas_triton")
# What ``"auto"`` sends to the kernel on a GPU: the float rows it was measured on (bf16) and
# their wider and equal-width kin; anything else takes XLA's gather.
_KERNEL_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def _on_gpu() -> bool:
    """Whether ``"auto"`` may pick the kernel: JAX's default backend is a GPU (the grouped
    matmul's rule)."""
    return jax.default_backend() == "gpu"


def _check(values, index, row_scale) -> None:
    if values.ndim != 2:
        raise ValueError(f"gather_rows: `values` must be 2-D [T, H]; got shape {values.shape}.")
    if index.ndim != 1 or not jnp.issubdtype(index.dtype, jnp.integer):
        raise ValueError(
            f"gather_rows: `index` must be a 1-D integer array [R]; got {index.dtype} of shape "
            f"{index.shape}."
        )
    if row_scale is not None and (
        row_scale.shape != index.shape or not jnp.issubdtype(row_scale.dtype, jnp.floating)
    ):
        raise ValueError(
            f"gather_rows: `row_scale` must be a float array shaped like `index` {index.shape}; "
            f"got {row_scale.dtype} of shape {row_scale.shape}."
        )


def gather_rows(
    values: jax.Array,
    index: jax.Array,
    *,
    row_scale: jax.Array | None = None,
    backend: str = "auto",
    interpret: bool = False,
) -> jax.Array:
    """``values[index]`` by rows, zeros for out-of-range entries, each row scaled if asked.

    Args:
      values: ``[T, H]``.
      index: ``[R]`` integers; entries outside ``[0, T)`` give zero rows.
      row_scale: optional ``[R]`` floats: row ``i`` is ``row_scale[i] * values[index[i]]``
        (float32 product, cast to ``values.dtype``).
      backend: ``"xla"`` (one ``lax.gather``), ``"pallas_triton"`` (a kernel; raises
        ``NotImplementedError`` for shapes it does not take), or ``"auto"``: the kernel where
        JAX's default backend is a GPU (the grouped matmul's rule) and the shapes and dtype
        suit it, XLA elsewhere.
      interpret: run the Pallas kernel in Pallas' interpreter (CPU tests).

    Returns:
      ``[R, H]`` of ``values.dtype``.
    """
    values, index = jnp.asarray(values), jnp.asarray(index)
    row_scale = None if row_scale is None else jnp.asarray(row_scale)
    _check(values, index, row_scale)
    if backend == "xla":
        return xla.gather_rows(values, index, row_scale=row_scale)
    if backend == "pallas_triton":
        return pallas_triton.gather_rows(values, index, row_scale=row_scale, interpret=interpret)
    if backend != "auto":
        raise ValueError(
            f"gather_rows: unknown `backend` {backend!r}; choose one of {BACKEND_NAMES}."
        )
    suits_kernel = (
        _on_gpu()
        and values.dtype in _KERNEL_DTYPES
        and pallas_triton.unsupported_reason(values, index) is None
    )
    if suits_kernel:
        return pallas_triton.gather_rows(values, index, row_scale=row_scale, interpret=interpret)
    return xla.gather_rows(values, index, row_scale=row_scale)
