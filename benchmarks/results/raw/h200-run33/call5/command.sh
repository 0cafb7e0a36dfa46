#!/usr/bin/env bash
# Session 33, H200 run 33 call 5 (<= 580 s): the gemm table's balanced rows on this H200 with
# today's default kernels (the H200 table, grouped_matmul-h200.md, is run 23's: session 22's
# kernels, before the last round's pieces of sessions 26-27): the public bench, six shapes, fwd
# and fwd+bwd, torch._grouped_mm and jaxmoe (auto), settled and interleaved as the tables.
# Run from the repository root: bash benchmarks/results/raw/h200-run33/call5/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s33c5; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
timeout 560 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --shapes mixtral-down,mixtral-up,qwen3-up,qwen3-down,dsv3-up,dsv3-down --out-dir $W \
  --stem gemm-balanced --time-budget-s 520 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
kill $SMI; awk -F, 'NR>1 {c+=$2; p+=$3; n++} END {printf "smi: %d samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
tr '\r' '\n' < $W/gemm-balanced.log | grep -a -E " ms |ERROR|budget|skipp" | tail -30
tar czf "$OUT/call.tgz" -C $W .
