"""stable_ranks (each element's rank among the equal keys before it) and scatter_inverse."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxmoe
from jaxmoe import ranks
from tests import references as ref


def _ranks_reference(keys):
    seen = {}
    out = []
    for key in keys:
        out.append(seen.get(key, 0))
        seen[key] = seen.get(key, 0) + 1
    return np.asarray(out, np.int32)


@pytest.mark.parametrize("method", ranks.RANK_METHODS)
@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    st.integers(1, 6).flatmap(
        lambda num_keys: st.tuples(
            st.just(num_keys), st.lists(st.integers(0, num_keys - 1), min_size=1, max_size=40)
        )
    )
)
def test_stable_ranks_match_the_count_of_equal_keys_before(method, problem):
    num_keys, keys = problem
    got = jax.jit(ranks.stable_ranks, static_argnums=1, static_argnames="method")(
        jnp.asarray(keys, jnp.int32), num_keys, method=method
    )
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), _ranks_reference(keys))


def test_stable_ranks_method_by_size(monkeypatch):
    keys = jnp.asarray([2, 0, 2, 1, 2, 0], jnp.int32)
    want = _ranks_reference(np.asarray(keys).tolist())
    for limit in (0, 1 << 24):  # 0: every call sorts
        monkeypatch.setattr(ranks, "COUNT_MAX_ELEMENTS", limit)
        text = str(jax.make_jaxpr(lambda k: ranks.stable_ranks(k, 3))(keys))
        assert ("sort[" in text) == (limit == 0)
        np.testing.assert_array_equal(np.asarray(ranks.stable_ranks(keys, 3)), want)
    with pytest.raises(ValueError, match="method='bitonic'"):
        ranks.stable_ranks(keys, 3, method="bitonic")


def test_scatter_inverse():
    positions = jnp.asarray([3, 7, 0, 9, -1, 5], jnp.int32)  # 7, 9 and -1 fall outside
    got = ranks.scatter_inverse(positions, 6, sentinel=99)
    np.testing.assert_array_equal(np.asarray(got), [2, 99, 99, 0, 99, 5])


def test_plan_dispatch_on_the_sorted_ranks_matches_the_reference(monkeypatch):
    """The layouts the layer sees where experts are many (the sort's path) are the same."""
    monkeypatch.setattr(ranks, "COUNT_MAX_ELEMENTS", 0)
    rng = np.random.default_rng(3)
    experts = np.stack([rng.permutation(6)[:2] for _ in range(13)]).astype(np.int32)
    for alignment, capacity in ((1, None), (4, None), (2, 3)):
        plan = jaxmoe.plan_dispatch(jnp.asarray(experts), 6, alignment=alignment, capacity=capacity)
        layout = ref.layout_reference(experts, 6, alignment, capacity)
        np.testing.assert_array_equal(np.asarray(plan.group_sizes), layout.group_sizes)
        assert int(plan.dropped) == layout.dropped
        num_rows = plan.num_rows
        want_rows = np.where(layout.row_of >= 0, layout.row_of, num_rows)
        np.testing.assert_array_equal(np.asarray(plan.assignment_row), want_rows)
        # Row -> assignment (t * K + j); every other row holds the sentinel A.
        want_assignment = np.full(num_rows, experts.size)
        for (t, j), row in np.ndenumerate(layout.row_of):
            if row >= 0:
                want_assignment[row] = t * experts.shape[1] + j
        np.testing.assert_array_equal(np.asarray(plan.row_assignment), want_assignment)


def test_the_dispatch_plans_do_not_sort_where_experts_are_few():
    # The plans' point (measured on an H100): no XLA sort for the layer presets' sizes.
    experts = jnp.zeros((64, 2), jnp.int32)
    text = str(jax.make_jaxpr(lambda e: jaxmoe.plan_dispatch(e, 8, alignment=4))(experts))
    assert "sort[" not in text and "cumsum" in text
