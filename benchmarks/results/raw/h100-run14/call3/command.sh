#!/usr/bin/env bash
# Session 13, H100 call 3 (<= 590 s): the gemm table's skewed Mixtral and DeepSeek rows on the
# current default, then the layer table (torch, torchtitan, jaxmoe interleaved), so that the
# gemm and layer tables both come from this session's code.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s13c3; rm -rf $W /tmp/site; mkdir -p $W
export PYTHONPATH=src
timeout 265 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --shapes mixtral-up,mixtral-down,dsv3-up,dsv3-down --out-dir $W --stem gemm-skewed \
  --time-budget-s 240 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
tr '\r' '\n' < $W/gemm-skewed.log | grep -a -E "TFLOP/s|ERROR|budget" | grep -v "^TFLOP" | tail -18
pip install --no-index --no-deps --target /tmp/site .whl/*.whl > $W/pip.log 2>&1; echo "pip rc=$?"
export PYTHONPATH=src:/tmp/site
timeout 290 python3 -m jaxmoe bench layer --preset mixtral,dsv3,qwen3 \
  --impls torch,torchtitan,jaxmoe --out $W/layer.json > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms |ERROR|skipped" | grep -v "bench layer" | tail -20
tar czf "$OUT/call.tgz" -C $W .
