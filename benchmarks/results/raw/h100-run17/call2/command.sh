#!/usr/bin/env bash
# Session 16, H100 run 17 call 2 (<= 580 s): the grouped-matmul table, balanced, settled (500 ms
# per peer before each sample), with the public bench (`jaxmoe bench gemm`, through
# benchmarks/grouped_matmul.py): six shapes, fwd and fwd+bwd, torch / jaxmoe (auto) / jaxmoe_triton
# interleaved. The defaults: split rows in the gmm, the gated kernel and (new) the wgrad.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s16c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 560 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_triton --routings balanced \
  --out-dir $W --stem gemm-balanced --time-budget-s 520 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
tr '\r' '\n' < $W/gemm-balanced.log | grep -a -E "TFLOP/s|ERROR|budget|skipp" | grep -v "^TFLOP" | tail -40
tar czf "$OUT/call.tgz" -C $W .
