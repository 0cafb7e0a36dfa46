"""``grouped_matmul``: the public entry point. Checks the arguments and dispatches to a backend."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.argument_checks import as_array, check_nonnegative
from jaxmoe.ops.grouped_matmul import primitives
from jaxmoe.ops.grouped_matmul.base import (
    GroupedMatmulBackend,
    check_grouped_matmul_args,
    clip_group_sizes,
)
from jaxmoe.ops.grouped_matmul.reference import ReferenceGroupedMatmul
from jaxmoe.ops.grouped_matmul.xla import XlaGroupedMatmul
from jaxmoe.option_names import GROUPED_MATMUL_BACKENDS, check_registry


# Imported lazily: Pallas pulls in Triton/Mosaic lowering code that a CPU user never needs.
def _pallas_backend(triton_fallback: bool = False) -> GroupedMatmulBackend:
    from jaxmoe.ops.grouped_matmul.pallas_mosaic import PallasMosaicGroupedMatmul

    return PallasMosaicGroupedMatmul(triton_fallback=triton_fallback)


def _pallas_triton_backend() -> GroupedMatmulBackend:
    from jaxmoe.ops.grouped_matmul.pallas_triton import PallasTritonGroupedMatmul

    return PallasTritonGroupedMatmul()


_BACKENDS = {
    "reference": ReferenceGroupedMatmul,
    "xla": XlaGroupedMatmul,
    "pallas": _pallas_backend,
    "pallas_triton": _pallas_triton_backend,
}
BACKEND_NAMES = ("auto", *_BACKENDS)
check_registry("GROUPED_MATMUL_BACKENDS", GROUPED_MATMUL_BACKENDS, BACKEND_NAMES)


def default_backend_name(platform: str | None = None) -> str:
    """The backend family ``"auto"`` means on ``platform`` (default: JAX's default backend).

    On a GPU that is ``"pallas"``, but ``"auto"`` builds it with ``triton_fallback=True`` (see
    :func:`resolve_backend`), whereas the name ``"pallas"`` never falls back.
    """
    platform = platform or jax.default_backend()
    return "pallas" if platform == "gpu" or platform == "cuda" else "xla"


def resolve_backend(
    backend: str | GroupedMatmulBackend | None, platform: str | None = None
) -> GroupedMatmulBackend:
    """Turns ``None``, ``"auto"``, a name, or a configured backend object into a backend.

    ``platform`` decides what ``"auto"`` means (default: JAX's default backend), e.g. the
    platform of a mesh's devices.
    """
    if isinstance(backend, GroupedMatmulBackend):
        return backend
    if backend is None or backend == "auto":
        backend = default_backend_name(platform)
        if backend == "pallas":
            # The measured rule (docs/kernels.md, 'Grouped matmul: the auto backend'): the
            # Mosaic kernel where it applies (Hopper, bf16/fp16, block-aligned shapes), the
            # Triton kernels elsewhere.
            return _pallas_backend(triton_fallback=True)
    if backend not in _BACKENDS:
        raise ValueError(
            f"grouped_matmul: unknown `backend` {backend!r}; choose one of {BACKEND_NAMES} or "
            "pass a configured backend object (e.g. jaxmoe.ops.grouped_matmul.XlaGroupedMatmul())."
        )
    return _BACKENDS[backend]()


def preferred_alignment(
    backend: str | GroupedMatmulBackend | None = None,
    dtype=jnp.bfloat16,
    platform: str | None = None,
) -> int:
    """Rows each group's block is best padded to for ``backend``'s kernels on ``dtype`` operands.

    What the layer pads each expert's rows to by default (``MoEConfig.alignment=None``): 1 off a
    GPU (no kernel tiles rows there); on a GPU the backend's answer
    (:meth:`GroupedMatmulBackend.preferred_alignment`): 64 where ``"auto"``/``"pallas"`` run the
    Mosaic kernels (a Hopper GPU, non-FP8 operands), else 128, the Triton and FP8 kernels' row
    tile.

    Args:
      backend: as for :func:`grouped_matmul` (a name, ``None``/``"auto"``, or a backend object).
      dtype: the operands' dtype (an FP8 dtype for the FP8 grouped matmul).
      platform: default: JAX's default backend.

    Example::

      >>> preferred_alignment("xla", jnp.bfloat16, platform="cpu")
      1
    """
    platform = platform or jax.default_backend()
    if platform not in ("gpu", "cuda"):
        return 1
    return resolve_backend(backend, platform).preferred_alignment(dtype)


def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    backend: str | GroupedMatmulBackend | None = None,
    preferred_element_type=None,
) -> jax.Array:
    r"""Multiplies consecutive row groups of ``lhs`` by their own matrix of ``rhs``.

    With ``s_g = group_sizes[0] + ... + group_sizes[g-1]``::

        out[s_g : s_g + group_sizes[g]] = lhs[s_g : s_g + group_sizes[g]] @ rhs[g]
        out[sum(group_sizes):]          = 0

    Groups may be empty; groups that would run past ``M`` are truncated at ``M``. Negative sizes
    are an error (``ValueError``) when ``group_sizes`` is concrete; a traced ``group_sizes``
    (under ``jit``, ``grad``, ``vmap``) cannot be checked, and its negative entries count as 0.
    Batched by its own rule under ``jax.vmap`` (any axis, any backend): a batch of grouped
    matmuls runs as one over the batch's groups. Accumulation is in float32; the result has
    ``lhs``'s dtype unless ``preferred_element_type`` says otherwise. Differentiable in ``lhs``
    and ``rhs`` to any order, forward and reverse: ``d lhs`` is a grouped matmul with
    ``rhs[g]^T``, ``d rhs[g] = lhs_g^T @ d out_g``, each again on the backend's kernels
    (:mod:`.primitives`). ``group_sizes`` stays on the device (no host
    sync), so the op works under ``jit``.

    Args:
      lhs: ``[M, K]`` rows sorted by group (e.g. tokens sorted expert-major).
      rhs: ``[G, K, N]`` one matrix per group (e.g. expert weights).
      group_sizes: ``[G]`` integer row counts, >= 0. Lists, tuples and NumPy arrays are
        accepted (as ``jnp.asarray`` takes them), as for ``lhs`` and ``rhs``.
      backend: ``None``/``"auto"`` (on a GPU: the Mosaic GPU kernels for the forward, dgrad and
        wgrad where they apply, i.e. Hopper, bf16/fp16 and block-aligned shapes; the Triton
        kernels for the rest; ``"xla"`` elsewhere),
        ``"reference"``, ``"xla"`` (``jax.lax.ragged_dot``), ``"pallas"`` (the Mosaic GPU
        kernels; ``NotImplementedError`` where they do not apply), ``"pallas_triton"``
        (Triton kernels only), or a configured backend object.
      preferred_element_type: dtype of the result (default: ``lhs.dtype``).

    Returns:
      ``[M, N]``.

    Example::

      >>> x = jnp.ones((5, 2)); w = jnp.stack([jnp.eye(2), 2 * jnp.eye(2)])
      >>> grouped_matmul(x, w, jnp.array([2, 1]), backend="reference")[:, 0]
      Array([1., 1., 2., 0., 0.], dtype=float32)

    References: Gale et al., MegaBlocks (2022), for grouped matmuls in dropless MoE.
    """
    lhs, rhs, group_sizes = (
        as_array(value, name, "grouped_matmul")
        for value, name in ((lhs, "lhs"), (rhs, "rhs"), (group_sizes, "group_sizes"))
    )
    check_grouped_matmul_args(lhs, rhs, group_sizes, preferred_element_type)
    check_nonnegative(
        group_sizes,
        "group_sizes",
        "grouped_matmul",
        "A group holds a count of rows: pass 0 for an empty group.",
    )
    impl = resolve_backend(backend)
    out_dtype = jnp.dtype(preferred_element_type or lhs.dtype)
    group_sizes = clip_group_sizes(group_sizes, lhs.shape[0])
    return primitives.gmm(
        lhs, rhs, group_sizes, impl=impl, transpose_rhs=False, out_dtype=out_dtype
    )
