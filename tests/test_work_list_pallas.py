"""The work list as one Pallas Triton kernel (``work_list_pallas``) against the reference's XLA
ops (``work_list.work_items``), element for element; on a CPU in Pallas' interpreter."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxmoe.ops.grouped_matmul import work_list, work_list_pallas


def assert_equal_to_reference(sizes, num_rows, block_m, tile_align):
    sizes = jnp.asarray(sizes, jnp.int32)
    got = work_list_pallas.work_items(
        sizes, num_rows, block_m, tile_align=tile_align, interpret=True
    )
    want = work_list_pallas.kernel_work_list(
        sizes, num_rows, block_m, tile_align=tile_align, on_gpu=False
    )
    for name, a, b in zip(
        ("work_counts", "work_group", "first_row", "offsets"), got, want, strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


@pytest.mark.parametrize("tile_align", [None, 8], ids=["grid", "group_start"])
@pytest.mark.parametrize(
    "sizes, num_rows",
    [
        ([70, 0, 3, 100, 40], 256),  # empty group, a group inside a tile, a tail
        ([0, 256, 0], 256),  # one group holds every row: no tail
        ([0, 0], 128),  # no rows at all: every item is the tail's or unused
        ([128] * 8, 1024),  # balanced, on the tile grid
    ],
)
def test_kernel_equals_the_reference(sizes, num_rows, tile_align):
    assert_equal_to_reference(sizes, num_rows, 128, tile_align)


def test_many_groups_span_several_programs():
    # 130 groups (a 256-wide interval vector), 700 work items: eleven programs of 64.
    sizes = np.random.default_rng(1).multinomial(60_000, np.full(130, 1 / 130))
    assert_equal_to_reference(sizes, 65_536, 128, 8)


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=20),
    extra_tiles=st.integers(0, 3),
    tile_align=st.sampled_from([None, 8, 16]),
    block_m=st.sampled_from([64, 128]),
)
def test_kernel_equals_the_reference_on_random_sizes(sizes, extra_tiles, tile_align, block_m):
    num_rows = (-(-max(sum(sizes), 1) // block_m) + extra_tiles) * block_m
    assert_equal_to_reference(sizes, num_rows, block_m, tile_align)


def test_lowers_for_cuda_to_one_kernel():
    fn = jax.jit(
        functools.partial(work_list_pallas.work_items, num_rows=65_536, block_m=128, tile_align=8)
    )
    text = (
        fn.trace(jax.ShapeDtypeStruct((128,), jnp.int32))
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    # One Triton launch is the whole computation: no XLA op beside it.
    assert text.count("stablehlo.custom_call @__gpu$xla.gpu.triton") == 1
    assert re.findall(r"stablehlo\.\w+", text) == ["stablehlo.custom_call"]


def test_list_length_is_the_reference_bound():
    got = work_list_pallas.work_items(jnp.asarray([5, 7], jnp.int32), 256, 128, interpret=True)
    assert got[1].shape == (work_list.max_work_items(256, 2, 128),)
