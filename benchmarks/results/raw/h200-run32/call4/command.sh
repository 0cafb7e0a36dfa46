#!/usr/bin/env bash
# Session 32, H200 run 32 call 4 (<= 400 s): call 3's Triton row gather in the dispatch's
# forward only (row_gather_probe --spread-triton: permutation._spread's unweighted gather as
# triton_16x512w4; the combine's fused gathers as they are), the layers against the library's.
# Run from the repository root: bash benchmarks/results/raw/h200-run32/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s32c4; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 330 python3 benchmarks/row_gather_probe.py --out-dir $W/layer --phases layer \
  --presets qwen3,dsv3,mixtral --variants take --spread-triton > $W/layer.log 2>&1; echo "layer rc=$?"
python3 -c "
import json
for r in json.load(open('$W/layer/row-gather-probe.json'))['rows']:
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if 'tflops' not in k})"
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
