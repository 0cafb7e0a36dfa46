#!/usr/bin/env bash
# Second nvidia-h100-x1 call: what run_h100.sh's time limits cut: the layer benchmark per preset
# (torch vs jaxmoe, one JSON each, so a cut run keeps finished presets), grouped matmul on
# qwen3-down, ragged_dot on the remaining shapes, and the poison check's skewed case.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/jaxmoe-h100}
mkdir -p "$OUT"
log="$OUT/run2.log"
clocks() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >>"$log" 2>&1; }
date -u >>"$log"; clocks
for preset in mixtral dsv3 qwen3; do
  compare=torch,jaxmoe; [ "$preset" = qwen3 ] && compare=torch,jaxmoe,jaxmoe-xla
  timeout 100 python3 -m jaxmoe bench layer --preset $preset --compare $compare \
    --out "$OUT/layer-$preset.json" >>"$log" 2>&1
  clocks
done
timeout 60 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced,skewed \
  --shapes qwen3-down --out-dir "$OUT" --stem gemm-qwen3-down >>"$log" 2>&1
clocks
timeout 70 python3 benchmarks/grouped_matmul.py --impls torch,xla_ragged_dot --routings balanced \
  --passes fwd --repeats 3 --shapes dsv3-up,qwen3-up,mixtral-down,dsv3-down,qwen3-down \
  --out-dir "$OUT" --stem ragged_dot-h100-2 --time-budget-s 55 >>"$log" 2>&1
clocks
timeout 90 python3 benchmarks/poison_check.py --out "$OUT" --configs skewed-all-to-one >>"$log" 2>&1
clocks
rm -f "$OUT"/*.md  # at most 8 files come back; the tables are rebuilt from the JSON
grep -a -E "ms  err|ERROR|skipp|wrote|\| True|\| False" "$log" | tail -40
