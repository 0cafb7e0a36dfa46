#!/usr/bin/env bash
# Session 26, call 3 (<= 560 s, one H100). Call 2: the stream-K kernel alone 0.85-1.03x
# (Qwen3 down dgrad 0.85x, DeepSeek up fwd 0.93x), the fix-up ~15 us, no copy in the HLO.
# The kernel now runs the whole units in their own loop with a static K loop (as without
# stream-K) and the segments in a second loop. (1) call 2's probe again; (2) the Mixtral
# layer with stream_k in the plain gmm's tiles against the default, the default twice.
# Run from the repository root: bash benchmarks/results/raw/h100-run26/call3/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s26c3; rm -rf $W; mkdir -p $W/layer
timeout 300 python3 benchmarks/stream_k_probe.py --out-dir $W --shapes mixtral-down,dsv3-up,qwen3-down \
  --ops fwd,dgrad --rounds 8 --time-budget-s 260 > $W/probe.log 2>&1; echo "probe rc=$?"
grep '^{' $W/probe.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print({k: v for k, v in r.items() if k.endswith(('ms', 'speedup', 'diff')) or k in ('shape', 'op', 'error')})
"
timeout 230 python3 benchmarks/group_start_probe.py --out-dir $W/layer --stem stream-k \
  --sites gmm --presets mixtral --rounds 8 --time-budget-s 210 \
  --variants '{"default": {}, "stream_k": {"stream_k": true}, "default_again": {}}' \
  > $W/layer.log 2>&1; echo "layer rc=$?"
grep '^{' $W/layer.log | cut -c1-500
grep -a -i -B2 -A12 "Traceback" $W/*.log | tail -30
rm -f $W/hlo-*.txt
tar czf "$OUT/call.tgz" -C $W .
