#!/usr/bin/env bash
# Session 12, H100 call 4 (<= 400 s, the machine's last minutes): residuals_from_kernel (the
# forward kernel writing h, gate and up) against the default, 30 interleaved rounds; DeepSeek
# as the noise control (K > 4096: auto takes the unfused composition, so both are one program).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s12c4; rm -rf $W; mkdir -p $W
timeout 360 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases layer --presets mixtral,dsv3,qwen3 \
  --layer-variants unfused,unfused_residuals --rounds 30 --time-budget-s 330 > $W/residuals.log 2>&1; echo "residuals rc=$?"
grep -a '^{' $W/residuals.log | cut -c1-1200
tar czf "$OUT/call.tgz" -C $W .
