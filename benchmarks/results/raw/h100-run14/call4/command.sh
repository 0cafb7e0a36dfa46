#!/usr/bin/env bash
# Session 13, H100 call 4 (<= 300 s): where the Mixtral layer's time goes outside the nine grouped
# matmuls: every op's kernel time (fwd and fwd+bwd, command buffers off to name the ops) and the
# optimized HLO of both functions (which elementwise passes XLA fused, and how).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s13c4; rm -rf $W; mkdir -p $W
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 240 python3 benchmarks/layer_profile.py --presets mixtral \
  --passes fwd,fwd+bwd --top 60 --dump-hlo --out-dir $W > $W/profile.log 2>&1; echo "profile rc=$?"
grep -v "^$" $W/profile.log | cut -c1-160 | head -90
tar czf "$OUT/call.tgz" -C $W .
