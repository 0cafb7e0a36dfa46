#!/usr/bin/env bash
# One nvidia-h100-x1 call (issue 3): the grouped-matmul benchmark on all six shapes, peers
# interleaved per shape. Balanced groups first, then skewed, each for $BAL_IMPLS / $SKEW_IMPLS
# (default torch,jaxmoe: a third impl does not fit the 600 s call). Each part has its own time
# limit and rewrites its JSON after every row. Writes under $OUT.
#   run (device tool): bash benchmarks/run_h100_gemm.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/jaxmoe-h100}
mkdir -p "$OUT"
log="$OUT/gemm.log"
clocks() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >>"$log" 2>&1; }
{ date -u; python3 -c 'import jax, torch; print("jax", jax.__version__, "torch", torch.__version__)'; } >>"$log" 2>&1
clocks
timeout "${BAL_S:-270}" python3 benchmarks/grouped_matmul.py --impls "${BAL_IMPLS:-torch,jaxmoe}" \
  --routings balanced --out-dir "$OUT" --stem gemm-balanced --time-budget-s "$(( ${BAL_S:-270} - 30 ))" >>"$log" 2>&1
clocks
timeout "${SKEW_S:-270}" python3 benchmarks/grouped_matmul.py --impls "${SKEW_IMPLS:-torch,jaxmoe}" \
  --routings skewed --out-dir "$OUT" --stem gemm-skewed --time-budget-s "$(( ${SKEW_S:-270} - 30 ))" >>"$log" 2>&1
clocks
rm -f "$OUT"/*.md
grep -a -E "TFLOP/s|ERROR|budget" "$log" | tail -70
