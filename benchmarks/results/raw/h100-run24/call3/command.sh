#!/usr/bin/env bash
# Session 24, call 3 (one H100, <= 400 s). Call 1 found sequential_gate 4.3-4.8x slower than the
# default gated kernel on all three presets: ptxas spilled 1268 bytes a thread and serialized
# its wgmma ("insufficient register resources"). A compute warpgroup holds the up projection's
# float32 accumulator (64x256: 128 registers a thread) and act(gate) in bf16 (64) across the
# up K loop, against 232 a thread (the 40 / 232 split). Here the split as FlashAttention 3's,
# 24 / 240 (benchmarks/with_register_split.py), to see whether 8 more registers a thread end
# the spill: ptxas on sequential and on the default, then the kernel phase (both variants
# under the same split), then, only if sequential wins on Mixtral, the layer's forward.
# Run from the repository root: bash benchmarks/results/raw/h100-run24/call3/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s24c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
SEQ='{"sequential_gate": true, "block_n": 256, "swizzled_epilogue": true, "multicast_weights": true}'
SPLIT="python3 benchmarks/with_register_split.py 24"
MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 $SPLIT benchmarks/ptxas_probe.py --kernel gated \
  --shape mixtral-up --changes "$SEQ" > $W/ptxas-seq-240.log 2>&1; echo "ptxas seq 240 rc=$?"
MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 $SPLIT benchmarks/ptxas_probe.py --kernel gated \
  --shape mixtral-up > $W/ptxas-default-240.log 2>&1; echo "ptxas default 240 rc=$?"
for f in $W/ptxas-*-240.log; do echo "== $f"; grep -a -h '^{' $f | cut -c1-160;
  grep -a -i -E "Used [0-9]+ registers|spill stores|C7512" $f | sort | uniq -c | tail -4; done
timeout 150 $SPLIT benchmarks/gated_tiles_probe.py --out-dir $W/seq-240 --phases kernel \
  --presets mixtral,qwen3,dsv3 --variants default,sequential --rounds 8 --time-budget-s 120 \
  > $W/seq-240.log 2>&1; echo "kernel phase rc=$?"
python3 - $W/seq-240/gated-tiles-probe.json > $W/decision.txt <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r.get("preset") == "mixtral"]
print("layer" if rows and rows[0].get("sequential_speedup", 0) > 1.0 else "stop")
PY
cat $W/decision.txt
if grep -q layer $W/decision.txt; then
  timeout 100 $SPLIT benchmarks/variant_clock_probe.py --out-dir $W/seq-layer --phases 8 \
    --phase-s 3 --pass fwd --sites gated --variants "{\"seq\": $SEQ}" > $W/seq-layer.log 2>&1
  echo "layer rc=$?"; grep '^{' $W/seq-layer.log | cut -c1-200
fi
python3 -c "
import json
for r in json.load(open('$W/seq-240/gated-tiles-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})" 2>&1 | tail -5
grep -a -i -B2 "error" $W/*.log | tail -12
tar czf "$OUT/call.tgz" -C $W .
