#!/usr/bin/env bash
# Session 18, H100 run 18 call 7 (<= 400 s): the README's layer figures (call 4, the bench) against
# the public API timed the ways a user writes it (`layer_timing_probe.py`: jit(moe) back to back,
# a sync per call, jit(grad)), on this session's default, three presets.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s18c7; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 380 python3 benchmarks/layer_timing_probe.py --out-dir $W --presets mixtral,dsv3,qwen3 \
  --cases fwd,grad,vjp_bench > $W/timing.log 2>&1; echo "timing rc=$?"
tail -40 $W/timing.log
tar czf "$OUT/call.tgz" -C $W .
