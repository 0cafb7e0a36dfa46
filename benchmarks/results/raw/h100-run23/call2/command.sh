#!/usr/bin/env bash
# Session 23, H100 run 23 call 2 (<= 580 s, kind nvidia-h100-x4): the spread between chips.
# The balanced Mixtral forwards against torch moved +-3% between H100s in run 22 (the table's
# machine 0.98x / 0.97x, another 1.014x / 1.001x), as much as the bar's margin. Four H100s of
# one host measure the same things at once, each process on its own GPU:
#   GPU 0: the layer table (three presets; torch, torchtitan, jaxmoe), as run 22 call 4.
#   GPUs 1-3: the gemm table's balanced Mixtral rows (torch, jaxmoe; public bench, settled),
#     the Mixtral layer (torch, jaxmoe), then the wgrad's rhs multicast against the default on
#     three products (run 23 call 1: 1.022x on Mixtral up and DeepSeek up, 0.994x Mixtral down).
# nvidia-smi samples every GPU every 5 s (smi-trace.csv).
# Run from the repository root: bash benchmarks/results/raw/h100-run23/call2/command.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s23c2; rm -rf $W /tmp/site; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
PIDS=""
mkdir -p $W/gpu0
( export CUDA_VISIBLE_DEVICES=0
  timeout 540 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
    --impls torch,torchtitan,jaxmoe --out $W/gpu0/layer.json > $W/gpu0/layer.log 2>&1
  echo "gpu0 layer rc=$?" ) &
PIDS="$PIDS $!"
for g in 1 2 3; do
  D=$W/gpu$g; mkdir -p $D
  ( export CUDA_VISIBLE_DEVICES=$g
    timeout 250 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
      --shapes mixtral-up,mixtral-down --out-dir $D --stem gemm-balanced-mixtral \
      --time-budget-s 230 > $D/gemm.log 2>&1; echo "gpu$g gemm rc=$?"
    timeout 160 python3 -m jaxmoe bench layer --preset mixtral --impls torch,jaxmoe \
      --out $D/layer.json > $D/layer.log 2>&1; echo "gpu$g layer rc=$?"
    timeout 120 python3 benchmarks/mosaic_wgrad_probe.py --out-dir $D/wgrad --phases time \
      --variants m64k128n256s4e64split,m64k128n256s4e64splitmc --routings balanced --rounds 8 \
      --shapes mixtral-up,mixtral-down,dsv3-up --time-budget-s 100 > $D/wgrad.log 2>&1
    echo "gpu$g wgrad rc=$?" ) &
  PIDS="$PIDS $!"
done
wait $PIDS
kill $SMI
for g in 0 1 2 3; do
  echo "== gpu$g"; awk -F, -v g=$g 'NR>1 && $2+0==g {c+=$3; p+=$4; n++} END {if (n) printf "smi: %d samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
  cat $W/gpu$g/*.log | tr '\r' '\n' | grep -a -E "(fwd|bwd).* ms |ERROR|Error|skipped" | grep -v "bench " | tail -14
done
tar czf "$OUT/call.tgz" -C $W .
