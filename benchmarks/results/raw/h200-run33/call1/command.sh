#!/usr/bin/env bash
# Session 33, H200 run 33 call 1 (<= 420 s), a fresh lease (only nvidia-h200 lent this session).
# 1. The combine's backward spread (a weight per row) on the row gather kernel
#    (row_gather_probe --weighted-spread: permutation.WEIGHTED_SPREAD_BACKEND = "pallas_triton")
#    against the library's default (XLA's fused gather there); the baseline `take` is the
#    library as committed, so its dispatch forward runs through jaxmoe.ops.row_gather's `auto`
#    (the kernel): its times against run 32 call 4's spread_triton column time the op as wired.
#    Outputs compared (max_rel_diff) on the GPU: the scaled kernel's first compile there.
# Run from the repository root: bash benchmarks/results/raw/h200-run33/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s33c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"
timeout 380 python3 benchmarks/row_gather_probe.py --out-dir $W/layer --phases layer \
  --presets qwen3,dsv3 --variants take --weighted-spread --rounds 12 > $W/layer.log 2>&1; echo "layer rc=$?"
python3 -c "
import json
for r in json.load(open('$W/layer/row-gather-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if 'tflops' not in k})"
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
