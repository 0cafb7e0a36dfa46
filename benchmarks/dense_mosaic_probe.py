"""Probe (issue 15): how much a 2-CTA cluster (TMA multicast) is worth on the H100, measured on
jax's own dense Hopper kernel (``jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu``) next to
jaxmoe's grouped ``gmm`` and ``torch._grouped_mm`` at the same FLOPs.

jaxmoe's Mosaic ``gmm`` has no cluster; before building one, this measures the dense kernel with
the same CTA tile (two warpgroups of ``128 x 128``, 4 stages) without a cluster and with one along
M (the weight tile multicast) or N (the activation tile multicast). Each row is written to
``$OUT/dense-mosaic-probe.json`` as it comes; all contenders of a shape are sampled in the same
rounds (``time_interleaved``). Every dense variant is checked against XLA's dot first.

    PYTHONPATH=src python benchmarks/dense_mosaic_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import time
import traceback

SHAPES = "mixtral-down,mixtral-up,dsv3-up"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--time-budget-s", type=float, default=200)
    args = parser.parse_args()
    start = time.time()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hopper

    from jaxmoe.bench.gemm import group_sizes_for
    from jaxmoe.bench.harness import row_emitter
    from jaxmoe.bench.presets import GEMM_SHAPES
    from jaxmoe.bench.timing import jax_sync, time_interleaved, torch_sync, warm_up
    from jaxmoe.ops.grouped_matmul import pallas_mosaic

    try:
        import torch
    except ImportError:
        torch = None

    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "dense-mosaic-probe.json")
    meta = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "torch": getattr(torch, "__version__", None),
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
    }

    emit = row_emitter(path, meta)

    dim = hopper.MatmulDimension
    base = dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4, wg_dimension=dim.N)
    configs = {
        "dense-g1": hopper.TuningConfig(**base),
        "dense-g8": hopper.TuningConfig(**base, grid_tile_width=8),
        "dense-g8-clusterM": hopper.TuningConfig(
            **base, grid_tile_width=8, cluster_dimension=dim.M
        ),
        "dense-g8-clusterN": hopper.TuningConfig(
            **base, grid_tile_width=8, cluster_dimension=dim.N
        ),
    }
    gmm = jax.jit(pallas_mosaic.gmm)
    xla_dot = jax.jit(functools.partial(jnp.dot, preferred_element_type=jnp.float32))

    for shape_name in args.shapes.split(","):
        shape = GEMM_SHAPES[shape_name]
        flops = 2 * shape.m * shape.k * shape.n
        kx, kw = jax.random.split(jax.random.key(0))
        x = jax.random.normal(kx, (shape.m, shape.k), jnp.float32).astype(jnp.bfloat16)
        w = jax.random.normal(kw, (shape.groups, shape.k, shape.n), jnp.float32)
        w = w.astype(jnp.bfloat16)
        sizes = group_sizes_for(shape, "balanced")
        gs = jnp.asarray(sizes)
        contenders = {}
        want = xla_dot(x, w[0])
        for name, cfg in configs.items():
            try:
                fn = jax.jit(functools.partial(hopper.matmul, c=None, config=cfg))
                got = fn(x, w[0]).astype(jnp.float32)
                err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
                emit({"phase": "check", "shape": shape_name, "impl": name, "rel_err": err})
                call = functools.partial(fn, x, w[0])
                contenders[name] = (call, jax_sync, warm_up(call, jax_sync))
            except Exception as e:  # noqa: BLE001 - the probe records failures and goes on
                emit({"phase": "check", "shape": shape_name, "impl": name, "error": repr(e)[:400]})
                traceback.print_exc()
        call = functools.partial(gmm, x, w, gs)
        contenders["jaxmoe-gmm"] = (call, jax_sync, warm_up(call, jax_sync))
        if torch is not None:
            tx = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.bfloat16)
            tw = torch.randn(shape.groups, shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
            offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
            tfn = functools.partial(torch._grouped_mm, tx, tw.transpose(-2, -1), offs=offs)
            contenders["torch"] = (tfn, torch_sync, warm_up(tfn, torch_sync))
        for name, t in time_interleaved(contenders).items():
            emit(
                {
                    "phase": "time",
                    "shape": shape_name,
                    "impl": name,
                    "ms": t.median_ms,
                    "min_ms": t.min_ms,
                    "tflops": flops / t.median_ms / 1e9,
                }
            )
        contenders.clear()
        del x, w, want
        if torch is not None:
            tx = tw = tfn = None
            torch.cuda.empty_cache()
        if time.time() - start > args.time_budget_s:
            emit({"budget": "stopped", "after": shape_name})
            return
    emit({"done": True, "elapsed_s": time.time() - start})


if __name__ == "__main__":
    main()
