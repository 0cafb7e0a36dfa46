#!/usr/bin/env bash
# Run 21 call 4: the default gmm's trace on the short-K shapes (Qwen3 up and down, DeepSeek
# down), balanced: how much of a tile the epilogue takes where the main loop is 12-32 K steps.
# Each case in its own process (a profile buffer too small for a CTA's tiles may abort it).
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c4; rm -rf $W; mkdir -p $W
for spec in qwen3-up:balanced:40 dsv3-down:balanced:40 qwen3-down:balanced:64; do
  case=${spec%:*}; space=${spec##*:}; d=$W/${case/:/-}; mkdir -p $d
  timeout 100 python3 benchmarks/kernel_trace_probe.py --out-dir $d --cases $case --profile-space $space > $d/probe.log 2>&1; echo "$case rc=$?"
  grep '^{' $d/probe.log | cut -c1-900
done
tar czf "$OUT/call.tgz" -C $W .
