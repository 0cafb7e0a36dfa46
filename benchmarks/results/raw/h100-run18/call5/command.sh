#!/usr/bin/env bash
# Session 18, H100 run 18 call 5 (<= 400 s): the grouped-matmul table's last balanced case (Qwen3
# down; call 4's compile time ran its budget out), then the balanced Mixtral forwards (0.98-0.99x
# torch in call 3) with the tile order walking 4 or 16 work items along N instead of 8, settled,
# 12 rounds (the same work list as the default on balanced groups).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s18c5; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 170 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_triton \
  --routings balanced --shapes qwen3-down --out-dir $W --stem gemm-balanced-qwen3-down \
  --time-budget-s 160 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
tr '\r' '\n' < $W/gemm-balanced.log | grep -a -E "TFLOP/s|ERROR|budget|skipp" | grep -v "^TFLOP" | tail -8
timeout 200 python3 benchmarks/mosaic_probe.py --out-dir $W/order --phases time \
  --shapes mixtral-up,mixtral-down --variants split4swzgs,split4swzg4,split4swzg16 \
  --time-routing balanced --rounds 12 --time-budget-s 185 > $W/order.log 2>&1; echo "order rc=$?"
python3 -c "
import json
for r in json.load(open('$W/order/mosaic-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k in ('shape', 'op', 'impl', 'ms', 'tflops', 'error', 'budget')})"
tar czf "$OUT/call.tgz" -C $W .
