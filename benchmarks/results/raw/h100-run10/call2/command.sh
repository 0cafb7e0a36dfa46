#!/usr/bin/env bash
# Session 9, H100 call 2 (<= 590 s): the FP8 gemm with the new default tiles (the ring, swizzled
# epilogue): GPU checks (skewed, empty groups, tails, pallas vs xla values and grads), per shape
# the default against the session-7 pipeline tiles on skewed groups (bitwise), timing against
# torch._scaled_grouped_mm, the blockwise recipe on the ring; then the bf16 gemm table's Qwen3
# rows with the ring default (qwen3-down balanced, qwen3 skewed), torch interleaved.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s9c2; rm -rf $W; mkdir -p $W
timeout 270 python3 benchmarks/grouped_matmul_fp8.py --sweep ring \
  --out $W/grouped_matmul-fp8.json > $W/fp8.log 2>&1; echo "fp8 rc=$?"
grep -a -E "'check'|'impl'" $W/fp8.log | python3 -c "
import ast,sys
for l in sys.stdin:
    r=ast.literal_eval(l.strip())
    if 'check' in r: print(r); continue
    print(r.get('shape'), r.get('impl')[:70], r.get('ms'), r.get('ratio_vs_torch_fp8'), r.get('rel_err_vs_fp64'), r.get('error','')[:80])"
timeout 120 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced --shapes qwen3-down \
  --out-dir $W --stem gemm-balanced-qwen3-down --time-budget-s 110 > $W/gemm-balanced.log 2>&1; echo "balanced rc=$?"
timeout 180 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings skewed --shapes qwen3-up,qwen3-down \
  --out-dir $W --stem gemm-skewed-qwen3 --time-budget-s 170 > $W/gemm-skewed.log 2>&1; echo "skewed rc=$?"
cat $W/gemm-balanced.log $W/gemm-skewed.log | tr '\r' '\n' | grep -a -E "TFLOP/s|ERROR|budget" | tail -14
tar czf "$OUT/call.tgz" -C $W .
