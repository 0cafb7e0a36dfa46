#!/usr/bin/env bash
# Run 21 call 9: the Mixtral layer bench's own down projection (its 8704-row buffer, its groups
# padded to 64: 69 work items, odd), default against the opt-in weight multicast, traced; where
# does the multicast's layer loss (run 19: the down projection ~7% slower) come from?
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call9/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c9; rm -rf $W; mkdir -p $W/default $W/multicast
CASE=mixtral-down:1088/960/1088/1088/1024/1024/1088/1088
nvidia-smi --query-gpu=name,power.limit --format=csv > $W/gpu.csv; cat $W/gpu.csv
timeout 80 python3 benchmarks/kernel_trace_probe.py --out-dir $W/default --cases $CASE --rows 8704 \
  > $W/default/probe.log 2>&1; echo "default rc=$?"
grep '^{' $W/default/probe.log | cut -c1-900
timeout 80 python3 benchmarks/kernel_trace_probe.py --out-dir $W/multicast --cases $CASE --rows 8704 \
  --changes '{"multicast_weights": true}' > $W/multicast/probe.log 2>&1; echo "multicast rc=$?"
grep '^{' $W/multicast/probe.log | cut -c1-900
tar czf "$OUT/call.tgz" -C $W .
