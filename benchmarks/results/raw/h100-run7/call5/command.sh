set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 60 python3 benchmarks/fp8_quantize_probe.py --out-dir $OUT 2>&1 | grep -v Warn | tail -8
timeout 200 python3 -m jaxmoe.cli.main bench layer --preset all --impls torch,jaxmoe --out $OUT/layer.json > $OUT/layer.log 2>&1; echo layer rc=$?
grep -v Warn $OUT/layer.log | tail -14
timeout 300 python3 benchmarks/grouped_matmul.py --impls torch,jaxmoe --routings balanced --out-dir $OUT --stem gemm-balanced --time-budget-s 270 > $OUT/gemm.log 2>&1; echo gemm rc=$?
grep -a -E "TFLOP/s|ERROR|budget" $OUT/gemm.log | tail -30
rm -f $OUT/*.md
