#!/usr/bin/env bash
# Session 28, H100 run 28 call 3 (<= 300 s): why thirds barely move balanced Mixtral down's
# forward (call 1: 1.002x against the same tiles uncut, where 16 -> 15.67 rounds predicts ~2%).
# Mosaic GPU's on-device profiler (kernel_trace_probe.py): every CTA's main loops and epilogues
# with timestamps, the default (the last round in thirds) and the same tiles uncut. Traced
# kernels run ~25% slower than untraced ones: the structure is the point (how long the parts
# take, when each CTA ends), not the speeds.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s28c3; rm -rf $W; mkdir -p $W/split $W/uncut
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $W/gpu.csv
T="python3 benchmarks/kernel_trace_probe.py --cases mixtral-down:balanced --profile-space 44"
timeout 120 $T --out-dir $W/split > $W/split/probe.log 2>&1; echo "split rc=$?"
cut -c1-1500 $W/split/probe.log | tail -4
timeout 120 $T --out-dir $W/uncut --changes '{"split_last_round": false}' > $W/uncut/probe.log 2>&1; echo "uncut rc=$?"
cut -c1-1500 $W/uncut/probe.log | tail -4
tar czf "$OUT/call.tgz" -C $W .
