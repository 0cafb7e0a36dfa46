#!/usr/bin/env bash
# Prepared in session 23 (its device time spent), for the first call of the next session
# (<= 520 s, one H100: name kind nvidia-h100-x1). Then call 2 (the unfused forward, the profile,
# the public-API timing).
# The Mixtral layer's forward is issue 15's edge now: 1.21-1.28x torch on six GPUs (bar 1.25x).
# Its largest op is the fused gated kernel (two of its three products), which runs two m64n128
# wgmma per K step and, unlike the plain gmm since session 22, no weight multicast.
#  1. The fused gated kernel with `sequential_gate` (built in session 23, exact in the
#     interpreter, lowered for CUDA, never run on a GPU): the gate's K loop, then the up
#     projection's, on the plain gmm's default tiles (m64n256, the multicast where K * N is
#     large), act(gate) rounded once to bf16. First ptxas_probe: exactness against the float32
#     reference on layer-like groups (Mixtral up, Qwen3 up; tail rows zero) and ptxas's
#     registers and spills. Then gated_tiles_probe's kernel phase on the three
#     presets' shapes: h against the default kernel's (expect ~4e-3, bf16 rounding; a wrong
#     kernel gives O(1)), then both timed in settled interleaved rounds. If it hangs (a ring
#     accounting bug), the timeout ends it.
#  2. The same in the Mixtral layer's forward, sustained alternating 3 s phases
#     (variant_clock_probe, AOT-compiled variants).
#  3. The down projection's wave tail in the Mixtral forward: its 69 work items make 560 cluster
#     units on 66 clusters (8.48 waves in 9 rounds, ~5.8% idle); block_n 128 (a tile change
#     only; exact in the interpreter with the multicast, lowers for CUDA) makes 1120 units
#     (16.97 waves) at the cost of m64n128 products. Forward, sustained phases, the plain gmm's
#     tiles only (in the forward: the down projection).
# Make a default only what wins; sequential_gate then goes into default_gated_tiles (by the
# K * N rule if it wins only on Mixtral), then re-measure the layer table.
# Run from the repository root: bash benchmarks/results/raw/h100-run24/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s24c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
SEQ='{"sequential_gate": true, "block_n": 256, "swizzled_epilogue": true, "multicast_weights": true}'
# Exactness against the float32 reference on layer-like groups (padded to 64, cut by tiles,
# rows past the sum), with ptxas's registers and spills (192 live a thread by arithmetic).
MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 python3 benchmarks/ptxas_probe.py --kernel gated \
  --shape mixtral-up --changes "$SEQ" > $W/ptxas-seq-mixtral.log 2>&1; echo "ptxas mixtral rc=$?"
timeout 60 python3 benchmarks/ptxas_probe.py --kernel gated --shape qwen3-up \
  --changes '{"sequential_gate": true, "block_n": 256, "swizzled_epilogue": true}' \
  > $W/ptxas-seq-qwen3.log 2>&1; echo "ptxas qwen3 rc=$?"
grep -h '^{' $W/ptxas-seq-*.log
grep -a -i -E "registers|spill" $W/ptxas-seq-mixtral.log | tail -4
timeout 150 python3 benchmarks/gated_tiles_probe.py --out-dir $W/seq --phases kernel \
  --presets mixtral,dsv3,qwen3 --variants default,sequential --rounds 8 --time-budget-s 120 \
  > $W/seq.log 2>&1; echo "sequential kernel rc=$?"
timeout 100 python3 benchmarks/variant_clock_probe.py --out-dir $W/seq-layer --phases 8 \
  --phase-s 3 --pass fwd --sites gated --variants "{\"seq\": $SEQ}" > $W/seq-layer.log 2>&1
echo "sequential layer rc=$?"
timeout 100 python3 benchmarks/variant_clock_probe.py --out-dir $W/bn128 --phases 8 --phase-s 3 \
  --pass fwd --sites gmm --variants '{"bn128": {"block_n": 128}}' > $W/bn128.log 2>&1
echo "bn128 rc=$?"
kill $SMI
awk -F, 'NR>1 && $4+0>600 {c+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz\n", n, c/n}' $W/smi-trace.csv
python3 -c "
import json
for r in json.load(open('$W/seq/gated-tiles-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})" 2>&1 | tail -5
grep '^{' $W/seq-layer.log | tail -8
grep '^{' $W/bn128.log | tail -8
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
