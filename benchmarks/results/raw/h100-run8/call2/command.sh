#!/usr/bin/env bash
# Session 7, H100 call 2 (<= 580 s): the FP8 blockwise Mosaic kernel's first GPU check and timing,
# the mock 4-GPU EP compile with XLA's autotuning off (call 1: it never finished with it on),
# and the grouped-matmul table (balanced, six shapes, peers interleaved per case).
#   run (device tool): bash benchmarks/run_h100_s7b.sh   (everything comes back in $OUT/call.tgz)
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
timeout 150 python3 benchmarks/grouped_matmul_fp8.py --out $W/grouped_matmul-fp8-blockwise.json \
  --shapes mixtral-up,dsv3-up,qwen3-down > $W/fp8.log 2>&1; echo "fp8 rc=$?"
grep -a -v Warn $W/fp8.log | tail -25
XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 110 python3 benchmarks/ep_mock_topology.py --ep 4 \
  --tokens 512 --hidden 1024 --ffn 512 --variants default,chunks2 --tag -noautotune --out-dir $W \
  2>&1 | grep -v -E "Warn" | tail -14
timeout 290 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --out-dir $W --stem gemm-balanced --time-budget-s 260 > $W/gemm.log 2>&1; echo "gemm rc=$?"
grep -a -E "TFLOP/s|ERROR|budget" $W/gemm.log | tail -30
tar czf "$OUT/call.tgz" -C $W .
