#!/usr/bin/env bash
# Prepared in session 23 (its device time spent), for the first call of the next session
# (<= 560 s, one H100: name kind nvidia-h100-x1).
# The Mixtral layer's forward is issue 15's edge now: 1.21-1.28x torch on six chips (bar 1.25x).
#  1. The fused gated kernel against the unfused forward on Mixtral. AUTO_FUSED_MAX_K (4096)
#     was set when the plain gmm had no cluster; since session 22 the plain gmm multicasts its
#     weights on Mixtral's experts (1.03-1.05x), the fused kernel does not (with it: no gain,
#     run 23 call 1). `jaxmoe-pallas` (the named Mosaic backend) runs the forward unfused: two
#     plain gmm calls and XLA's activation pass. Torch, jaxmoe (auto: fused) and jaxmoe-pallas
#     in the same settled rounds, forward only (under jax.grad both run the unfused forward).
#     If jaxmoe-pallas wins, `auto` should take the unfused path where the plain gmm multicasts
#     (K * F >= MULTICAST_MIN_WEIGHT_ELEMENTS), then re-measure the layer table.
#  2. The down projection's wave tail in the Mixtral forward: on the bench's routing its 69 work
#     items make 560 cluster units on 66 clusters (8.48 waves in 9 rounds, ~5.8% idle).
#     block_n 128 (a tile-config change only; lowers for CUDA) makes 1120 units (16.97 waves,
#     0.2% idle) at the cost of m64n128 products (the gated kernel's shape, ~2.5% below
#     m64n256 in run 14). The forward alone, sustained phases, the plain gmm's tiles only (in
#     the forward that is the down projection; the gated kernel has its own).
#  3. Where the Mixtral forward's time goes today, settled (layer_profile, 1.5 s of calls
#     before the profiled one): the kernels, the XLA glue (dispatch gather, argsort, combine).
#  4. The README's Mixtral figures timed through the public API on session 22's default
#     (layer_timing_probe: jit(moe) back to back and synced per call, jit(grad)); last run in
#     run 18 call 7, before the multicast.
# Run from the repository root: bash benchmarks/results/raw/h100-run24/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s24c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
timeout 200 python3 -m jaxmoe bench layer --preset mixtral --impls torch,jaxmoe,jaxmoe-pallas \
  --pass fwd --repeats 16 --out $W/layer-fwd.json > $W/layer-fwd.log 2>&1; echo "layer rc=$?"
timeout 120 python3 benchmarks/variant_clock_probe.py --out-dir $W/bn128 --phases 8 --phase-s 3 \
  --pass fwd --sites gmm --variants '{"bn128": {"block_n": 128}}' > $W/bn128.log 2>&1
echo "bn128 rc=$?"
timeout 150 python3 benchmarks/layer_profile.py --presets mixtral --passes fwd,fwd+bwd \
  --settle-s 1.5 --top 30 --out-dir $W/profile > $W/profile.log 2>&1; echo "profile rc=$?"
timeout 90 python3 benchmarks/layer_timing_probe.py --out-dir $W/timing --presets mixtral \
  --cases fwd,grad > $W/timing.log 2>&1; echo "timing rc=$?"
kill $SMI
awk -F, 'NR>1 && $4+0>600 {c+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz\n", n, c/n}' $W/smi-trace.csv
tr '\r' '\n' < $W/layer-fwd.log | grep -a -E " ms |ERROR|Error|skipped" | grep -v "bench " | tail -6
grep '^{' $W/bn128.log | tail -8
grep -a -E "^###|^\| " $W/profile.log | head -50
grep '^{' $W/timing.log | cut -c1-400
tar czf "$OUT/call.tgz" -C $W .
