"""Host milliseconds to launch one jitted op (no sync), per op kind: which launch is slow.

PYTHONPATH=src python3 benchmarks/dispatch_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

from jaxmoe.bench.harness import results_header, write_results
from jaxmoe.bench.timing import host_launch_ms
from jaxmoe.ops.grouped_matmul import grouped_matmul


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="dispatch-probe")
    args = parser.parse_args(argv)
    lhs = jnp.ones((4096, 512), jnp.bfloat16)
    rhs = jnp.ones((8, 512, 512), jnp.bfloat16)
    sizes = jnp.full((8,), 512, jnp.int32)
    keys = jax.random.randint(jax.random.key(0), (65536,), 0, 128)
    cases = {
        "elementwise": (jax.jit(lambda a: a * 2), (lhs,)),
        "argsort": (jax.jit(jnp.argsort), (keys,)),
        "dot": (jax.jit(lambda a, b: a @ b[0]), (lhs, rhs)),
    }
    for backend in ("pallas", "pallas_triton", "xla"):
        fn = jax.jit(lambda a, b, g, be=backend: grouped_matmul(a, b, g, backend=be))
        cases[f"gmm-{backend}"] = (fn, (lhs, rhs, sizes))
    rows = []
    for name, (fn, fn_args) in cases.items():
        try:
            rows.append({"op": name, "host_dispatch_ms": host_launch_ms(fn, *fn_args)})
        except Exception as error:  # noqa: BLE001 - record and go on
            rows.append({"op": name, "error": f"{type(error).__name__}: {error}"[:300]})
        print(json.dumps(rows[-1]), flush=True)
    write_results(
        pathlib.Path(args.out_dir) / "dispatch.json",
        results_header("python3 benchmarks/dispatch_probe.py"),
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
