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
timeout "${EXCH_S:-170}" python3 -m jaxmoe bench ep --ep 4 --parts correctness,exchange \
  --exchange-ep 4 --out "$OUT/ep-h200x4-exchange.json" --budget-s 150 >>"$log" 2>&1
timeout "${LAYER_S:-210}" python3 -m jaxmoe bench ep --ep 1,2,4 --parts layer --preset dsv3,mixtral \
  --receive-factor none --out "$OUT/ep-h200x4-layer.json" --budget-s 190 >>"$log" 2>&1
export XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true
timeout "${LHS_S:-150}" python3 -m jaxmoe bench ep --ep 1,4 --parts layer --preset dsv3,mixtral \
  --receive-factor none --chunks 2 --out "$OUT/ep-h200x4-layer-chunks2-lhs.json" \
  --budget-s 130 >>"$log" 2>&1
rm -f "$OUT"/*.md  # at most 8 files come back; tables are rebuilt from the JSON
python3 - "$OUT" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    for r in json.load(open(path))["rows"]:
        keys = ("case", "ep", "impl", "ms", "ratio_vs_dense_a2a", "weak_scaling_vs_first",
                "fullest_slot_over_share", "ep_chunks", "rel_err_y", "max_rel_err_grad", "error")
        print({k: (round(r[k], 4) if isinstance(r.get(k), float) else r[k]) for k in keys if k in r})
PY
grep -a -i "error\|Traceback" "$log" | head -20
