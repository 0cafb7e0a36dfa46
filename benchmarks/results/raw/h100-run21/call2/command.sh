#!/usr/bin/env bash
# Run 21 call 2: which tiles turn slow when a compute warpgroup skips a tile it owns no rows of
# (session 20's skip_empty_warpgroups, commit 02012f9, rebuilt on this commit's src in exp21/ with
# a "skipped" profiler scope), against the default, both traced by kernel_trace_probe.py on the
# layer's kind of groups (padded to 64 rows), Mixtral down and DeepSeek up.
# exp21/ (untracked): rm -rf exp21 && mkdir exp21 && cp -r src exp21/ && (cd exp21 && patch -p1 < ../benchmarks/results/raw/h100-run21/call2/exp21-skip.patch)
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call2/command.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c2; rm -rf $W; mkdir -p $W/skip $W/default
CASES=mixtral-down:layer,dsv3-up:layer
PYTHONPATH=exp21/src timeout 120 python3 benchmarks/kernel_trace_probe.py --out-dir $W/skip --cases $CASES \
  --changes '{"skip_empty_warpgroups": true}' > $W/skip/probe.log 2>&1; echo "skip rc=$?"
grep '^{' $W/skip/probe.log | cut -c1-1500
PYTHONPATH=src timeout 120 python3 benchmarks/kernel_trace_probe.py --out-dir $W/default --cases $CASES > $W/default/probe.log 2>&1; echo "default rc=$?"
grep '^{' $W/default/probe.log | cut -c1-1500
tar czf "$OUT/call.tgz" -C $W .
