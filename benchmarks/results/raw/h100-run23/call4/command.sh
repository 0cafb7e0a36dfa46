#!/usr/bin/env bash
# Session 23, H100 run 23 call 4 (<= 430 s, kind nvidia-h100-x1: H100 only): the spread between
# H100 machines, one more machine: the gemm table's balanced Mixtral rows (torch, jaxmoe; public
# bench, settled) and the Mixtral layer (torch, jaxmoe), with nvidia-smi every 5 s.
# Run from the repository root: bash benchmarks/results/raw/h100-run23/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s23c4; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
timeout 230 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --shapes mixtral-up,mixtral-down --out-dir $W --stem gemm-balanced-mixtral \
  --time-budget-s 210 > $W/gemm.log 2>&1; echo "gemm rc=$?"
timeout 150 python3 -m jaxmoe bench layer --preset mixtral --impls torch,jaxmoe \
  --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
kill $SMI
awk -F, 'NR>1 {c+=$3; p+=$4; n++} END {if (n) printf "smi: %d samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
cat $W/*.log | tr '\r' '\n' | grep -a -E "(fwd|bwd).* ms |ERROR|Error|skipped" | grep -v "bench " | tail -14
tar czf "$OUT/call.tgz" -C $W .
