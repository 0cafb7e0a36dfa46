#!/usr/bin/env bash
# Run 21 call 3: the opt-in weight multicast (2-CTA clusters) traced against the default by
# kernel_trace_probe.py: balanced (where it measured up to 1.03x) and the layer's kind of groups
# (where it lost), Mixtral down and DeepSeek up; is the loss a wave front that spreads?
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call3/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c3; rm -rf $W; mkdir -p $W/multicast $W/default
CASES=mixtral-down:balanced,mixtral-down:layer,dsv3-up:balanced,dsv3-up:layer
timeout 150 python3 benchmarks/kernel_trace_probe.py --out-dir $W/multicast --cases $CASES \
  --changes '{"multicast_weights": true}' > $W/multicast/probe.log 2>&1; echo "multicast rc=$?"
grep '^{' $W/multicast/probe.log | cut -c1-700
timeout 150 python3 benchmarks/kernel_trace_probe.py --out-dir $W/default --cases $CASES > $W/default/probe.log 2>&1; echo "default rc=$?"
grep '^{' $W/default/probe.log | cut -c1-700
tar czf "$OUT/call.tgz" -C $W .
