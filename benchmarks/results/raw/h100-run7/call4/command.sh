set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 200 python3 -m jaxmoe.cli.main bench layer --preset mixtral,dsv3 --impls torch,jaxmoe,jaxmoe-fp8-rowwise --out $OUT/layer-fp8.json > $OUT/layer-fp8.log 2>&1; echo layer rc=$?
grep -v Warn $OUT/layer-fp8.log | tail -18
timeout 100 python3 benchmarks/poison_check.py --out $OUT --configs skewed-all-to-one --dtypes float32 > /tmp/poison.log 2>&1; echo poison rc=$?
grep "^|" /tmp/poison.log | tail -2
