#!/usr/bin/env bash
# Session 32, H200 run 32 call 3 (<= 450 s): the permutation's row gather as a Pallas Triton
# kernel (row_gather_probe.py's new triton_<rows>x<cols>w<warps> variants) against XLA's
# jnp.take (the library's): 1. the gather alone on each preset's dispatch (checked equal);
# 2. the layers with two of the kernels patched in for every _gather_rows use.
# Run from the repository root: bash benchmarks/results/raw/h200-run32/call3/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s32c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 150 python3 benchmarks/row_gather_probe.py --out-dir $W/gather --phases gather \
  --variants triton_8x1024w4,triton_16x512w4,triton_4x2048w4,triton_16x1024w8,triton_32x512w8 \
  > $W/gather.log 2>&1; echo "gather rc=$?"
timeout 260 python3 benchmarks/row_gather_probe.py --out-dir $W/layer --phases layer \
  --variants triton_8x1024w4,triton_16x1024w8 > $W/layer.log 2>&1; echo "layer rc=$?"
for d in gather layer; do python3 -c "
import json
for r in json.load(open('$W/$d/row-gather-probe.json'))['rows']:
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if 'gbs' not in k})"; done
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
