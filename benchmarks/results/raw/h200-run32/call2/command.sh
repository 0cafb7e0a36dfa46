#!/usr/bin/env bash
# Session 32, H200 run 32 call 2 (<= 580 s), on the committed tree (9d2f63c).
# 1. The layer table's DeepSeek and Qwen3 rows with today's default (call 1 ran Mixtral's):
#    torch, torchtitan, jaxmoe, settled, interleaved.
# 2. The public API's timing (layer_timing_probe: jit(moe) back to back and synced per call,
#    jit(grad)), the three presets.
# 3. Balanced Mixtral down's forward, torch._grouped_mm against jaxmoe's default, each alone in
#    alternating 3 s phases (gemm_clock_probe): the one balanced gemm row under 1.0x on the
#    H100s (0.98x), on this chip.
# Run from the repository root: bash benchmarks/results/raw/h200-run32/call2/command.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s32c2; rm -rf $W /tmp/site; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 300 python3 -m jaxmoe bench layer --preset dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer-dsv3-qwen3.json > $W/layer.log 2>&1; echo "layer rc=$?"
timeout 170 python3 benchmarks/layer_timing_probe.py --out-dir $W/timing \
  --presets mixtral,dsv3,qwen3 --cases fwd,grad > $W/timing.log 2>&1; echo "timing rc=$?"
kill $SMI
timeout 80 python3 benchmarks/gemm_clock_probe.py --out-dir $W/gemm --shape mixtral-down \
  --phases 10 > $W/gemm.log 2>&1; echo "gemm rc=$?"
awk -F, 'NR>1 && $4+0>300 {c+=$3; p+=$4; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -E "^\| (mixtral|dsv3|qwen3)" $W/layer-dsv3-qwen3.md | cut -c1-160
grep '^{' $W/timing.log | cut -c1-330
python3 -c "
import json
for r in json.load(open('$W/gemm/gemm-clock-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})"
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
