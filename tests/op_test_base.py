"""One test base for the grouped-matmul-shaped kernel ops: forward, VJP and group-size edges.

An op's backends are tested by subclassing :class:`OpTestBase` (a pytest class: its name starts
with ``Test``) and supplying the hooks below; the base's test methods then run for every
backend, each against the subclass's float64 NumPy reference. Keeping the checks in one place
means a new backend (or a new op) gets the whole set by naming its backend and shape, and a
check added here reaches every op at once.

Hooks (class attributes and methods a subclass supplies):

* ``BACKENDS``: ``{param id: Backend}``: the backend object (what ``call`` takes), its shape
  ``(m, k, n)``, dtypes, whether it runs the VJP, and which edge cases it runs (interpreted
  Mosaic kernels are slow: they take aligned shapes and few cases).
* ``TOLERANCES``: ``{dtype name: Tol}``: the forward's and the gradients' bounds and the norm.
* ``make_inputs(m, k, n, groups, dtype, seed)``: ``(operands, cotangent)``; the first operand is
  the ``[M, K]`` rows, operands with ``groups`` leading entries are per-group weights.
* ``call(backend, operands, group_sizes)``: the op's output.
* ``reference(operands, group_sizes)`` and ``reference_grads(operands, group_sizes, cotangent)``:
  float64 NumPy, group sizes truncated at M.
* optionally ``group_sizes(case, m)`` (the sizes of each case at M rows) and ``check_forward``
  (an op's own bound, e.g. per element).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# The edge cases, by id: what each group-size list exercises (sizes from ``group_sizes``).
EDGE_CASES = ("skewed", "single_group", "past_m", "no_rows")


class Tol(NamedTuple):
    """Relative bounds: ``norm="max"``: max |error| / max |reference|; ``"frobenius"``:
    ||error|| / ||reference||."""

    forward: float
    grads: float
    norm: str = "max"


@dataclasses.dataclass(frozen=True)
class Backend:
    """One backend under test: ``impl`` goes to the subclass's ``call`` as is."""

    impl: Any
    shape: tuple[int, int, int]  # (m, k, n)
    dtypes: tuple[str, ...] = ("float32",)
    vjp: bool = True
    cases: tuple[str, ...] = EDGE_CASES
    jit: bool = True


def bounds(group_sizes, m):
    """Each group's first row and the end, with sizes truncated at ``m`` (as the ops do)."""
    ends = np.minimum(np.cumsum(np.maximum(np.asarray(group_sizes, np.int64), 0)), m)
    return np.concatenate([[0], ends])


def as64(a):
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def relative(got, want, norm="max"):
    got = as64(got)
    if norm == "frobenius":
        return float(np.linalg.norm(got - want)) / max(float(np.linalg.norm(want)), 1e-30)
    return float(np.max(np.abs(got - want), initial=0.0)) / max(float(np.max(np.abs(want))), 1e-6)


# One jitted function per (test class, backend): the tests of a backend share its compile.
_RUNNERS: dict[tuple[type, Backend], Any] = {}


