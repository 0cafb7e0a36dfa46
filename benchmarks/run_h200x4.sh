#!/usr/bin/env bash
# One nvidia-h200-x4 call (issue 4): correctness of every exchange at EP=4, the exchange
# bandwidth rows (default dropless fast path, chunked, worst case, receive bound, ragged), the
# layer's weak scaling EP=1,2,4 with the default (dropless) config, then the same layer with
# ep_chunks=2 under XLA's latency-hiding scheduler. Each part has its own time limit and writes
# its JSON as it goes. Writes under $OUT.
#   run (device tool, kind nvidia-h200-x4): bash benchmarks/run_h200x4.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/jaxmoe-h200x4}
mkdir -p "$OUT"
log="$OUT/run.log"
{ date -u; nvidia-smi --query-gpu=name --format=csv,noheader; } >>"$log" 2>&1
timeout "${EXCH_S:-170}" python3 benchmarks/ep.py --ep 4 --parts correctness,exchange \
  --exchange-ep 4 --out "$OUT" --stem ep-h200x4-exchange --budget-s 150 >>"$log" 2>&1
timeout "${LAYER_S:-210}" python3 benchmarks/ep.py --ep 1,2,4 --parts layer --cases dsv3,mixtral \
  --receive-factor none --out "$OUT" --stem ep-h200x4-layer --budget-s 190 >>"$log" 2>&1
export XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true
timeout "${LHS_S:-150}" python3 benchmarks/ep.py --ep 1,4 --parts layer --cases dsv3,mixtral \
  --receive-factor none --chunks 2 --out "$OUT" --stem ep-h200x4-layer-chunks2-lhs \
  --budget-s 130 >>"$log" 2>&1
rm -f "$OUT"/*.md  # at most 8 files come back; tables are rebuilt from the JSON
grep -a -h -o '"case": "[^"]*", "ep": [0-9]*, "impl": "[^"]*", "ms": [0-9.]*' "$OUT"/*.json | head -60
grep -a -i "error\|Traceback" "$log" | head -20
