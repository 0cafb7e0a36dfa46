#!/usr/bin/env bash
# Session 12, H100 call 5 (<= 400 s): where the fused down-projection dgrad's epilogue time goes:
# the dgrad with one epilogue change at a time (a second store, the loads, the math), three
# presets balanced, interleaved; ptxas register/spill counts where the build prints them.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s12c5; rm -rf $W; mkdir -p $W
MOSAIC_GPU_DUMP_PTXAS=1 timeout 360 python3 benchmarks/glu_dgrad_epilogue_probe.py --out-dir $W > $W/epilogue.log 2>&1; echo "probe rc=$?"
grep -a '^{' $W/epilogue.log | cut -c1-1200
grep -a -iE "spill|registers" $W/epilogue.log | sort | uniq -c | head -20
tar czf "$OUT/call.tgz" -C $W .
