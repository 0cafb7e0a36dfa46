r"""The grouped matmul kernels' work list (:mod:`.work_list`) as one Pallas Triton kernel.

Built from XLA ops (:func:`.work_list.work_items`, the reference) the list costs 5-9 small
kernel launches before each grouped matmul, on the critical path: 8.5 us on Mixtral's products
(0.36% of a 2.4 ms product), 17 us on Qwen3's (5.7% of a 0.3 ms one) (H200, jax 0.11.2,
``benchmarks/results/raw/h100-run19/call6``). Here it is one launch: each program takes
``WORK_BLOCK`` work items and recomputes, for itself, the two prefix sums over the ``G + 1``
intervals (``G`` is at most a few hundred), the interval of each of its items (a comparison
against the intervals' item ends, as ``searchsorted``) and the item's first row; program 0 also
writes the offsets and the counts. Integer arithmetic throughout, so the result equals the
reference's element for element (the tests compare them on random sizes).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jaxmoe import compat
from jaxmoe.ops.grouped_matmul import work_list

Array = jax.Array

# Work items per program: a [WORK_BLOCK, G + 2 rounded up to a power of two] comparison each.
WORK_BLOCK = 64


def kernel_work_list(
    group_sizes: Array, num_rows: int, block_m: int, *, tile_align: int | None, on_gpu: bool
) -> tuple[Array, Array, Array, Array]:
    """The work list a grouped matmul kernel reads, ``(work_counts, work_group, work_first_row,
    offsets)`` as :func:`work_items`: from its one kernel on a GPU, from the reference's XLA
    ops elsewhere (the kernels' interpreters on a CPU)."""
    if on_gpu:
        return work_items(group_sizes, num_rows, block_m, tile_align=tile_align)
    work_group, work_first_row, offsets = work_list.work_items(
        group_sizes, num_rows, block_m, tile_align=tile_align
    )
    num_groups = group_sizes.shape[0]
    work_counts = jnp.stack(
        [jnp.sum(work_group < num_groups), jnp.sum(work_group == num_groups)]
    ).astype(jnp.int32)
    return work_counts, work_group, work_first_row, offsets


def work_items(
    group_sizes: Array,
    num_rows: int,
    block_m: int,
    *,
    tile_align: int | None = None,
    interpret: bool = False,
) -> tuple[Array, Array, Array, Array]:
    """``(work_counts[2], work_group[W], work_first_row[W], offsets[G + 2])``: the reference's
    three arrays (:func:`.work_list.work_items`) and ``work_counts = [items of the groups, items
    of the tail]``, in one kernel launch."""
    align = tile_align or block_m
    if block_m % align:
        raise ValueError(f"tile_align={tile_align} must divide block_m={block_m}")
    num_groups = group_sizes.shape[0]
    num_work = work_list.max_work_items(num_rows, num_groups, block_m)
    intervals = max(16, pl.next_power_of_2(num_groups + 2))
    kernel = functools.partial(
        _work_list_kernel,
        num_groups=num_groups,
        num_rows=num_rows,
        num_work=num_work,
        block_m=block_m,
        align=align,
        intervals=intervals,
    )
    int32 = jnp.int32
    call = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((2,), int32),
            jax.ShapeDtypeStruct((num_work,), int32),
            jax.ShapeDtypeStruct((num_work,), int32),
            jax.ShapeDtypeStruct((num_groups + 2,), int32),
        ),
        grid=(pl.cdiv(num_work, WORK_BLOCK),),
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="jaxmoe_work_list",
    )
    with compat.quiet_triton_deprecation():
        return call(group_sizes.astype(int32))


def _work_list_kernel(
    sizes_ref,
    counts_ref,
    group_ref,
    first_row_ref,
    offsets_ref,
    *,
    num_groups,
    num_rows,
    num_work,
    block_m,
    align,
    intervals,
):
    # Interval g of [0, intervals): the groups (g < G), the tail (g == G), nothing after.
    g = jnp.arange(intervals, dtype=jnp.int32)
    is_group, is_interval = g < num_groups, g <= num_groups
    sizes = pltriton.load(sizes_ref.at[pl.ds(0, intervals)], mask=is_group, other=0)
    ends = jnp.cumsum(sizes)
    total = jnp.sum(sizes)
    tail = jnp.where(g == num_groups, num_rows - total, 0)
    sizes = jnp.where(is_group, sizes, tail)
    ends = jnp.where(is_group, ends, num_rows)
    starts = ends - sizes
    tiles_from = starts // align * align
    counts = jnp.where((sizes > 0) & is_interval, -(-(ends - tiles_from) // block_m), 0)
    item_end = jnp.cumsum(counts)

    work = pl.program_id(0) * WORK_BLOCK + jnp.arange(WORK_BLOCK, dtype=jnp.int32)
    # searchsorted(item_end[: G + 1], work, side="right"): G + 1 marks an unused item.
    before = (item_end[None, :] <= work[:, None]) & is_interval[None, :]
    work_group = jnp.sum(before.astype(jnp.int32), axis=1)
    picked = g[None, :] == jnp.minimum(work_group, num_groups)[:, None]

    def pick(values):  # values[min(work_group, G)] per item
        return jnp.sum(jnp.where(picked, values[None, :], 0), axis=1)

    index = work - (pick(item_end) - pick(counts))  # the item's place in its interval
    first_row = jnp.maximum(pick(starts), pick(tiles_from) + index * block_m)
    first_row = jnp.where(work_group <= num_groups, first_row, 0)
    in_list = work < num_work
    pltriton.store(
        group_ref.at[pl.ds(pl.program_id(0) * WORK_BLOCK, WORK_BLOCK)], work_group, mask=in_list
    )
    pltriton.store(
        first_row_ref.at[pl.ds(pl.program_id(0) * WORK_BLOCK, WORK_BLOCK)], first_row, mask=in_list
    )

    @pl.when(pl.program_id(0) == 0)
    def _offsets_and_counts():
        # offsets = [0, end_0, ..., end_{G-1}, M]: the intervals' starts, then M.
        offsets = jnp.where(is_interval, starts, num_rows)
        pltriton.store(offsets_ref.at[pl.ds(0, intervals)], offsets, mask=g < num_groups + 2)
        group_items = jnp.sum(jnp.where(g == num_groups - 1, item_end, 0))
        tail_items = jnp.sum(jnp.where(g == num_groups, counts, 0))
        two = jnp.arange(16, dtype=jnp.int32)
        pltriton.store(
            counts_ref.at[pl.ds(0, 16)],
            jnp.where(two == 0, group_items, tail_items),
            mask=two < 2,
        )
