"""Probe (issue 15): which CUDA kernels ``torch._grouped_mm`` runs on the six gemm shapes.

The kernel names of torch's grouped GEMM carry its CUTLASS configuration (CTA tile, cluster
shape, cooperative or ping-pong warpgroups, epilogue), the peer our Mosaic ``gmm`` is measured
against. For each shape (balanced groups), forward and dgrad as the gemm bench calls them, the
profiler's CUDA kernels with their mean duration over a few calls. Rows go to
``<out-dir>/torch-gemm-kernels.json``.

    PYTHONPATH=src python benchmarks/torch_gemm_kernels.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from jaxmoe.bench.gemm import group_sizes_for
from jaxmoe.bench.harness import results_header, row_emitter
from jaxmoe.bench.presets import GEMM_SHAPES

SHAPES = "mixtral-up,mixtral-down,dsv3-up,dsv3-down,qwen3-up,qwen3-down"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "torch-gemm-kernels.json"),
        results_header(" ".join(sys.argv), device=torch.cuda.get_device_name()),
    )
    for shape_name in args.shapes.split(","):
        shape = GEMM_SHAPES[shape_name]
        sizes = group_sizes_for(shape, "balanced")
        x = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(shape.m, shape.n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(shape.groups, shape.n, shape.k, device="cuda", dtype=torch.bfloat16)
        offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
        # As the gemm bench: fwd x @ w[g]^T, dgrad dy @ w[g].
        calls = {
            "fwd": lambda x=x, w=w, offs=offs: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
            "dgrad": lambda dy=dy, w=w, offs=offs: torch._grouped_mm(dy, w, offs=offs),
        }
        for op, call in calls.items():
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    call()
                torch.cuda.synchronize()
            kernels = collections.defaultdict(list)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[event.name].append(event.device_time)
            for name, times_us in kernels.items():
                emit(
                    {
                        "shape": shape_name,
                        "op": op,
                        "kernel": name,
                        "count": len(times_us),
                        "mean_us": float(np.mean(times_us)),
                    }
                )
        del x, dy, w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
