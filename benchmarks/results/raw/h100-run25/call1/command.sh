#!/usr/bin/env bash
# Prepared in session 24 (its device time spent), for the next session (<= 420 s, one H100:
# kind nvidia-h100-x1). The permutation's dispatch gather runs at ~1.3 TB/s (run 24 call 8:
# 228 us of the Qwen3-like forward's 1.45 ms; the fwd+bwd's two gathers 383 us of 4.2 ms).
# Run 24 call 9: a uint32 view of the rows made the gather alone 1.2-1.3x faster but the
# layers 0.90-0.95x (the bitcasts keep XLA from fusing it with its neighbours). Here
# `blocks`: the rows viewed as [T, H / 8, 8] (a reshape, no bitcast), so XLA may move 16 bytes
# per inner row and still fuse. The gather alone on the three presets (take, words, blocks),
# then the Qwen3 and DeepSeek layers (take, blocks), fwd and fwd+bwd, settled, interleaved.
# Adopt `blocks` in jaxmoe.permutation._gather_rows only if the layers gain.
# Run from the repository root: bash benchmarks/results/raw/h100-run25/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s25c1; rm -rf $W; mkdir -p $W/gather $W/layer
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 100 python3 benchmarks/row_gather_probe.py --out-dir $W/gather --phases gather \
  --presets qwen3,dsv3,mixtral --variants words,blocks --rounds 10 > $W/gather.log 2>&1
echo "gather rc=$?"
grep '^{' $W/gather.log | cut -c1-400
timeout 280 python3 benchmarks/row_gather_probe.py --out-dir $W/layer --phases layer \
  --presets qwen3,dsv3 --variants blocks --rounds 8 > $W/layer.log 2>&1; echo "layer rc=$?"
grep '^{' $W/layer.log | cut -c1-330
grep -a -i -B2 "error" $W/*.log | tail -10
tar czf "$OUT/call.tgz" -C $W .
