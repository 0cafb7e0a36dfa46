#!/usr/bin/env bash
# Session 7, H100 call 4 (<= 580 s): the Mosaic wgrad against the Triton one inside fwd+bwd
# (backend 'pallas' vs the default), the layer with the FP8 recipes (K-major weight quantization
# after a bf16 transpose; the blockwise Mosaic kernel), the mock 4-GPU EP compile, autotuning off.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
timeout 230 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe,jaxmoe_pallas --routings balanced \
  --pass fwd+bwd --out-dir $W --stem gemm-wgrad --time-budget-s 200 > $W/gemm.log 2>&1; echo "gemm rc=$?"
tr '\r' '\n' < $W/gemm.log | grep -a -E "TFLOP/s|ERROR|budget" | tail -20
timeout 230 python3 -m jaxmoe bench layer --preset mixtral,dsv3 \
  --impls torch,jaxmoe,jaxmoe-fp8-rowwise,jaxmoe-fp8-blockwise --out $W/layer-fp8.json > $W/layer.log 2>&1
echo "layer rc=$?"; tr '\r' '\n' < $W/layer.log | grep -a -v Warn | tail -22
XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 100 python3 benchmarks/ep_mock_topology.py --ep 4 \
  --tokens 512 --hidden 1024 --ffn 512 --variants default,chunks2 --tag=-noautotune --out-dir $W \
  2>&1 | grep -v -E "Warn" | tail -14
tar czf "$OUT/call.tgz" -C $W .
