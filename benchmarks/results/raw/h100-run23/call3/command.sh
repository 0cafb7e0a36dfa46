#!/usr/bin/env bash
# Session 23, H100 run 23 call 3 (<= 580 s, kind nvidia-h100-x4): the whole grouped-matmul
# table in one run, its shapes spread over the four H100s of one host (each row's peers timed
# on one GPU, interleaved and settled, as before): balanced with torch, jaxmoe, jaxmoe_triton;
# skewed with torch, jaxmoe. GPU 0 Mixtral up, GPU 1 Mixtral down, GPU 2 DeepSeek up and
# Qwen3 up, GPU 3 DeepSeek down and Qwen3 down.
# Run from the repository root: bash benchmarks/results/raw/h100-run23/call3/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s23c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
SHAPES=(mixtral-up mixtral-down dsv3-up,qwen3-up dsv3-down,qwen3-down)
PIDS=""
for g in 0 1 2 3; do
  D=$W/gpu$g; mkdir -p $D
  ( export CUDA_VISIBLE_DEVICES=$g
    timeout 330 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_triton \
      --routings balanced --shapes ${SHAPES[$g]} --out-dir $D --stem gemm-balanced-gpu$g \
      --time-budget-s 300 > $D/gemm-balanced.log 2>&1; echo "gpu$g balanced rc=$?"
    timeout 220 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
      --shapes ${SHAPES[$g]} --out-dir $D --stem gemm-skewed-gpu$g --time-budget-s 200 \
      > $D/gemm-skewed.log 2>&1; echo "gpu$g skewed rc=$?" ) &
  PIDS="$PIDS $!"
done
wait $PIDS
kill $SMI
for g in 0 1 2 3; do
  echo "== gpu$g"; awk -F, -v g=$g 'NR>1 && $2+0==g {c+=$3; p+=$4; n++} END {if (n) printf "smi: %d samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
  cat $W/gpu$g/*.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|Error|skipp" | grep -v "^TFLOP" | tail -12
done
tar czf "$OUT/call.tgz" -C $W .
