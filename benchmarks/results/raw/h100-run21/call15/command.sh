#!/usr/bin/env bash
# Run 21 call 15: call 14 again, the variants compiled ahead of time (call 14's first phase recompiled the default: the next variant's clear_caches had dropped it) -- does the weight multicast make the Mixtral layer draw more power per unit of
# work, so that every kernel runs at a lower clock at the 700 W limit? The layer's fwd+bwd alone
# in 3 s phases alternating default / multicast on the plain gmm (8 phases), nvidia-smi's SM
# clock and power read every 0.2 s (variant_clock_probe.py).
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call15/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c15; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit --format=csv > $W/gpu.csv; cat $W/gpu.csv
timeout 150 python3 benchmarks/variant_clock_probe.py --out-dir $W --phases 8 --phase-s 3 \
  --sites gmm --variants '{"multicast": {"multicast_weights": true}}' > $W/probe.log 2>&1; echo "probe rc=$?"
grep '^{' $W/probe.log
tar czf "$OUT/call.tgz" -C $W .
