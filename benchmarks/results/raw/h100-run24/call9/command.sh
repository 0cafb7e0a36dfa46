#!/usr/bin/env bash
# Session 24, call 9 (<= 400 s, one H100: kind nvidia-h100-x1). Call 8's profiles put the
# dispatch gather of the Qwen3-like forward at 228 us for a ~300 MB buffer (~1.3 TB/s, a sixth
# of the forward). row_gather_probe: the gather on a uint32 view of the bf16 rows against the
# library's jnp.take, alone on the three presets' dispatch, then in the Qwen3 and DeepSeek
# layers (fwd, fwd+bwd), settled and interleaved.
# Run from the repository root: bash benchmarks/results/raw/h100-run24/call9/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s24c9; rm -rf $W; mkdir -p $W/gather $W/layer
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 90 python3 benchmarks/row_gather_probe.py --out-dir $W/gather --phases gather \
  --presets qwen3,dsv3,mixtral --rounds 10 > $W/gather.log 2>&1; echo "gather rc=$?"
grep '^{' $W/gather.log | cut -c1-330
timeout 280 python3 benchmarks/row_gather_probe.py --out-dir $W/layer --phases layer \
  --presets qwen3,dsv3 --rounds 8 > $W/layer.log 2>&1; echo "layer rc=$?"
grep '^{' $W/layer.log | cut -c1-330
grep -a -i -B2 "error" $W/*.log | tail -10
tar czf "$OUT/call.tgz" -C $W .
