#!/usr/bin/env bash
# Session 25, call 3 (<= 300 s, one H100): why half tiles made the layers 0.92-0.99x (call 2).
#  1. ptxas on the plain gmm (Mixtral down, layer group sizes) with and without half tiles:
#     registers, spills, wgmma serialization.
#  2. The kernel alone: mixtral-down, mixtral-up and qwen3-up on the layer's kind of group sizes,
#     the multicast default (mc) against it with half tiles (mchk), and default / hk (no
#     multicast), 5 interleaved rounds with torch.
# Run from the repository root: bash benchmarks/results/raw/h100-run25/call3/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s25c3; rm -rf $W; mkdir -p $W/gemm
for v in default:'{}' hk:'{"split_k_half_tiles": true}'; do
  name=${v%%:*}; changes=${v#*:}
  MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=$W/ptxas-$name timeout 90 python3 benchmarks/ptxas_probe.py \
    --kernel gmm --shape mixtral-down --changes "$changes" > $W/ptxas-$name.log 2>&1
  echo "== $name rc=$?"; grep -a -i -E "registers|spill|serializ|error" $W/ptxas-$name.log | sort | uniq -c | head -12
done
timeout 170 python3 benchmarks/mosaic_probe.py --out-dir $W/gemm --phases time \
  --shapes mixtral-down,mixtral-up,qwen3-up --variants default,hk,mc,mchk --time-routing layer \
  --rounds 5 --time-budget-s 150 > $W/gemm.log 2>&1; echo "gemm rc=$?"
grep '^{' $W/gemm.log | grep '"phase": "time"' | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); r.pop('tiles', None); print({k: v for k, v in r.items() if k in ('shape','op','impl','ms','tflops','vs_torch','speedup')})
" | head -40
tar czf "$OUT/call.tgz" -C $W .
