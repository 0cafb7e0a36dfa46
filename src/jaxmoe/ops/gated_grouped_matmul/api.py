"""``gated_grouped_matmul``: the public entry point. Checks the arguments, picks fused or
unfused."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmoe.argument_checks import as_array, check_nonnegative
from jaxmoe.ops.gated_grouped_matmul import ffn_primitives, primitives
from jaxmoe.ops.gated_grouped_matmul.base import (
    GatedGroupedMatmulBackend,
    check_down_args,
    check_gated_args,
)
from jaxmoe.ops.gated_grouped_matmul.reference import unfused
from jaxmoe.ops.grouped_matmul.api import default_backend_name, grouped_matmul, resolve_backend
from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend, clip_group_sizes


# Imported lazily: Pallas pulls in Mosaic lowering code that a CPU user never needs.
def auto_fused_backend(grouped: GroupedMatmulBackend) -> GatedGroupedMatmulBackend:
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
    _check(lhs, rhs_gate, rhs_up, group_sizes, activation, "gated_grouped_matmul")
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


def gated_ffn(
    lhs: jax.Array,
    rhs_gate: jax.Array,
    rhs_up: jax.Array,
    rhs_down: jax.Array,
    group_sizes: jax.Array,
    *,
    activation: str,
    backend: str | GroupedMatmulBackend | GatedGroupedMatmulBackend | None = None,
) -> jax.Array:
    r"""Per row group ``g``: a gated FFN, ``(act(lhs @ rhs_gate[g]) * (lhs @ rhs_up[g])) @
    rhs_down[g]``.

    :func:`gated_grouped_matmul` followed by the down projection, as one op so that its backward
    can fuse the activation's derivative into the down projection's dgrad
    (:mod:`.ffn_primitives`): one kernel computes ``h_bar = y_bar @ rhs_down[g]^T`` and, in its
    epilogue, ``gate_bar = h_bar * up * act'(gate)`` and ``up_bar = h_bar * act(gate)``, where
    the unfused path writes ``h_bar`` and runs an elementwise pass over it, ``gate`` and ``up``.
    The Mosaic backend has that kernel, on by default (``fused_backward``: exact, more
    accurate, and the layer's fwd+bwd 1.01x faster on an H100). Rows past
    ``sum(group_sizes)`` are zero.
    Differentiable in ``lhs`` and the three weights to any order; works under ``jit``, ``vmap``
    and ``shard_map``.

    Args:
      lhs: ``[M, H]`` rows sorted by group.
      rhs_gate, rhs_up: ``[G, H, F]``.
      rhs_down: ``[G, F, H_out]``.
      group_sizes: ``[G]`` integer row counts, >= 0.
      activation: ``"swiglu"`` or ``"geglu"``.
      backend: as :func:`gated_grouped_matmul`'s, which picks the same kernels (the down
        projection on the grouped matmul ``backend``). A :class:`GatedGroupedMatmulBackend`
        also runs its fused backward where it has one and it applies, the unfused derivative
        on its ``grouped`` elsewhere.

    Returns:
      ``[M, H_out]`` in ``lhs``'s dtype.
    """
    lhs, rhs_gate, rhs_up, rhs_down, group_sizes = (
        as_array(value, name, "gated_ffn")
        for value, name in (
            (lhs, "lhs"),
            (rhs_gate, "rhs_gate"),
            (rhs_up, "rhs_up"),
            (rhs_down, "rhs_down"),
            (group_sizes, "group_sizes"),
        )
    )
    _check(lhs, rhs_gate, rhs_up, group_sizes, activation, "gated_ffn")
    check_down_args(rhs_gate, rhs_down)
    kernel = _fused_backend(backend, lhs, rhs_gate, group_sizes)
    if kernel is None:
        hidden = gated_grouped_matmul(
            lhs, rhs_gate, rhs_up, group_sizes, activation=activation, backend=backend
        )
        return grouped_matmul(hidden, rhs_down, group_sizes, backend=backend)
    return ffn_primitives.gated_ffn(
        lhs,
        rhs_gate,
        rhs_up,
        rhs_down,
        clip_group_sizes(group_sizes, lhs.shape[0]),
        kernel=kernel,
        activation=activation,
    )


def _check(lhs, rhs_gate, rhs_up, group_sizes, activation, op: str) -> None:
    check_gated_args(lhs, rhs_gate, rhs_up, group_sizes, activation)
    check_nonnegative(
        group_sizes, "group_sizes", op, "A group holds a count of rows: pass 0 for an empty group."
    )


# ``"auto"`` fuses only up to this contraction depth: the fused tile is 128 columns per
# projection against the unfused kernel's 256, and on long K loops, where the unfused kernel is
# compute-bound, the narrower wgmma costs more than the saved traffic of gate and up (which
# does not grow with K). Measured: docs/kernels.md, 'Fused gated kernel'.
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
    kernel = auto_fused_backend(resolve_backend("auto"))
    return kernel if kernel.unsupported_reason(lhs, rhs_gate, group_sizes) is None else None
