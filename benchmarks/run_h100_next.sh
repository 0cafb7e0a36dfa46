#!/usr/bin/env bash
# One nvidia-h100-x1 call (<= 590 s) with what session 6 left unmeasured, in priority order:
#   1. the FP8 weight quantization with the K-major transpose kept out of the cast's fusion
#      (fp8_quantize_probe.py: two barrier variants against 2.34 ms fused; if one wins, use it
#      in ops/fp8/pallas_mosaic.py and re-time the FP8 layer);
#   2. the host launch time of a grouped matmul after its work list lost its loop
#      (dispatch_probe.py: a Pallas gmm was ~0.2 ms before, an XLA fusion ~0.05 ms);
#   3. the grouped-matmul rows the session-6 table lacks: Qwen3 (balanced) and skewed groups.
#   run (device tool): bash benchmarks/run_h100_next.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/jaxmoe-h100}
mkdir -p "$OUT"
timeout 80 python3 benchmarks/fp8_quantize_probe.py --out-dir "$OUT" 2>&1 | grep -v Warn | tail -9
timeout 60 python3 benchmarks/dispatch_probe.py --out-dir "$OUT" 2>&1 | grep -v Warn | tail -6
timeout 160 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced \
  --shapes qwen3-up,qwen3-down --out-dir "$OUT" --stem gemm-qwen3 --time-budget-s 140 \
  > "$OUT/gemm.log" 2>&1
timeout 250 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed \
  --out-dir "$OUT" --stem gemm-skewed --time-budget-s 230 >> "$OUT/gemm.log" 2>&1
grep -a -E "TFLOP/s|ERROR|budget" "$OUT/gemm.log" | tail -30
rm -f "$OUT"/*.md
