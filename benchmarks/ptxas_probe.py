"""Probe (issue 15): what ptxas makes of one Mosaic GPU kernel variant: registers, spills and its
warnings (``wgmma`` serialization among them), printed by Mosaic GPU when the process runs with
``MOSAIC_GPU_DUMP_PTXAS=1`` (jaxlib's CUDA build; ``MOSAIC_GPU_DUMP_TO`` a directory for the
files). One kernel and one variant per process, so that each dump is that kernel's alone::

    MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO=$OUT/gmm-multicast \\
      PYTHONPATH=src python benchmarks/ptxas_probe.py --kernel gmm \\
      --changes '{"multicast_weights": true}'

Kernels (``--shape``'s ``[M, K] x [G, K, N]``, groups padded to 64 as the layer's): ``gmm``,
``dgrad`` (the transposed weights), ``pair`` (the gated FFN's input gradient, transposed),
``gated`` (the fused gate/up forward, ``N`` columns per weight). ``--changes`` (JSON) applies to
the kernel's default tiles. The call is run once and checked against XLA's product.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.bench.gemm import layer_group_sizes
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as gated_mosaic
from jaxmoe.ops.grouped_matmul import pallas_mosaic, pallas_mosaic_tiles


def grouped_reference(lhs, rhs, sizes) -> jax.Array:
    """``lhs[rows of g] @ rhs[g]`` in float32, one XLA dot per group (``sizes`` on the host)."""
    starts = np.concatenate([[0], np.cumsum(sizes)])
    out = jnp.zeros((lhs.shape[0], rhs.shape[2]), jnp.float32)
    for group, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        block = jnp.dot(lhs[start:end], rhs[group], preferred_element_type=jnp.float32)
        out = out.at[start:end].set(block)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kernel", choices=("gmm", "dgrad", "pair", "gated"), default="gmm")
    parser.add_argument("--shape", default="mixtral-down")
    parser.add_argument("--changes", default="{}")
    args = parser.parse_args()
    shape = GEMM_SHAPES[args.shape]
    m, k, n, g = shape.m, shape.k, shape.n, shape.groups
    changes = json.loads(args.changes)
    keys = jax.random.split(jax.random.key(0), 4)
    host_sizes = layer_group_sizes(shape)
    sizes = jnp.asarray(host_sizes)
    x = jax.random.normal(keys[0], (m, k), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(keys[1], (g, k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
    if args.kernel == "gated":
        tiles = dataclasses.replace(gated_mosaic.default_gated_tiles(m, k, n), **changes)
        w2 = (jax.random.normal(keys[2], (g, k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
        fn = jax.jit(
            lambda x, w, w2, s: gated_mosaic.fused_gmm(
                x, w, w2, s, activation="swiglu", tiles=tiles
            )[0]
        )
        got = fn(x, w, w2, sizes)
        gate = grouped_reference(x, w, host_sizes)
        want = jax.nn.silu(gate) * grouped_reference(x, w2, host_sizes)
    else:
        transpose = args.kernel in ("dgrad", "pair")
        tiles = dataclasses.replace(
            pallas_mosaic_tiles.default_mosaic_gmm_tiles(m, k, n), **changes
        )
        # Transposed: lhs [M, N] against w[g]^T; w is [G, K, N] either way.
        lhs = (
            jax.random.normal(keys[3], (m, n), jnp.float32).astype(jnp.bfloat16) if transpose else x
        )
        rhs_t = jnp.swapaxes(w, 1, 2)
        if args.kernel == "pair":
            fn = jax.jit(
                lambda a, b, s: pallas_mosaic.gmm_pair(
                    a, b, a, b, s, transpose_rhs=True, tiles=tiles
                )
            )
            got = fn(lhs, w, sizes)
            want = 2 * grouped_reference(lhs, rhs_t, host_sizes)
        else:
            fn = jax.jit(
                lambda a, b, s: pallas_mosaic.gmm(a, b, s, transpose_rhs=transpose, tiles=tiles)
            )
            got = fn(lhs, w, sizes)
            want = grouped_reference(lhs, rhs_t if transpose else w, host_sizes)
    got = jnp.asarray(got, jnp.float32)
    end = int(host_sizes.sum())
    err = float(jnp.max(jnp.abs(got[:end] - want[:end])) / jnp.max(jnp.abs(want[:end])))
    print(
        json.dumps(
            {
                "kernel": args.kernel,
                "shape": args.shape,
                "changes": changes,
                "tiles": repr(tiles),
                "rel_err": err,
                "tail_zero": bool(jnp.all(got[end:] == 0)),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
