#!/usr/bin/env bash
# Session 7, H100 call 1 (<= 560 s): the FP8 weight-quantization layouts, the gmm host launch time
# after its work list lost its loop, the EP layer compiled for a mock 4-GPU topology (does it
# compile; what overlaps the all-to-alls), and the gmm's L2 swizzle width.
#   run (device tool): bash benchmarks/run_h100_s7a.sh   (everything comes back in $OUT/call.tgz)
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout 80 python3 benchmarks/fp8_quantize_probe.py --out-dir $W 2>&1 | grep -v Warn | tail -9
timeout 50 python3 benchmarks/dispatch_probe.py --out-dir $W 2>&1 | grep -v Warn | tail -6
timeout 150 python3 benchmarks/ep_mock_topology.py --ep 4 --tokens 512 --hidden 1024 --ffn 512 \
  --variants default,chunks2,chunks2_copies --out-dir $W 2>&1 | grep -v -E "Warn|^ *\{" | tail -12
timeout 230 python3 benchmarks/mosaic_probe.py --phases time --shapes qwen3-up,qwen3-down,dsv3-up,mixtral-up \
  --variants s4e64,s4e64chain,s4e64g4,s4e64g16,s4e64g32,s4e64chaing16 --out-dir $W --time-budget-s 210 \
  > $W/probe.log 2>&1
grep -a -o -E '"(shape|op|impl|variant|tflops|ms)": [^,]*' $W/probe.log | paste -sd' ' | sed 's/"shape"/\n"shape"/g' | tail -60
tar czf "$OUT/call.tgz" -C $W .
