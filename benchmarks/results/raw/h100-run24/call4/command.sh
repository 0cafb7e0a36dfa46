#!/usr/bin/env bash
# Session 24, call 4 (one H100, <= 450 s). The dispatch plan without XLA's sort: each copy's
# rank among its expert's copies as a cumulative count over the one-hot expert ids
# (jaxmoe.ranks.stable_ranks), against the stable argsort it replaces (call 2's profile: the
# Mixtral forward's argsort ran as two launches of 36 and 7 us, ~1% of the forward). The plan
# alone on the three presets' routing and a 256-expert one, then the layer's forward and
# fwd+bwd on the three presets, both methods compiled ahead of time, settled and interleaved.
# Run from the repository root: bash benchmarks/results/raw/h100-run24/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s24c4; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 420 python3 benchmarks/dispatch_plan_probe.py --out-dir $W --rounds 10 > $W/probe.log 2>&1
echo "probe rc=$?"
grep '^{' $W/probe.log | cut -c1-330
grep -a -i -B2 "error" $W/probe.log | tail -12
tar czf "$OUT/call.tgz" -C $W .
