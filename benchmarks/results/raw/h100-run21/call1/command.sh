#!/usr/bin/env bash
# Run 21 call 1: where the default gmm's time goes inside the kernel (Mosaic GPU's on-device
# profiler, kernel_trace_probe.py): each compute warpgroup's main loop and epilogue per tile,
# Mixtral down balanced and with the layer's kind of groups, DeepSeek up balanced; then the dgrad
# (transposed rhs) on Mixtral down balanced.
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c1; rm -rf $W; mkdir -p $W/fwd $W/dgrad
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $W/gpu.csv
timeout 150 python3 benchmarks/kernel_trace_probe.py --out-dir $W/fwd > $W/fwd/probe.log 2>&1; echo "fwd rc=$?"
cut -c1-1200 $W/fwd/probe.log | tail -8
timeout 90 python3 benchmarks/kernel_trace_probe.py --out-dir $W/dgrad --transpose --cases mixtral-down:balanced > $W/dgrad/probe.log 2>&1; echo "dgrad rc=$?"
cut -c1-1200 $W/dgrad/probe.log | tail -4
tar czf "$OUT/call.tgz" -C $W .
