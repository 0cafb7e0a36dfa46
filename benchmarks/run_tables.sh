#!/usr/bin/env bash
# The grouped-matmul table (six shapes, balanced and skewed, fwd and fwd+bwd; torch, jaxmoe and,
# balanced, jaxmoe_triton) and the layer table (three presets; torch, torchtitan, jaxmoe; the
# public API's timing after), one part per device call, each under a 600 s call limit (on an
# H200 the balanced rows with two peers took 432 s, the layer's DeepSeek and Qwen3 rows 204 s);
# all five take ~27 min of device time with one cold start:
#   bash benchmarks/run_tables.sh PART        (carry .whl/ for torchtitan's wheels)
# PART: gemm-balanced-mixtral | gemm-balanced-rest | gemm-skewed | layer-mixtral | layer-rest.
# Writes $OUT/call.tgz; merge its JSON into the curated table with
#   python -m jaxmoe.bench.tables benchmarks/results/<table>.json --rows <file>.json \
#       --run <run id>/callN --commit <commit measured>
# (benchmarks/README.md), and add the run's line to benchmarks/RUNS.md.
set -u
PART=${1:-}
case "$PART" in
  gemm-balanced-mixtral | gemm-balanced-rest | gemm-skewed | layer-mixtral | layer-rest) ;;
  *) echo "PART: gemm-balanced-mixtral, gemm-balanced-rest, gemm-skewed, layer-mixtral or layer-rest"; exit 2 ;;
esac
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/tables-$PART; rm -rf "$W"; mkdir -p "$W"
OUT=${OUT:-/tmp/tables-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > "$W/smi-start.txt"
cat "$W/smi-start.txt"
python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"
if ls .whl/*.whl > /dev/null 2>&1; then  # torchtitan and its pure-Python needs, if carried
  pip install --no-index --no-deps --target /tmp/site .whl/*.whl > "$W/pip.log" 2>&1
  export PYTHONPATH=src:/tmp/site
fi
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -l 5 > "$W/smi-trace.csv" &
SMI=$!
gemm() {  # stem, time limit (s), then `jaxmoe bench gemm`'s arguments
  local stem=$1 limit=$2; shift 2
  timeout "$limit" python3 -m jaxmoe bench gemm --preset all --out "$W/$stem.json" \
    --budget-s $((limit - 40)) "$@" > "$W/$stem.log" 2>&1
  echo "$stem rc=$?"
  tr '\r' '\n' < "$W/$stem.log" | grep -a -E " ms |ERROR|budget|skipp" | tail -40
}
layer() {  # presets, time limit (s)
  timeout "$2" python3 -m jaxmoe bench layer --preset "$1" --impls torch,torchtitan,jaxmoe \
    --out "$W/layer-${1//,/-}.json" > "$W/layer-${1//,/-}.log" 2>&1
  echo "layer $1 rc=$?"
  grep -E "^\| (mixtral|dsv3|qwen3)" "$W/layer-${1//,/-}.md" | cut -c1-200
  timeout 170 python3 -m jaxmoe bench layer-api --preset "$1" --cases fwd,grad \
    --out "$W/timing/layer-api-${1//,/-}.json" > "$W/timing-${1//,/-}.log" 2>&1
  echo "timing $1 rc=$?"
  grep '^{' "$W/timing-${1//,/-}.log" | cut -c1-330
}
case "$PART" in
  gemm-balanced-mixtral) gemm gemm-balanced-mixtral 560 --impls torch,jaxmoe,jaxmoe_triton \
    --routings balanced --shapes mixtral-up,mixtral-down ;;
  gemm-balanced-rest) gemm gemm-balanced-rest 560 --impls torch,jaxmoe,jaxmoe_triton \
    --routings balanced --shapes dsv3-up,dsv3-down,qwen3-up,qwen3-down ;;
  gemm-skewed) gemm gemm-skewed 570 --impls torch,jaxmoe --routings skewed ;;
  layer-mixtral) layer mixtral 300 ;;
  layer-rest) layer dsv3,qwen3 330 ;;
esac
kill $SMI
awk -F, 'NR>1 && $3+0>300 {c+=$2; p+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' "$W/smi-trace.csv"
grep -a -i -B3 "error" "$W"/*.log | tail -20
tar czf "$OUT/call.tgz" -C "$W" .
