#!/usr/bin/env bash
# Session 9, H100 call 1 (<= 590 s): where the FP8 layer's time goes (kernel time per op, rowwise,
# Mixtral and DeepSeek, fwd and fwd+bwd, wgrad now on the bf16 Mosaic kernel); the FP8 gemm's
# default tiles against the same tiles on the hand-written ring (six shapes, torch interleaved);
# the fused GLU kernel on the ring (exactness, fwd, fwd+bwd with the kernel writing residuals).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s9c1; rm -rf $W; mkdir -p $W
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 130 python3 benchmarks/layer_profile.py \
  --presets mixtral,dsv3 --fp8-recipe rowwise --out-dir $W > $W/fp8-profile.log 2>&1; echo "profile rc=$?"
grep -a -E "^###|^\| (mpmd|loop|input|fusion|gemm|wrapped|triton)" $W/fp8-profile.log | head -60
timeout 210 python3 benchmarks/grouped_matmul_fp8.py --skip-checks --sweep ring \
  --out $W/fp8-ring.json > $W/fp8-ring.log 2>&1; echo "fp8 ring rc=$?"
grep -a -E "'impl'" $W/fp8-ring.log | python3 -c "
import ast,sys
for l in sys.stdin:
    r=ast.literal_eval(l.strip()); print(r.get('shape'), r.get('impl')[:60], r.get('ms'), r.get('ratio_vs_torch_fp8'), r.get('rel_err_vs_fp64'), r.get('error','')[:80])"
timeout 200 python3 benchmarks/fused_glu_probe.py --shapes mixtral,dsv3,qwen3 --layers "" --ring \
  --out-dir $W > $W/glu-ring.log 2>&1; echo "glu ring rc=$?"
grep -a '"phase": "ring"' $W/glu-ring.log | cut -c1-900
tar czf "$OUT/call.tgz" -C $W .
