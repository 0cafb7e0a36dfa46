#!/usr/bin/env bash
# Prepared in session 23, the next session's second call (<= 420 s, one H100: nvidia-h100-x1),
# after call 1 (whose outcome may change the defaults this measures).
#  1. The fused gated kernel against the unfused forward on Mixtral: `jaxmoe-pallas` (the
#     named Mosaic backend) runs the forward unfused (two plain gmm calls that multicast, then
#     XLA's activation pass); torch, jaxmoe (auto) and jaxmoe-pallas in the same settled
#     rounds. AUTO_FUSED_MAX_K (4096) was set before the plain gmm multicast.
#  2. Where the Mixtral forward's time goes, settled (layer_profile, 1.5 s of calls before the
#     profiled one): the kernels, the XLA glue (dispatch gather, argsort, combine); fwd+bwd too.
#  3. The README's Mixtral figures timed through the public API (layer_timing_probe: jit(moe)
#     back to back and synced per call, jit(grad)); last run in run 18 call 7, before the
#     multicast.
# Run from the repository root: bash benchmarks/results/raw/h100-run24/call2/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s24c2; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 150 python3 -m jaxmoe bench layer --preset mixtral --impls torch,jaxmoe,jaxmoe-pallas \
  --pass fwd --repeats 16 --out $W/layer-fwd.json > $W/layer-fwd.log 2>&1; echo "layer rc=$?"
timeout 150 python3 benchmarks/layer_profile.py --presets mixtral --passes fwd,fwd+bwd \
  --settle-s 1.5 --top 30 --out-dir $W/profile > $W/profile.log 2>&1; echo "profile rc=$?"
timeout 100 python3 benchmarks/layer_timing_probe.py --out-dir $W/timing --presets mixtral \
  --cases fwd,grad > $W/timing.log 2>&1; echo "timing rc=$?"
tr '\r' '\n' < $W/layer-fwd.log | grep -a -E " ms |ERROR|Error|skipped" | grep -v "bench " | tail -6
grep -a -E "^###|^\| " $W/profile.log | head -50
grep '^{' $W/timing.log | cut -c1-400
tar czf "$OUT/call.tgz" -C $W .