class OpTestBase:
    """The shared forward / VJP / edge-case tests; see the module docstring for the hooks."""

    BACKENDS: ClassVar[dict[str, Backend]] = {}
    TOLERANCES: ClassVar[dict[str, Tol]] = {}

    # ------------------------------------------------------------------ hooks

    def make_inputs(self, m, k, n, groups, dtype, seed):
        raise NotImplementedError

    def call(self, backend, operands, group_sizes):
        raise NotImplementedError

    def reference(self, operands, group_sizes):
        raise NotImplementedError

    def reference_grads(self, operands, group_sizes, cotangent):
        raise NotImplementedError

    def group_sizes(self, case, m):
        """The main case (``"empty_and_tail"``: an empty group, groups cutting tiles, rows past
        the groups) and the edges, at ``m`` rows in four groups."""
        return {
            "empty_and_tail": [m // 8 + 3, 0, m // 2 - 5, m // 4 - 1],
            "skewed": [1, m - 3, 1, 1],
            "single_group": [0, m, 0, 0],
            "past_m": [m // 2, m // 2 + 9, 7, 0],
            "no_rows": [0, 0, 0, 0],
        }[case]

    def check_forward(self, got, want, operands, group_sizes, dtype):
        tol = self.TOLERANCES[dtype]
        err = relative(got, want, tol.norm)
        assert err <= tol.forward, f"forward: relative error {err:.3g} > {tol.forward} ({dtype})"

    # ------------------------------------------------------------------ the checks

    def pytest_generate_tests(self, metafunc):
        name = metafunc.function.__name__
        if name == "test_forward_and_vjp":
            combos = [(b, d) for b, spec in self.BACKENDS.items() for d in spec.dtypes]
            metafunc.parametrize("backend_id, dtype", combos, ids=[f"{b}-{d}" for b, d in combos])
        elif name == "test_group_size_edges":
            combos = [(b, c) for b, spec in self.BACKENDS.items() for c in spec.cases]
            metafunc.parametrize("backend_id, case", combos, ids=[f"{b}-{c}" for b, c in combos])

    def runner(self, spec):
        key = (type(self), spec)
        if key not in _RUNNERS:

            def run(operands, group_sizes, cotangent):
                op = lambda *a: self.call(spec.impl, a, group_sizes)  # noqa: E731
                if not spec.vjp:
                    return op(*operands), None
                out, vjp = jax.vjp(op, *operands)
                return out, vjp(cotangent)

            _RUNNERS[key] = jax.jit(run) if spec.jit else run
        return _RUNNERS[key]

    def check(self, spec, sizes, dtype, seed=0):
        """Forward (and the VJP: every operand's gradient) against the float64 reference; exact
        zeros in the rows past the groups (output and d rows) and in empty groups' weights."""
        m, k, n = spec.shape
        groups = len(sizes)
        operands, cotangent = self.make_inputs(m, k, n, groups, dtype, seed)
        gs = jnp.asarray(sizes, jnp.int32)
        out, grads = self.runner(spec)(operands, gs, cotangent)
        assert out.shape == cotangent.shape and out.dtype == operands[0].dtype
        self.check_forward(out, self.reference(operands, sizes), operands, sizes, dtype)
        b = bounds(sizes, m)
        assert np.all(np.asarray(out[b[-1] :]) == 0), "rows past sum(group_sizes) are not zero"
        if grads is None:
            return
        tol = self.TOLERANCES[dtype]
        wants = self.reference_grads(operands, sizes, cotangent)
        for i, (got, want, x) in enumerate(zip(grads, wants, operands, strict=True)):
            assert got.shape == x.shape and got.dtype == x.dtype, f"d operand {i}"
            err = relative(got, want, tol.norm)
            assert err <= tol.grads, f"d operand {i}: relative error {err:.3g} > {tol.grads}"
            if i == 0:
                assert np.all(np.asarray(got[b[-1] :]) == 0), "d rows past the groups"
            elif x.ndim == 3 and x.shape[0] == groups:
                for g in np.flatnonzero(b[1:] == b[:-1]):
                    assert np.all(np.asarray(got[g]) == 0), f"d operand {i}: empty group {g}"

    # ------------------------------------------------------------------ the tests

    def test_forward_and_vjp(self, backend_id, dtype):
        # An empty group, groups cutting the backend's tiles, rows past the groups.
        spec = self.BACKENDS[backend_id]
        self.check(spec, self.group_sizes("empty_and_tail", spec.shape[0]), dtype)

    def test_group_size_edges(self, backend_id, case):
        # One group taking almost all rows, a single group, sizes past M (truncated), no rows.
        spec = self.BACKENDS[backend_id]
        self.check(spec, self.group_sizes(case, spec.shape[0]), spec.dtypes[0])
