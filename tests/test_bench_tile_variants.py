"""``jaxmoe.bench.tile_variants``: the layer's default Mosaic tiles swapped while inside."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxmoe.bench import tile_variants
from jaxmoe.ops.gated_grouped_matmul import api as gated_api
from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as gated_mosaic
from jaxmoe.ops.grouped_matmul import ReferenceGroupedMatmul
from jaxmoe.ops.mosaic import tgmm_launch
from jaxmoe.ops.mosaic import tiles as pallas_mosaic_tiles


def test_default_tiles_with_changes_every_site_inside_and_restores_them():
    shape = (4096, 4096, 14336)
    before = pallas_mosaic_tiles.default_mosaic_gmm_tiles(*shape)
    gated_before = gated_mosaic.default_gated_tiles(*shape)
    calls = []
    assert before.stages != 3 and gated_before.stages != 3  # so that the change shows
    with tile_variants.default_tiles_with(calls, stages=3):
        # The module that every plan reads it through sees the change.
        assert pallas_mosaic_tiles.default_mosaic_gmm_tiles(*shape) == dataclasses.replace(
            before, stages=3
        )
        assert gated_mosaic.default_gated_tiles(*shape) == dataclasses.replace(
            gated_before, stages=3
        )
    assert len(calls) == 2  # each read recorded
    assert pallas_mosaic_tiles.default_mosaic_gmm_tiles(*shape) == before
    assert gated_mosaic.default_gated_tiles(*shape) == gated_before


def test_gated_backend_with_sets_the_auto_backends_fields_inside_and_restores_it():
    grouped = ReferenceGroupedMatmul()
    default = gated_api.auto_fused_backend(grouped)
    assert default.fused_backward and default.fused_input_dgrad  # the defaults
    with tile_variants.gated_backend_with(fused_backward=False, fused_input_dgrad=False):
        inside = gated_api.auto_fused_backend(grouped)
        assert not inside.fused_backward and not inside.fused_input_dgrad
        assert inside.grouped is grouped
    after = gated_api.auto_fused_backend(grouped)
    assert after.fused_backward and after.fused_input_dgrad


def test_tile_sites_picks_the_kernels_asked_and_refuses_others():
    gmm_only = tile_variants.tile_sites("gmm")
    assert {name for _, name in gmm_only} == {"default_mosaic_gmm_tiles"}
    assert len(tile_variants.tile_sites("gmm,gated")) == len(tile_variants.DEFAULT_TILE_SITES)
    calls = []
    with tile_variants.default_tiles_with(calls, gmm_only, stages=3):
        assert pallas_mosaic_tiles.default_mosaic_gmm_tiles(4096, 4096, 14336).stages == 3
        assert gated_mosaic.default_gated_tiles(4096, 4096, 14336).stages == 4
    with pytest.raises(ValueError, match="unknown kernels"):
        tile_variants.tile_sites("gmm,dgrad")


def test_the_wgrad_site_is_patched_only_by_name():
    # Its config type has fields of its own (multicast_rhs), which the gmm's lacks.
    wgrad_only = tile_variants.tile_sites("wgrad")
    assert wgrad_only == [(tgmm_launch, "default_mosaic_tgmm_tiles")]
    assert wgrad_only[0] not in tile_variants.DEFAULT_TILE_SITES
    shape = (4096, 4096, 14336)
    before = tgmm_launch.default_mosaic_tgmm_tiles(*shape)
    gmm_before = pallas_mosaic_tiles.default_mosaic_gmm_tiles(*shape)
    calls = []
    with tile_variants.default_tiles_with(calls, wgrad_only, multicast_rhs=True):
        assert tgmm_launch.default_mosaic_tgmm_tiles(*shape) == dataclasses.replace(
            before, multicast_rhs=True
        )
        assert pallas_mosaic_tiles.default_mosaic_gmm_tiles(*shape) == gmm_before
    assert len(calls) == 1
    assert tgmm_launch.default_mosaic_tgmm_tiles(*shape) == before


def test_compile_variant_keeps_its_tiles_after_the_next_variants_cache_clearing():
    def fn(x):  # reads the default tiles when traced, as the layer's kernels do
        return x * pallas_mosaic_tiles.default_mosaic_gmm_tiles(256, 256, 256).stages

    x = jnp.ones(3)
    default_stages = pallas_mosaic_tiles.default_mosaic_gmm_tiles(256, 256, 256).stages
    two, reads = tile_variants.compile_variant(fn, (x,), changes={"stages": 2})
    assert len(reads) == 1
    plain, reads = tile_variants.compile_variant(fn, (x,))  # clears jax's caches again
    assert reads == []
    np.testing.assert_array_equal(two(x), 2 * np.ones(3))
    np.testing.assert_array_equal(plain(x), default_stages * np.ones(3))
    with pytest.raises(RuntimeError, match="no kernel read"):
        tile_variants.compile_variant(lambda x: x + 1, (x,), changes={"stages": 2})
