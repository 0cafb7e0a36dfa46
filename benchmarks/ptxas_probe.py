"""Probe (issue 15): what ptxas makes of one Mosaic GPU kernel variant: registers, spills and its
warnings (``wgmma`` serialization among them), printed by Mosaic GPU when the process runs with
``MOSAIC_GPU_DUMP_PTXAS=1`` (jaxlib's CUDA build; ``MOSAIC_GPU_DUMP_TO`` a directory for the
files). One kernel and one variant per process, so that each dump is that kernel's alone::

    MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO=$OUT/gmm-multicast \\
      PYTHONPATH=src python benchmarks/ptxas_probe.py --kernel gmm \\
      --changes '{"multicast_weights": true}'

Kernels (``--shape``'s ``[M, K] x [G, K, N]``, groups padded to 64 as the layer's): ``gmm``,
``dgrad`` (the transposed weights), ``pair`` (the gated FFN's input gradient, transposed),
``gated`` (the fused gate/up forward, ``N`` columns per weight), ``down_dgrad`` (the fused down
dgrad, ``fused_backward``: the shape read as the down projection ``[M, K] x [G, K, N]``, its
dgrad ``dy @ w[g]^T`` with ``x`` as both ``gate`` and ``up``). ``--changes`` (JSON) applies to
the kernel's default tiles. The call is run once and checked against the gemm bench's float32
per-group reference (``gemm_cases.jax_reference``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp

from jaxmoe.bench.gemm import layer_group_sizes
from jaxmoe.bench.gemm_cases import jax_inputs, jax_reference
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as gated_mosaic
from jaxmoe.ops.grouped_matmul import pallas_mosaic, pallas_mosaic_tiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--kernel", choices=("gmm", "dgrad", "pair", "gated", "down_dgrad"), default="gmm"
    )
    parser.add_argument("--shape", default="mixtral-down")
    parser.add_argument("--changes", default="{}")
    args = parser.parse_args()
    shape = GEMM_SHAPES[args.shape]
    m, k, n = shape.m, shape.k, shape.n
    changes = json.loads(args.changes)
    host_sizes = layer_group_sizes(shape)
    sizes = jnp.asarray(host_sizes)
    # The gemm bench's inputs and its float32 per-group reference (out = x @ w[g], dx = dy @
    # w[g]^T, zeros past the groups).
    x, w, dy = jax_inputs(shape, jnp.bfloat16, 0)
    out, dx, _ = jax_reference(x, w, dy, host_sizes)
    if args.kernel == "gated":
        tiles = dataclasses.replace(gated_mosaic.default_gated_tiles(m, k, n), **changes)
        _, w2, _ = jax_inputs(shape, jnp.bfloat16, 1)
        fn = jax.jit(
            lambda x, w, w2, s: gated_mosaic.fused_gmm(
                x, w, w2, s, activation="swiglu", tiles=tiles
            )[0]
        )
        got = fn(x, w, w2, sizes)
        want = jax.nn.silu(out) * jax_reference(x, w2, dy, host_sizes)[0]
    elif args.kernel == "down_dgrad":
        # x as both gate and up: gate_bar = dx * x * silu'(x), up_bar = dx * silu(x); the
        # check reads gate_bar.
        tiles = dataclasses.replace(gated_mosaic.default_down_dgrad_tiles(m, n, k), **changes)
        fn = jax.jit(
            lambda dy, x, w, s: gated_mosaic.fused_down_dgrad(
                dy, x, x, w, s, activation="swiglu", tiles=tiles
            )[0]
        )
        got = fn(dy, x, w, sizes)
        gate = x.astype(jnp.float32)
        slope = jax.vmap(jax.grad(jax.nn.silu))(gate.reshape(-1)).reshape(gate.shape)
        want = dx * gate * slope
    else:
        tiles = dataclasses.replace(
            pallas_mosaic_tiles.default_mosaic_gmm_tiles(m, k, n), **changes
        )
        # Transposed (dgrad, pair): dy [M, N] against w[g]^T; w is [G, K, N] either way.
        if args.kernel == "pair":
            fn = jax.jit(
                lambda a, b, s: pallas_mosaic.gmm_pair(
                    a, b, a, b, s, transpose_rhs=True, tiles=tiles
                )
            )
            got, want = fn(dy, w, sizes), 2 * dx
        else:
            transpose = args.kernel == "dgrad"
            fn = jax.jit(
                lambda a, b, s: pallas_mosaic.gmm(a, b, s, transpose_rhs=transpose, tiles=tiles)
            )
            got, want = fn(dy if transpose else x, w, sizes), dx if transpose else out
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
