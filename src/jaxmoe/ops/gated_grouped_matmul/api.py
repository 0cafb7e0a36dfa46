"""``gated_grouped_matmul``: the public entry point. Checks the arguments, picks fused or
unfused."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.arrays import as_array, check_nonnegative
from jaxmoe.ops.gated_grouped_matmul import primitives
from jaxmoe.ops.gated_grouped_matmul.base import GatedGroupedMatmulBackend, check_gated_args
from jaxmoe.ops.gated_grouped_matmul.reference import unfused
from jaxmoe.ops.grouped_matmul.api import default_backend_name, grouped_matmul, resolve_backend
from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend, clip_group_sizes


# Imported lazily: Pallas pulls in Mosaic lowering code that a CPU user never needs.
def _auto_fused_backend(grouped: GroupedMatmulBackend) -> GatedGroupedMatmulBackend:
    from jaxmoe.ops.gated_grouped_matmul.pallas_mosaic import PallasMosaicGatedGroupedMatmul

    return PallasMosaicGatedGroupedMatmul(grouped=grouped)


def gated_grouped_matmul(
    lhs: jax.Array,
    rhs_gate: jax.Array,
    rhs_up: jax.Array,
    group_sizes: jax.Array,
    *,
    activation: str,
    backend: str | GroupedMatmulBackend | GatedGroupedMatmulBackend | None = None,
) -> jax.Array:
    r"""Per row group ``g``: ``act(lhs @ rhs_gate[g]) * (lhs @ rhs_up[g])`` (a gated FFN's half).

    With ``s_g = group_sizes[0] + ... + group_sizes[g-1]`` and ``rows = s_g : s_g +
    group_sizes[g]``::

        out[rows] = act(lhs[rows] @ rhs_gate[g]) * (lhs[rows] @ rhs_up[g])
        out[sum(group_sizes):] = 0

    ``act`` is SiLU (``"swiglu"``) or tanh-GELU (``"geglu"``). Groups are as in
    :func:`jaxmoe.ops.grouped_matmul.grouped_matmul` (empty allowed, truncated at ``M``).
    Differentiable in ``lhs``, ``rhs_gate`` and ``rhs_up`` to any order, with the same
    derivatives as the unfused composition; works under ``jit``, ``vmap`` and ``shard_map``.

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      rhs_gate: ``[G, K, F]`` gate weights.
      rhs_up: ``[G, K, F]`` up weights.
      group_sizes: ``[G]`` integer row counts, >= 0.
      activation: ``"swiglu"`` or ``"geglu"``.
      backend: ``None``/``"auto"``: on a Hopper GPU, for bf16/fp16 operands with ``M``, ``K``,
        ``F`` multiples of its blocks and ``K <= 4096`` (:data:`AUTO_FUSED_MAX_K`, measured),
        the fused Mosaic GPU kernel (forward; the derivative's
        products on ``grouped_matmul``'s ``"auto"``); otherwise, and on other platforms, two
        grouped matmuls on the ``"auto"`` backend and ``act(gate) * up`` in ``jnp``. A grouped
        matmul backend (a name or object): that unfused composition on it, unchanged. A
        :class:`GatedGroupedMatmulBackend` (e.g. ``PallasMosaicGatedGroupedMatmul()``): that
        fused implementation, ``NotImplementedError`` where it cannot run.

    Returns:
      ``[M, F]`` in ``lhs``'s dtype.

    Example::

      >>> x = jnp.ones((3, 2)); w = jnp.ones((2, 2, 1))
      >>> gated_grouped_matmul(x, w, w, jnp.array([1, 1]), activation="swiglu")[:, 0]
      Array([3.5231884, 3.5231884, 0.       ], dtype=float32)

    References: Shazeer, GLU Variants Improve Transformer (2020).
    """
    lhs, rhs_gate, rhs_up, group_sizes = (
        as_array(value, name, "gated_grouped_matmul")
        for value, name in (
            (lhs, "lhs"),
            (rhs_gate, "rhs_gate"),
            (rhs_up, "rhs_up"),
            (group_sizes, "group_sizes"),
        )
    )
    check_gated_args(lhs, rhs_gate, rhs_up, group_sizes, activation)
    check_nonnegative(
        group_sizes,
        "group_sizes",
        "gated_grouped_matmul",
        "A group holds a count of rows: pass 0 for an empty group.",
    )
    kernel = _fused_backend(backend, lhs, rhs_gate, group_sizes)
    if kernel is None:
        gate, up = (
            grouped_matmul(lhs, rhs, group_sizes, backend=backend) for rhs in (rhs_gate, rhs_up)
        )
        return unfused(gate, up, activation).astype(lhs.dtype)
    group_sizes = clip_group_sizes(group_sizes, lhs.shape[0])
    (hidden,) = primitives.gated_gmm(
        lhs, rhs_gate, rhs_up, group_sizes, kernel=kernel, activation=activation, residuals=False
    )
    return hidden


# ``"auto"`` fuses only up to this contraction depth. Measured on an H100 (forward, fused /
# unfused; benchmarks/results/raw/h100-fused-glu run1/run2): K=2048 (Qwen3-like) 1.19/1.28x,
# K=4096 (Mixtral-like) 1.04/1.02x, K=7168 (DeepSeek-like) 0.98/0.95x. The fused tile is
# 128 columns per projection against the unfused kernel's 256: on long K loops, where the
# unfused kernel is compute-bound, the narrower wgmma costs more than the saved traffic of
# gate and up (which does not grow with K).
AUTO_FUSED_MAX_K = 4096


def _fused_backend(backend, lhs, rhs_gate, group_sizes) -> GatedGroupedMatmulBackend | None:
    """The fused implementation to run, or ``None`` for the unfused composition."""
    if isinstance(backend, GatedGroupedMatmulBackend):
        reason = backend.unsupported_reason(lhs, rhs_gate, group_sizes)
        if reason is not None:
            raise NotImplementedError(
                f"gated_grouped_matmul backend {backend.name!r} (fused): lhs {lhs.shape} "
                f"{jnp.dtype(lhs.dtype)}, rhs_gate {rhs_gate.shape}: {reason}. Pass backend="
                "None ('auto'), which takes the unfused composition wherever it does not apply."
            )
        return backend
    if backend not in (None, "auto") or default_backend_name() != "pallas":
        return None  # a named grouped matmul backend stays what it is; no fused kernel off GPU
    if lhs.shape[1] > AUTO_FUSED_MAX_K:
        return None
    kernel = _auto_fused_backend(resolve_backend("auto"))
    return kernel if kernel.unsupported_reason(lhs, rhs_gate, group_sizes) is None else None
