"""The grouped matmul's primitives on a GPU (skipped elsewhere): forward, both gradients and a
gradient of a gradient with the default backend (on a Hopper GPU the Mosaic forward and dgrad and
the Mosaic wgrad) against the plain ``reference`` backend on the same inputs, with empty groups,
groups straddling tiles and 88 tail rows past the groups, which must come out zero.

Run on a GPU host with ``JAX_PLATFORMS=cuda,cpu pytest tests/gpu -n 0``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe.bench.harness import relative_error

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "gpu", reason="a GPU check: run with JAX_PLATFORMS=cuda,cpu on a GPU"
)
M, K, N = 4096, 1024, 512
GROUP_SIZES = [0, 1000, 24, 2048, 0, 512, 300, 100]  # empty groups, straddling tiles, 88 tail rows
TOLERANCE = {"bfloat16": 2e-2, "float32": 1e-4}
CHECKS = ("out", "d_lhs", "d_rhs", "grad_of_grad")


def primitive_results(backend, dtype):
    """The forward, d lhs, d rhs and d/d rhs of |d loss / d lhs|^2 with ``backend``."""
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    group_sizes = jnp.asarray(GROUP_SIZES, jnp.int32)
    lhs = jax.random.normal(k1, (M, K), dtype)
    rhs = jax.random.normal(k2, (len(GROUP_SIZES), K, N), dtype) / 32
    cotangent = jax.random.normal(k3, (M, N), dtype)

    def loss(lhs, rhs):
        out = jaxmoe.grouped_matmul(lhs, rhs, group_sizes, backend=backend)
        return jnp.sum(out.astype(jnp.float32) * cotangent)

    def outputs(lhs, rhs):
        d_lhs, d_rhs = jax.grad(loss, (0, 1))(lhs, rhs)
        second = jax.grad(lambda r: jnp.sum(jax.grad(loss)(lhs, r).astype(jnp.float32) ** 2))(rhs)
        out = jaxmoe.grouped_matmul(lhs, rhs, group_sizes, backend=backend)
        return dict(zip(CHECKS, (out, d_lhs, d_rhs, second), strict=True))

    return jax.jit(outputs)(lhs, rhs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_primitives_match_the_reference_backend(dtype):
    got = primitive_results(None, dtype)
    want = primitive_results("reference", dtype)
    for name in CHECKS:
        err = relative_error(got[name], want[name])
        assert np.isfinite(err) and err < TOLERANCE[dtype], (name, err)
    for name in ("out", "d_lhs"):  # rows past the groups
        assert np.all(np.asarray(got[name])[sum(GROUP_SIZES) :] == 0), name
