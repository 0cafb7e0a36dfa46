"""The persistent grid of the Mosaic GPU kernels here: one CTA (or cluster) per SM, each
taking its share of the work round-robin; the interpreter's parameters off a GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxmoe.ops.mosaic.warpgroups import CLUSTER_AXIS, NUM_COMPUTE_WARPGROUPS
from jaxmoe.ops.pallas_common import use_interpret

_H100_SMS = 132


def interpret_params(interpret: bool | None):
    """``None`` on a GPU; Mosaic GPU's interpreter elsewhere (or when asked)."""
    if not use_interpret(interpret):
        return None
    # Not public API in jax 0.10-0.11; only the tests and CPU users reach this.
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams()


def num_sms(interpret) -> int:
    """The persistent grid's size: one CTA per SM."""
    if interpret is not None:
        return 2  # The interpreter simulates every CTA; two exercise the persistent loop.
    # Lowering for a GPU from a CPU-only host (the tests do) has no GPU to ask: an H100's count.
    return getattr(jax.devices()[0], "core_count", _H100_SMS)


def persistent_kernel(
    body, out_type, interpret_params, *, cluster_ctas: int = 1, approx_math: bool = False
):
    """``body`` as a persistent kernel: one CTA per SM, the compute warpgroups and the memory one
    (thread axis ``"wg"``), warpgroup lowering semantics; ``approx_math``: Mosaic GPU's
    approximate transcendental instructions (``MosaicTileConfig.approx_math``).

    The grid axis ``"sm"`` numbers the CTAs, or with ``cluster_ctas=2`` the clusters of two CTAs
    (each CTA's place in its cluster: axis ``CLUSTER_AXIS``)."""
    clusters = {}
    if cluster_ctas > 1:
        clusters = dict(cluster=(cluster_ctas,), cluster_names=(CLUSTER_AXIS,))
    return plgpu.kernel(
        body,
        out_type=out_type,
        grid=(grid_size(interpret_params, cluster_ctas),),
        grid_names=("sm",),
        **clusters,
        num_threads=NUM_COMPUTE_WARPGROUPS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup, approx_math=approx_math
        ),
        interpret=interpret_params,
    )


def grid_size(interpret_params, cluster_ctas: int = 1) -> int:
    """The persistent grid's workers: one CTA per SM, or one cluster per ``cluster_ctas``."""
    return max(num_sms(interpret_params) // cluster_ctas, 1)


def _worker(per_cta: bool):
    """``(index, count)`` of the workers sharing a loop: the grid's (CTAs, or clusters whose
    two CTAs take the same items), or with ``per_cta`` every CTA of a clustered grid."""
    index, count = lax.axis_index("sm"), lax.axis_size("sm")
    if per_cta:
        ctas = lax.axis_size(CLUSTER_AXIS)
        index, count = index * ctas + lax.axis_index(CLUSTER_AXIS), count * ctas
    return index, count


def round_robin_count(num_items, worker, num_workers):
    """How many of ``num_items`` items dealt round-robin to ``num_workers`` workers (items
    ``worker``, ``worker + num_workers``, ...) worker ``worker`` takes."""
    return jnp.maximum(num_items - worker + num_workers - 1, 0) // num_workers


def round_robin_index(local_item, worker, num_workers):
    """The global index of worker ``worker``'s ``local_item``-th item (as
    :func:`round_robin_count` deals them)."""
    return worker + local_item * num_workers


def cta_tile_count(num_tiles, *, per_cta: bool = False):
    """How many of ``num_tiles`` tiles (round-robin over the grid's CTAs or clusters; over all
    CTAs with ``per_cta``, in a clustered grid) this CTA takes."""
    return round_robin_count(num_tiles, *_worker(per_cta))


def cta_tile_index(local_tile, *, per_cta: bool = False):
    """The global index of this CTA's ``local_tile``-th tile (round-robin, as
    :func:`cta_tile_count`)."""
    return round_robin_index(local_tile, *_worker(per_cta))
