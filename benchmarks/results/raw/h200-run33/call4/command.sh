#!/usr/bin/env bash
# Session 33, H200 run 33 call 4 (<= 200 s): the SASS of the fused down dgrad (Mixtral's shape),
# of the plain dgrad it replaces and of the fused gated forward, for the epilogue's instruction
# count (call 3: ~10.5 us a tile settled, of which the activation's math ~4.6 us and the stores
# ~4 us, where the plain dgrad's epilogue is ~2 us). ptxas_probe, one kernel per process
# (MOSAIC_GPU_DUMP_SASS / _PTXAS into one folder each), each checked against the float32
# reference.
# Run from the repository root: bash benchmarks/results/raw/h200-run33/call4/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s33c4; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
for k in down_dgrad dgrad gated; do
  MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_TO=$W/$k timeout 100 \
    python3 benchmarks/ptxas_probe.py --kernel $k > $W/$k.log 2>&1; echo "$k rc=$?"
  grep '^{' $W/$k.log | cut -c1-400
  ls -la $W/$k | head
done
grep -a -h -i "registers\|spill" $W/*.log $W/*/* 2>/dev/null | sort | uniq -c | head -20
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
