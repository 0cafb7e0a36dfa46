#!/usr/bin/env bash
# Session 19, call 6: every kernel a public grouped_matmul call launches (the Mosaic kernel and
# the XLA ops building its work list) with durations, the gemm bench's own functions, against
# torch's one ~1.8 us preparation kernel (call 2). Is the balanced forwards' 1-1.5% gap there?
# Run from the repository root: bash benchmarks/results/raw/h100-run19/call6/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s19c6; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
timeout 300 python3 benchmarks/gmm_launch_profile.py --out-dir $W/profile > $W/profile.log 2>&1; echo "profile rc=$?"
python3 -c "
import json
for r in json.load(open('$W/profile/gmm-launch-profile.json'))['rows']:
    print(r['shape'], r['routing'], r['pass'], 'total', round(r['total_ms'], 4), 'span', round(r['span_ms'], 4), 'launches', r['kernels'])
    for k in r['rows']:
        print('   ', round(k['ms'] * 1000, 2), 'us', k['launches'], k['op'][:60], k['kernel'][:60])
"
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
