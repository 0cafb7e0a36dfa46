set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/poison_check.py --out $OUT --dtypes float32 > /tmp/poison.log 2>&1; echo poison rc=$?
grep "^|" /tmp/poison.log | tail -5
for variant in default off min1 extended; do
  case $variant in
    default) flags="";;
    off) flags="--xla_gpu_enable_command_buffer=";;
    min1) flags="--xla_gpu_graph_min_graph_size=1";;
    extended) flags="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE,DYNAMIC_SLICE_FUSION --xla_gpu_graph_min_graph_size=1";;
  esac
  XLA_FLAGS="$flags" timeout 80 python3 benchmarks/layer_timing_probe.py --out-dir $OUT --presets qwen3 --cases fwd,grad --tag $variant >> $OUT/timing.log 2>&1; echo $variant rc=$?
  grep -v Warn $OUT/timing.log | tail -3 | cut -c1-600
done
