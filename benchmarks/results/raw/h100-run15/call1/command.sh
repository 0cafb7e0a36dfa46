#!/usr/bin/env bash
# Session 14, H100 run 15 call 1 (<= 420 s): is the layer's wall time its kernels' time? The
# idle probe after a sustained load, default XLA flags (with the torch layer's clock), then
# command buffers off, then CUDA graphs for every op sequence (min graph size 1).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s14c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $W/smi-start.txt 2>&1
timeout 200 python3 benchmarks/idle_probe.py --torch --tag default --out-dir $W > $W/default.log 2>&1; echo "default rc=$?"
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 90 python3 benchmarks/idle_probe.py \
  --presets mixtral --tag cboff --out-dir $W > $W/cboff.log 2>&1; echo "cboff rc=$?"
XLA_FLAGS=--xla_gpu_graph_min_graph_size=1 timeout 90 python3 benchmarks/idle_probe.py \
  --presets mixtral --tag graph1 --out-dir $W > $W/graph1.log 2>&1; echo "graph1 rc=$?"
cat $W/smi-start.txt; grep -a -h '^{' $W/*.log | cut -c1-900
tar czf "$OUT/call.tgz" -C $W .
