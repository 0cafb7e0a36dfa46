#!/usr/bin/env bash
# Session 20, call 4: call 3 had skip_empty_warpgroups 0.94-0.96x the default on the plain gmm
# alone (the layer's kind of groups, Mixtral down and up, fwd and dgrad), too much to be the few
# half tiles: every tile slower? The SASS of the plain gmm (Mixtral down, fwd) with the default
# tiles, skip and skip per step, for a diff of the main loop.
# Run from the repository root: bash benchmarks/results/raw/h100-run20/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s20c4; rm -rf $W; mkdir -p $W
declare -A CH=([default]='{}' [skip]='{"skip_empty_warpgroups": true}' \
  [step]='{"skip_empty_warpgroups": true, "skip_per_step": true}')
for v in default skip step; do
  MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_PTX=1 timeout 60 python3 benchmarks/ptxas_probe.py \
    --kernel gmm --shape mixtral-down --changes "${CH[$v]}" > $W/sass-gmm-$v.log 2>&1
  echo "$v rc=$? lines=$(wc -l < $W/sass-gmm-$v.log) HGMMA=$(grep -c HGMMA $W/sass-gmm-$v.log) WARPSYNC=$(grep -c -i warpsync $W/sass-gmm-$v.log) BAR=$(grep -c 'BAR\.' $W/sass-gmm-$v.log) SYNCS=$(grep -c SYNCS $W/sass-gmm-$v.log)"
done
tar czf "$OUT/call.tgz" -C $W .
