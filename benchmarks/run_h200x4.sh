#!/usr/bin/env bash
# One nvidia-h200-x4 call (issue 17): the redesigned expert parallelism on 4 GPUs, bf16.
#   1. exactness: every exchange's sharded layer against one GPU, with JAXMOE_POISON=1;
#   2. the exchange at EP=4, payload and bytes actually sent per second against a bare
#      all_to_all, with XLA's default flags, then the dense exchange with
#      --xla_gpu_use_memcpy_local_p2p=true, then ragged_all_to_all without its one-shot
#      kernel and with its decomposer (keep what wins as the default);
#   3. weak scaling EP=1,2,4 of the Mixtral-like and DeepSeek-like layers (4096 tokens per GPU),
#      with the router's own routing and with forced-balanced routing; each row has the fullest
#      slot, dropped (must be 0) and overflow tokens, XLA's temporaries and the device's peak.
# Each part runs in its own process (its own XLA flags) under its own time limit and writes its
# JSON as it goes. Writes under $OUT. On 8 CPU devices (a smoke test; exchanges are not timed
# there): XLA_FLAGS=--xla_force_host_platform_device_count=8 LAYER_PRESETS=tiny EXCH_PRESET=tiny OUT=/tmp/x bash ...
#   run (device tool, kind nvidia-h200-x4): bash benchmarks/run_h200x4.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/jaxmoe-h200x4}
EP=${EP:-4}
mkdir -p "$OUT"
log="$OUT/run.log"
bench="python3 -m jaxmoe bench ep"
{ date -u; nvidia-smi --query-gpu=name --format=csv,noheader; } >>"$log" 2>&1
JAXMOE_POISON=1 timeout "${EXACT_S:-120}" $bench --ep "$EP" --parts correctness \
  --out "$OUT/ep-correctness-poison.json" --budget-s 100 >>"$log" 2>&1
timeout "${EXCH_S:-120}" $bench --ep "$EP" --parts exchange --preset ${EXCH_PRESET:-dsv3} --exchange-ep "$EP" \
  --compare all_to_all,all_to_all_chunked,ragged_all_to_all --out "$OUT/ep-exchange.json" \
  --budget-s 100 >>"$log" 2>&1
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_use_memcpy_local_p2p=true" timeout "${P2P_S:-60}" $bench --ep "$EP" \
  --parts exchange --preset ${EXCH_PRESET:-dsv3} --exchange-ep "$EP" --compare all_to_all \
  --out "$OUT/ep-exchange-memcpy-p2p.json" --budget-s 50 >>"$log" 2>&1
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_unsupported_use_ragged_all_to_all_one_shot_kernel=false \
--xla_gpu_unsupported_enable_ragged_all_to_all_decomposer=true" timeout "${RAGGED_S:-60}" \
  $bench --ep "$EP" --parts exchange --preset ${EXCH_PRESET:-dsv3} --exchange-ep "$EP" --compare ragged_all_to_all \
  --out "$OUT/ep-exchange-ragged-flags.json" --budget-s 50 >>"$log" 2>&1
timeout "${LAYER_S:-300}" $bench --ep "1,2,$EP" --parts layer \
  --preset "${LAYER_PRESETS:-dsv3,mixtral,dsv3-balanced,mixtral-balanced}" --receive-factor none \
  --out "$OUT/ep-layer.json" --budget-s 280 >>"$log" 2>&1
rm -f "$OUT"/*.md  # at most 8 files come back; tables are rebuilt from the JSON
python3 - "$OUT" <<'PY'
import glob, json, sys
keys = ("case", "ep", "impl", "ms", "ratio_vs_dense_a2a", "sent_ratio_vs_dense_a2a",
        "weak_scaling_vs_first", "fullest_slot_over_share", "dropped_tokens", "overflow_tokens",
        "compiled_temp_gb", "device_peak_gb", "max_rel_err", "ok", "error", "skipped")
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    print(path.rsplit("/", 1)[-1])
    for r in json.load(open(path))["rows"]:
        print({k: (round(r[k], 4) if isinstance(r.get(k), float) else r[k]) for k in keys if k in r})
PY
grep -a -i "error\|Traceback" "$log" | head -20
