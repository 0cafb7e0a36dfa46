set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/poison_check.py --out $OUT --configs skewed-all-to-one --dtypes float32 > /tmp/poison.log 2>&1; echo poison rc=$?
grep "^|" /tmp/poison.log | tail -2
timeout 60 python3 benchmarks/dispatch_probe.py --out-dir $OUT 2>&1 | grep -v Warn | tail -7
timeout 330 python3 -m jaxmoe.cli.main bench layer --preset all --impls torch,jaxmoe,jaxmoe-fp8-rowwise --out $OUT/layer.json > $OUT/layer.log 2>&1; echo layer rc=$?
grep -v Warn $OUT/layer.log | tail -22
