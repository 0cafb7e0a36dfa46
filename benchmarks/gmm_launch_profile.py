"""Probe (issue 15): every GPU kernel one public ``jaxmoe.grouped_matmul`` call launches, with
its duration: the Mosaic kernel and the XLA ops that build its work list on the device (torch's
grouped GEMM launches one small ``prepare_grouped_gemm_data`` kernel of ~1.8 us, run 19 call 2).

Per shape (balanced and skewed groups), ``jaxmoe.bench.kernel_profile``'s breakdown of the gemm
bench's own jitted functions (``gemm_cases.jax_fn``: ``grouped_matmul`` forward, and its VJP),
backend ``auto``. Rows go to ``<out-dir>/gmm-launch-profile.json``.

    PYTHONPATH=src python benchmarks/gmm_launch_profile.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

from jaxmoe.bench.gemm import group_sizes_for
from jaxmoe.bench.gemm_cases import jax_fn, jax_inputs
from jaxmoe.bench.harness import results_header, row_emitter
from jaxmoe.bench.kernel_profile import kernel_breakdown
from jaxmoe.bench.presets import GEMM_SHAPES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--shapes", default="mixtral-down,mixtral-up,qwen3-up")
    parser.add_argument("--routings", default="balanced,skewed")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "gmm-launch-profile.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    for shape_name in args.shapes.split(","):
        shape = GEMM_SHAPES[shape_name]
        x, w, dy = jax_inputs(shape, jnp.bfloat16, 0)
        for routing in args.routings.split(","):
            sizes = jnp.asarray(group_sizes_for(shape, routing))
            for pass_ in ("fwd", "fwd+bwd"):
                operands = (x, w, sizes) if pass_ == "fwd" else (x, w, sizes, dy)
                breakdown = kernel_breakdown(jax_fn("auto", pass_), *operands, calls=10)
                emit({"shape": shape_name, "routing": routing, "pass": pass_, **breakdown})


if __name__ == "__main__":
    main()
