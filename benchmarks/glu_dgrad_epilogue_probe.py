"""Probe (issue 15): where the fused down-projection dgrad's epilogue time goes (H100 run 13
found the kernel 0.92-1.00x the unfused dgrad plus its elementwise pass).

Per preset shape (Mixtral-, DeepSeek-, Qwen3-like ``[M, H] x [G, F, H]^T``, balanced), the
Mosaic dgrad with one epilogue change at a time, timed in interleaved rounds:

``plain``         the dgrad as the layer runs it (one output, no epilogue)
``two_stores``    the accumulator stored twice (the second output's stores alone)
``loads_one``     ``gate`` and ``up`` loaded in the accumulator's layout, ``acc * gate * up``
                  stored once (the loads alone, no second store)
``loads_two``     the loads and two outputs (``acc * up``, ``acc * gate``): no activation math
``fused``         :func:`fused_down_dgrad` (the loads, two outputs, the SiLU derivative)

    PYTHONPATH=src python benchmarks/glu_dgrad_epilogue_probe.py --out-dir $OUT

Set ``MOSAIC_GPU_DUMP_PTXAS=1`` to have the kernels' register and spill counts printed, where
the jaxlib build supports it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp
from glu_dgrad_probe import down_dgrad_operands
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--presets", default="mixtral,dsv3,qwen3")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    start = time.time()

    from jaxmoe.bench.harness import results_header, row_emitter
    from jaxmoe.bench.presets import LAYER_PRESETS
    from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
    from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as fused_mosaic
    from jaxmoe.ops.grouped_matmul import pallas_mosaic
    from jaxmoe.ops.grouped_matmul.pallas_mosaic_tiles import default_mosaic_gmm_tiles

    emit = row_emitter(
        os.path.join(args.out_dir, "glu-dgrad-epilogue-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )

    def load_tiles(acc, gate_gmem, up_gmem, row0, col0):
        rows, cols = acc.shape
        return (
            plgpu.load(
                ref.at[pl.ds(row0, rows), pl.ds(col0, cols)],
                (),
                layout=plgpu.Layout.WGMMA,
                optimized=False,
            ).astype(jnp.float32)
            for ref in (gate_gmem, up_gmem)
        )

    def two_stores(acc, *, group, row0, col0):
        return acc, acc

    def loads_one(acc, gate_gmem, up_gmem, *, group, row0, col0):
        gate, up = load_tiles(acc, gate_gmem, up_gmem, row0, col0)
        return acc * gate * up

    def loads_two(acc, gate_gmem, up_gmem, *, group, row0, col0):
        gate, up = load_tiles(acc, gate_gmem, up_gmem, row0, col0)
        return acc * up, acc * gate

    def variant(epilogue, num_outputs, with_operands):
        def run(out_bar, gate, up, down_w, sizes):
            m, h = out_bar.shape
            return pallas_mosaic.launch_gmm(
                out_bar,
                down_w,
                sizes,
                transpose_rhs=True,
                out_dtype=out_bar.dtype,
                cfg=default_mosaic_gmm_tiles(m, h, down_w.shape[1]),
                interpret_params=None,
                epilogue=epilogue,
                epilogue_operands=(gate, up) if with_operands else (),
                num_outputs=num_outputs,
            )

        return jax.jit(run)

    variants = {
        "plain": jax.jit(
            lambda out_bar, gate, up, down_w, sizes: pallas_mosaic.gmm(
                out_bar, down_w, sizes, transpose_rhs=True
            )
        ),
        "two_stores": variant(two_stores, 2, False),
        "loads_one": variant(loads_one, 1, True),
        "loads_two": variant(loads_two, 2, True),
        "fused": jax.jit(functools.partial(fused_mosaic.fused_down_dgrad, activation="swiglu")),
    }
    for name in args.presets.split(","):
        preset = LAYER_PRESETS[name]
        (m, h, f, g), (out_bar, gate, up, down_w) = down_dgrad_operands(preset)
        row = {"preset": name, "m": m, "h": h, "f": f, "groups": g}
        try:
            sizes = jnp.full((g,), m // g, jnp.int32)
            operands = (out_bar, gate, up, down_w, sizes)
            contenders = {}
            for label, fn in variants.items():
                call = lambda fn=fn, operands=operands: fn(*operands)  # noqa: E731
                contenders[label] = (call, jax_sync, warm_up(call, jax_sync))
            for label, timing in time_interleaved(contenders, rounds=args.rounds).items():
                row[f"{label}_ms"] = timing.median_ms
                row[f"{label}_min_ms"] = timing.min_ms
        except Exception as error:  # noqa: BLE001 - a probe reports and goes on
            row["error"] = f"{type(error).__name__}: {error}"[:2000]
            traceback.print_exc()
        row["elapsed_s"] = round(time.time() - start, 1)
        emit(row)


if __name__ == "__main__":
    main()
