"""GPU check of the grouped-matmul primitives: forward, both gradients and a gradient of a
gradient, with the default backend (on a Hopper GPU: the Mosaic forward/dgrad, the Triton
wgrad), against the plain reference backend in float32 on the same inputs.

Usage: python benchmarks/primitive_check.py   (prints one JSON line per check; exit 1 if any fails)
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxmoe
from jaxmoe.bench.harness import relative_error

M, K, N = 4096, 1024, 512
GROUP_SIZES = [0, 1000, 24, 2048, 0, 512, 300, 100]  # empty groups, straddling tiles, 88 tail rows
TOLERANCE = {"bfloat16": 2e-2, "float32": 1e-4}


def main() -> int:
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    group_sizes = jnp.asarray(GROUP_SIZES, jnp.int32)
    ok = True
    for dtype in ("bfloat16", "float32"):
        lhs = jax.random.normal(k1, (M, K), dtype)
        rhs = jax.random.normal(k2, (len(GROUP_SIZES), K, N), dtype) / 32
        cotangent = jax.random.normal(k3, (M, N), dtype)

        def loss(lhs, rhs, backend, cotangent=cotangent):
            out = jaxmoe.grouped_matmul(lhs, rhs, group_sizes, backend=backend)
            return jnp.sum(out.astype(jnp.float32) * cotangent)

        def outputs(backend, lhs, rhs):
            grads = jax.grad(loss, (0, 1))(lhs, rhs, backend)
            # A gradient of a gradient: d/d rhs of |d loss / d lhs|^2.
            second = jax.grad(
                lambda r: jnp.sum(jax.grad(loss)(lhs, r, backend).astype(jnp.float32) ** 2)
            )(rhs)
            return (jaxmoe.grouped_matmul(lhs, rhs, group_sizes, backend=backend), *grads, second)

        got = jax.jit(outputs, static_argnums=0)(None, lhs, rhs)
        want = jax.jit(outputs, static_argnums=0)("reference", lhs, rhs)
        for name, a, b in zip(("out", "d_lhs", "d_rhs", "grad_of_grad"), got, want, strict=True):
            err = relative_error(a, b)
            tail_zero = name not in ("out", "d_lhs") or bool(
                np.all(np.asarray(a)[sum(GROUP_SIZES) :] == 0)
            )
            row = {
                "dtype": dtype,
                "check": name,
                "rel_err": err,
                "tail_rows_zero": tail_zero,
                "ok": bool(err < TOLERANCE[dtype] and tail_zero and np.isfinite(err)),
            }
            ok &= row["ok"]
            print(json.dumps(row))
    print(json.dumps({"device": jax.devices()[0].device_kind, "jax": jax.__version__, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
