#!/usr/bin/env bash
# Run 21 call 7: where the default's 2 us epilogue goes: the gmm with extra profiler scopes in
# the epilogue (ep_cast; per 64-column chunk ep_wait, ep_smem, ep_issue), built from this commit's
# src copied into an untracked exp21/ with those scopes added; Mixtral up and DeepSeek up at
# few rows (2-4 tiles per CTA, so that 15 ranges a tile fit the profiler's shared memory).
# exp21/ (untracked): rm -rf exp21 && mkdir exp21 && cp -r src exp21/ && (cd exp21 && patch -p1 < ../benchmarks/results/raw/h100-run21/call7/exp21-epilogue-scopes.patch)
# Run from the repository root: bash benchmarks/results/raw/h100-run21/call7/command.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s21c7; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit --format=csv > $W/gpu.csv; cat $W/gpu.csv
for spec in mixtral-up:1024:62 dsv3-up:4096:33; do
  shape=${spec%%:*}; rest=${spec#*:}; rows=${rest%%:*}; space=${rest##*:}; d=$W/$shape; mkdir -p $d
  PYTHONPATH=exp21/src timeout 90 python3 benchmarks/kernel_trace_probe.py --out-dir $d --cases $shape:balanced \
    --rows $rows --profile-space $space --ranges-per-tile 15 > $d/probe.log 2>&1; echo "$shape rc=$?"
  grep '^{' $d/probe.log | cut -c1-700
done
tar czf "$OUT/call.tgz" -C $W .
