"""Tile variants of the MoE layer's Mosaic kernels, for benches that compare them in one process.

The layer's kernels read their default tiles (``default_mosaic_gmm_tiles``,
``default_gated_tiles``, the wgrad's ``default_mosaic_tgmm_tiles``) when traced;
:func:`default_tiles_with` swaps those functions for ones returning the defaults with some
fields changed, so a function traced inside (with jax's tracing caches cleared first) runs the
variant. :func:`compile_variant` does all of it and compiles ahead of time, which the next
variant's cache clearing cannot undo. :func:`gated_backend_with` likewise sets fields of the
layer's ``auto`` gated FFN backend (``fused_backward``, ``residuals_from_kernel``, ...).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax

from jaxmoe.ops.gated_grouped_matmul import api as gated_api
from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as gated_mosaic
from jaxmoe.ops.mosaic import tgmm_launch
from jaxmoe.ops.mosaic import tiles as mosaic_tiles

# Every place the layer's forward and input-gradient kernels read their default tiles from
# (one tile config type, ``MosaicTileConfig``): every plan of a plain gmm reads
# ``mosaic_tiles.default_mosaic_gmm_tiles`` through the module, the fused gated kernel's plan
# its own default.
DEFAULT_TILE_SITES = (
    (mosaic_tiles, "default_mosaic_gmm_tiles"),
    (gated_mosaic, "default_gated_tiles"),
)
# The wgrad's (``MosaicTgmmTileConfig``: its own fields, so never patched with the others
# unless asked by name).
WGRAD_TILE_SITES = ((tgmm_launch, "default_mosaic_tgmm_tiles"),)
# The sites by kernel: the plain gmm's (``gmm``), the fused gated kernel's (``gated``), the
# wgrad's (``wgrad``).
SITE_NAMES = {
    "gmm": "default_mosaic_gmm_tiles",
    "gated": "default_gated_tiles",
    "wgrad": "default_mosaic_tgmm_tiles",
}


def tile_sites(kernels: str) -> list:
    """The sites (:data:`DEFAULT_TILE_SITES`, :data:`WGRAD_TILE_SITES`) of ``kernels``
    (comma-separated :data:`SITE_NAMES` keys)."""
    unknown = set(kernels.split(",")) - set(SITE_NAMES)
    if unknown:
        raise ValueError(f"unknown kernels {sorted(unknown)}; choose from {sorted(SITE_NAMES)}")
    chosen = {SITE_NAMES[kernel] for kernel in kernels.split(",")}
    sites = DEFAULT_TILE_SITES + WGRAD_TILE_SITES
    return [(module, name) for module, name in sites if name in chosen]


def check_variant_fields(kernels: str, tile_variants: dict, backend_variants: dict) -> None:
    """``ValueError`` naming the flag where a variant sets a field its config lacks:
    ``tile_variants`` (name -> ``MosaicTileConfig`` changes, ``MosaicTgmmTileConfig`` for the
    wgrad) of the ``kernels`` sites, ``backend_variants`` (name -> gated backend fields)."""
    tile_types = [
        tgmm_launch.MosaicTgmmTileConfig if kernel == "wgrad" else mosaic_tiles.MosaicTileConfig
        for kernel in kernels.split(",")
    ]
    _check_fields("--tile-variants", tile_variants, tile_types)
    _check_fields(
        "--backend-variants", backend_variants, [gated_mosaic.PallasMosaicGatedGroupedMatmul]
    )


def _check_fields(flag: str, variants: dict[str, dict], types) -> None:
    """Every field a variant sets is a field of each of ``types`` (dataclasses)."""
    for name, changes in variants.items():
        for kind in types:
            unknown = set(changes) - {field.name for field in dataclasses.fields(kind)}
            if unknown:
                raise ValueError(
                    f"argument {flag}: variant {name!r} sets {', '.join(sorted(unknown))}, not "
                    f"fields of {kind.__name__}; choose from "
                    f"{', '.join(field.name for field in dataclasses.fields(kind))}"
                )


@contextlib.contextmanager
def default_tiles_with(calls: list, sites=DEFAULT_TILE_SITES, **changes):
    """The default tiles of every site (of ``sites``) with ``changes`` applied, while inside; each
    call of one appends its result to ``calls`` (proof that the variant was traced, not taken
    from a cache)."""
    saved = [(module, name, getattr(module, name)) for module, name in sites]

    def patched(*shape, default):
        calls.append(dataclasses.replace(default(*shape), **changes))
        return calls[-1]

    try:
        for module, name, default in saved:
            setattr(module, name, functools.partial(patched, default=default))
        yield
    finally:
        for module, name, default in saved:
            setattr(module, name, default)


@contextlib.contextmanager
def gated_backend_with(**fields):
    """The layer's ``auto`` gated FFN backend (on a Hopper GPU the fused Mosaic one,
    :class:`.PallasMosaicGatedGroupedMatmul`) with ``fields`` set, while inside."""
    saved = gated_api.auto_fused_backend
    gated_api.auto_fused_backend = lambda grouped: gated_mosaic.PallasMosaicGatedGroupedMatmul(
        grouped=grouped, **fields
    )
    try:
        yield
    finally:
        gated_api.auto_fused_backend = saved


def compile_variant(
    fn,
    operands,
    sites=DEFAULT_TILE_SITES,
    changes: dict | None = None,
    backend_fields: dict | None = None,
):
    """``(compiled, tiles_read)``: ``jax.jit(fn)`` compiled ahead of time for ``operands``, traced
    with the default tiles of ``sites`` changed by ``changes`` (``None``: not patched, no reads
    recorded) and the gated FFN backend's ``backend_fields`` set (:func:`gated_backend_with`),
    after clearing jax's tracing caches (a custom VJP's rule traced for another variant would
    be reused). Compiled ahead of time because a jitted function is traced again after the next
    variant's :func:`jax.clear_caches`, then outside the patch, i.e. as the default.
    ``RuntimeError`` if ``changes`` were given and no kernel read the tiles."""
    jax.clear_caches()
    tiles_read = []
    patch = contextlib.ExitStack()
    if changes is not None:
        patch.enter_context(default_tiles_with(tiles_read, sites, **changes))
    if backend_fields is not None:
        patch.enter_context(gated_backend_with(**backend_fields))
    with patch:
        compiled = jax.jit(fn).lower(*operands).compile()
    if changes is not None and not tiles_read:
        raise RuntimeError(f"no kernel read the patched default tiles ({changes})")
    return compiled, tiles_read
