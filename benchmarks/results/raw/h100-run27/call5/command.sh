#!/usr/bin/env bash
# Session 27, H100 run 27 call 5 (<= 560 s): call 2 again with the last round cut into 2-4
# pieces (commit 3a62d13; call 2 had session 26's halves): the grouped-matmul table's Mixtral
# rows (split_last_round from K = 8192: Mixtral down's forward and Mixtral up's dgrad; DeepSeek's
# and Qwen3's kernels are unchanged, their rows stand), as run 22 call 3: settled, public bench:
# balanced with torch, jaxmoe, jaxmoe_triton interleaved; skewed with torch, jaxmoe.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s27c5; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
# SM clock, power and throttle reasons every 5 s while the benches run.
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
timeout 300 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_triton --routings balanced \
  --shapes mixtral-up,mixtral-down --out-dir $W --stem gemm-balanced-mixtral --time-budget-s 280 \
  > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 240 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --shapes mixtral-up,mixtral-down --out-dir $W --stem gemm-skewed-mixtral --time-budget-s 220 \
  > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
kill $SMI; awk -F, 'NR>1 {c+=$2; p+=$3; n++} END {printf "smi: %d samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget|skipp" | grep -v "^TFLOP" | tail -30
tar czf "$OUT/call.tgz" -C $W .
