#!/usr/bin/env bash
# Run 21 call 11: call 9's traces again at the settled, power-limited clock (kernel_trace_probe
# --settle-ms: the kernel without the profiler back to back for 1.5 s, then one profiled call):
# the Mixtral layer's own down projection, default against the weight multicast.
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call11/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c11; rm -rf $W; mkdir -p $W/default $W/multicast $W/default2
CASE=mixtral-down:1088/960/1088/1088/1024/1024/1088/1088
nvidia-smi --query-gpu=name,power.limit --format=csv > $W/gpu.csv; cat $W/gpu.csv
for v in default:'{}' multicast:'{"multicast_weights": true}' default2:'{}'; do
  name=${v%%:*}; changes=${v#*:}
  timeout 80 python3 benchmarks/kernel_trace_probe.py --out-dir $W/$name --cases $CASE --rows 8704 \
    --calls 1 --settle-ms 1500 --changes "$changes" > $W/$name/probe.log 2>&1; echo "$name rc=$?"
  grep '^{' $W/$name/probe.log | cut -c1-700
done
tar czf "$OUT/call.tgz" -C $W .
