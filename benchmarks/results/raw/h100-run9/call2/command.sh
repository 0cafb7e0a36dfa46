#!/usr/bin/env bash
# Session 8, H100 call 2 (<= 300 s): where the layer's time goes, jaxmoe (kernel time per XLA op,
# command buffers off so each kernel names its op; then with them on, as the bench runs) and the
# torch peer (per CUDA kernel, its own process), three presets, fwd and fwd+bwd.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W/cb
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 150 python3 benchmarks/layer_profile.py \
  --out-dir $W > $W/profile-jax.log 2>&1; echo "jax rc=$?"
timeout 100 python3 benchmarks/layer_profile.py --out-dir $W/cb > $W/profile-jax-cb.log 2>&1; echo "jax cb rc=$?"
timeout 100 python3 benchmarks/layer_profile.py --impl torch --out-dir $W > $W/profile-torch.log 2>&1
echo "torch rc=$?"; grep -h "###" $W/*.md $W/cb/*.md
cut -c1-160 $W/layer-profile-jaxmoe.md
tar czf "$OUT/call.tgz" -C $W .
