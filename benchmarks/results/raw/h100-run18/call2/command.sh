#!/usr/bin/env bash
# Session 18, H100 run 18 call 2 (<= 590 s): the grouped-matmul table's skewed half with the new
# default (tiles from each group's first row, call 1: 1.02-1.10x the grid on 8 of 8 skewed
# cases), settled, public bench: six shapes, fwd and fwd+bwd, torch / jaxmoe interleaved. Then
# the layer probe, fixed: call 1's forward rows compared one trace with itself (two jits of the
# same function share jax's tracing cache); the probe now clears jax's caches per variant and
# counts the default-tile reads.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s18c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 450 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --out-dir $W --stem gemm-skewed --time-budget-s 420 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
tr '\r' '\n' < $W/gemm-skewed.log | grep -a -E "TFLOP/s|ERROR|budget|skipp" | grep -v "^TFLOP" | tail -30
timeout 120 python3 benchmarks/group_start_probe.py --out-dir $W/layer --presets mixtral \
  --rounds 10 --time-budget-s 100 > $W/layer.log 2>&1; echo "layer rc=$?"
python3 -c "
import json
for r in json.load(open('$W/layer/group-start-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})"
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
