#!/usr/bin/env bash
# Session 26, call 4 (<= 480 s, one H100). Calls 1-3: stream-K (the last two rounds' K steps
# in contiguous ranges, one per CTA) ran the kernels 0.85-1.03x: the ranges start at different
# K offsets, so CTAs of one group no longer share its weight blocks in L2. Now the last round
# alone, when it holds at most half as many units as there are workers, cut into two K halves
# (split_last_round; two K offsets, each walked together). (1) per gemm shape on the layer's
# kind of groups: default, split, split kernel alone (no fix-up: its difference from the
# default shows the cut tiles exist), default again; (2) the Mixtral layer with it in the plain
# gmm's tiles (down projection, input-gradient pair), the default twice.
# Run from the repository root: bash benchmarks/results/raw/h100-run26/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s26c4; rm -rf $W; mkdir -p $W/layer
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
timeout 230 python3 benchmarks/split_last_round_probe.py --out-dir $W --shapes mixtral-down,dsv3-down,qwen3-down \
  --ops fwd,dgrad --rounds 8 --time-budget-s 190 > $W/probe.log 2>&1; echo "probe rc=$?"
grep '^{' $W/probe.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print({k: v for k, v in r.items() if k.endswith(('ms', 'speedup', 'diff', 'units', 'ops')) or k in ('shape', 'op', 'error', 'budget')})
"
timeout 200 python3 benchmarks/group_start_probe.py --out-dir $W/layer --stem split-last-round \
  --sites gmm --presets mixtral --rounds 8 --time-budget-s 180 \
  --variants '{"default": {}, "split": {"split_last_round": true}, "default_again": {}}' \
  > $W/layer.log 2>&1; echo "layer rc=$?"
grep '^{' $W/layer.log | cut -c1-500
grep -a -i -B2 -A12 "Traceback" $W/*.log | tail -30
rm -f $W/hlo-*.txt
tar czf "$OUT/call.tgz" -C $W .
