#!/usr/bin/env bash
# Session 20, call 2: why skip_empty_warpgroups made the layer slower (call 1: Mixtral fwd+bwd
# 0.923x, DeepSeek 0.915x). ptxas's own report (registers, spills, wgmma serialization
# warnings) of the plain gmm, the transposed pair and the fused gated kernel, each with the
# default tiles, skip (the tile body under a branch) and skip per step (only the wgmma issue
# and the stores under a branch); then the Mixtral layer with the three, settled, interleaved.
# Run from the repository root: bash benchmarks/results/raw/h100-run20/call2/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s20c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
declare -A CH=([default]='{}' [skip]='{"skip_empty_warpgroups": true}' \
  [step]='{"skip_empty_warpgroups": true, "skip_per_step": true}')
for kernel in gmm pair gated; do
  shape=mixtral-down; [ $kernel = gated ] && shape=mixtral-up
  for v in default skip step; do
    MOSAIC_GPU_DUMP_PTXAS=1 timeout 60 \
      python3 benchmarks/ptxas_probe.py --kernel $kernel --shape $shape --changes "${CH[$v]}" \
      > $W/ptxas-$kernel-$v.log 2>&1; echo "$kernel $v rc=$?"
    grep -a '"rel_err"' $W/ptxas-$kernel-$v.log | cut -c1-60,400-
    grep -a -h -i -E "registers|spill|serializ|warning|Performance" $W/ptxas-$kernel-$v.log | sort | uniq -c | head -12
  done
done
timeout 240 python3 benchmarks/group_start_probe.py --out-dir $W/layer --rounds 10 --presets mixtral \
  --stem skip-modes --variants '{"default": {}, "step": {"skip_empty_warpgroups": true, "skip_per_step": true}, "skip": {"skip_empty_warpgroups": true}}' \
  --time-budget-s 230 > $W/layer.log 2>&1; echo "layer rc=$?"
python3 -c "
import json
for r in json.load(open('$W/layer/skip-modes.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})"
tar czf "$OUT/call.tgz" -C $W .
