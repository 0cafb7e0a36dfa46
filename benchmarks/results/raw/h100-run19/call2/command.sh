#!/usr/bin/env bash
# Session 19, call 2.
#  1. Which CUDA kernels torch._grouped_mm runs (their names carry the CUTLASS config: CTA tile,
#     cluster, cooperative or ping-pong), six shapes, fwd and dgrad, balanced.
#  2. The Mixtral layer with multicast_weights on the plain gmm's defaults only (the fused gated
#     kernel's unchanged): call 1 had every site at 0.968x fwd / 0.956x fwd+bwd.
#  3. Skewed gemm, default against mc (DeepSeek up, Mixtral down), settled, with torch.
# Run from the repository root: bash benchmarks/results/raw/h100-run19/call2/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s19c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
timeout 120 python3 benchmarks/torch_gemm_kernels.py --out-dir $W/torch > $W/torch.log 2>&1; echo "torch rc=$?"
show $W/torch/torch-gemm-kernels.json | cut -c1-400
timeout 150 python3 benchmarks/group_start_probe.py --out-dir $W/layer --rounds 10 --presets mixtral \
  --stem multicast-gmm --sites gmm --variants '{"default": {}, "multicast": {"multicast_weights": true}}' \
  --time-budget-s 140 > $W/layer.log 2>&1; echo "layer rc=$?"
show $W/layer/multicast-gmm.json | tail -3
timeout 200 python3 benchmarks/mosaic_probe.py --out-dir $W/skewed --phases time \
  --shapes dsv3-up,mixtral-down --variants default,mc \
  --time-routing skewed --rounds 8 --time-budget-s 190 > $W/skewed.log 2>&1; echo "skewed rc=$?"
show $W/skewed/mosaic-probe.json | tail -12
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
