#!/usr/bin/env bash
# Session 8, H100 call 4 (<= 590 s): the Mosaic wgrad with one ring across a CTA's tiles
# (cross_tile, the new default) against a pipeline per tile: smoke (NaN rows, empty groups),
# exactness on the six shapes balanced and skewed, timing next to Triton's and torch's; then the
# gemm fwd+bwd rows (balanced) with the new default, torch interleaved.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
timeout 340 python3 benchmarks/mosaic_wgrad_probe.py --out-dir $W --time-budget-s 310 \
  --variants m64k128n256s3,m64k128n256s3pertile,m64k128n128s4,m64k64n256s4 > $W/probe.log 2>&1
echo "probe rc=$?"; grep -a -o -E '"(phase|shape|routing|impl|ok|rel_err|ms|tflops|error)": [^,]*' $W/probe.log \
  | paste -sd' ' | sed 's/"phase"/\n"phase"/g' | cut -c1-220 | tail -75
timeout 220 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced --pass fwd+bwd \
  --shapes mixtral-up,mixtral-down,dsv3-up,dsv3-down --out-dir $W --stem gemm-fwdbwd --time-budget-s 200 \
  > $W/gemm.log 2>&1; echo "gemm rc=$?"; tr '\r' '\n' < $W/gemm.log | grep -a -E "TFLOP/s|ERROR" | tail -10
tar czf "$OUT/call.tgz" -C $W .
