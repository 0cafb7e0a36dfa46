#!/usr/bin/env bash
# Prepared in session 20 (no device time left to run it), for the next session's first call: where the default gmm's time goes inside the kernel (Mosaic GPU's on-device
# profiler, kernel_trace_probe.py): each compute warpgroup's main loop and epilogue per tile,
# Mixtral down balanced and with the layer's kind of groups, DeepSeek up balanced.
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c1; rm -rf $W; mkdir -p $W
timeout 110 python3 benchmarks/kernel_trace_probe.py --out-dir $W > $W/probe.log 2>&1; echo "rc=$?"
cut -c1-900 $W/probe.log | tail -8
tar czf "$OUT/call.tgz" -C $W .
