set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c 'import jax, torch; print("jax", jax.__version__, "torch", torch.__version__)'
timeout 250 python3 benchmarks/poison_check.py --out $OUT > $OUT/poison.log 2>&1; echo poison rc=$?
tail -15 $OUT/poison.log
timeout 300 python3 benchmarks/layer_timing_probe.py --out-dir $OUT > $OUT/timing.log 2>&1; echo probe rc=$?
cat $OUT/timing.log | grep -v Warning | tail -20
