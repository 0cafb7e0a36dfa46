#!/usr/bin/env bash
# Session 8, H100 call 1 (<= 560 s): where the layer's time goes (kernel time per XLA op, and the
# torch peer's per CUDA kernel), the three presets, fwd and fwd+bwd; the gemm Qwen3 skewed rows.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 300 python3 benchmarks/layer_profile.py --presets mixtral,dsv3,qwen3 --torch --out-dir $W \
  > $W/profile.log 2>&1; echo "profile rc=$?"; grep -v Warn $W/profile.log | cut -c1-150 | head -300
timeout 230 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --shapes qwen3-up,qwen3-down --out-dir $W --stem gemm-qwen3-skewed --time-budget-s 200 \
  > $W/gemm.log 2>&1; echo "gemm rc=$?"; tr '\r' '\n' < $W/gemm.log | grep -a -E "TFLOP/s|ERROR" | tail -12
tar czf "$OUT/call.tgz" -C $W .
