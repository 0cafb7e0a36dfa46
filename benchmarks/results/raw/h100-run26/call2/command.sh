#!/usr/bin/env bash
# Session 26, call 2 (<= 400 s, one H100). Call 1 measured the layer 5-10% slower with
# stream_k, by about a copy of the down projection's result (DeepSeek fwd +0.6 ms). Here, per
# gemm shape on the layer's kind of groups: the default, stream_k (now with unique scatter
# indices), the stream-K kernel alone (fix-up removed: timing only) and the default again,
# interleaved; each stream_k program's optimized HLO saved and its top-level ops listed.
# Run from the repository root: bash benchmarks/results/raw/h100-run26/call2/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s26c2; rm -rf $W; mkdir -p $W
timeout 300 python3 benchmarks/stream_k_probe.py --out-dir $W --shapes mixtral-down,dsv3-up,qwen3-down \
  --ops fwd,dgrad --rounds 8 --time-budget-s 260 > $W/probe.log 2>&1; echo "probe rc=$?"
grep '^{' $W/probe.log | cut -c1-900
grep -a -i -B2 -A12 "Traceback" $W/probe.log | tail -30
tar czf "$OUT/call.tgz" -C $W .
