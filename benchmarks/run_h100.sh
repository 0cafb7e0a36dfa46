#!/usr/bin/env bash
# One nvidia-h100-x1 device call: the grouped-matmul benchmark (peers interleaved per shape),
# ragged_dot as a peer, the layer benchmark, and the poisoned-buffer check. Each part has its own
# time limit and writes its results as it goes, so a part cut short keeps what it measured.
#   run (device tool): bash benchmarks/run_h100.sh     (writes under $OUT)
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/jaxmoe-h100}
mkdir -p "$OUT"
log="$OUT/run.log"
clocks() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >>"$log" 2>&1; }
{ date -u; python3 -c 'import jax, torch; print("jax", jax.__version__, "torch", torch.__version__, jax.devices())'; } >>"$log" 2>&1
clocks
timeout "${GEMM_S:-230}" python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --out-dir "$OUT" --stem grouped_matmul-h100 --time-budget-s "$(( ${GEMM_S:-230} - 40 ))" >>"$log" 2>&1
clocks
timeout "${RAGGED_S:-45}" python3 benchmarks/grouped_matmul.py --impls torch,xla_ragged_dot --routings balanced \
  --passes fwd --repeats 3 --shapes mixtral-up,dsv3-up,qwen3-up --out-dir "$OUT" --stem ragged_dot-h100 >>"$log" 2>&1
clocks
timeout "${LAYER_S:-160}" python3 -m jaxmoe bench layer --preset all --compare torch,jaxmoe,jaxmoe-xla \
  --out "$OUT/layer-h100.json" >>"$log" 2>&1
clocks
timeout "${POISON_S:-120}" python3 benchmarks/poison_check.py --out "$OUT" \
  --configs dropless-softmax-swiglu,sigmoid-grouped-bias-shared-geglu,skewed-all-to-one >>"$log" 2>&1
clocks
tail -c 6000 "$log"
