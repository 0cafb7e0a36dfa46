#!/usr/bin/env bash
# Session 33, H200 run 33 call 3 (<= 200 s): what the fused down dgrad's epilogue (~12 us a tile,
# H100 run 31) is made of. kernel_trace_probe --kernel down_dgrad with the ring operands'
# epilogue scoped (operand_wait: the barriers of a part's operand steps; operand_read: a
# 64-column block of gate and up into registers; epilogue_math: the activation's derivative;
# epilogue_store: cast, stage, TMA store of the two results), 16 ranges a tile. One group of
# 512 rows so that every tile is whole (no runs) and the ranges fit; settled 1.5 s first.
# Run from the repository root: bash benchmarks/results/raw/h200-run33/call3/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s33c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
S=epilogue_math,epilogue_store,operand_read,operand_wait
timeout 80 python3 benchmarks/kernel_trace_probe.py --out-dir $W/scoped --kernel down_dgrad \
  --cases mixtral-down:512/0/0/0/0/0/0/0 --rows 512 --scopes $S \
  --ranges-per-tile 16 --profile-space 60 --settle-ms 1500 > $W/scoped.log 2>&1; echo "scoped rc=$?"
timeout 80 python3 benchmarks/kernel_trace_probe.py --out-dir $W/plain --kernel down_dgrad \
  --cases mixtral-down:2048/0/0/0/0/0/0/0 --rows 2048 \
  --profile-space 40 --settle-ms 1500 > $W/plain.log 2>&1; echo "plain rc=$?"
cat $W/scoped.log $W/plain.log | grep '^{' | cut -c1-1800
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
