#!/usr/bin/env bash
# Session 29, H100 run 29 call 3 (<= 330 s): call 2's fused down dgrad lost 0.78x at block_n
# 256 (0.96x at 128): its epilogue branched on the warpgroup with the whole accumulator
# captured. Now each warpgroup computes its own step's slot, no branch. ptxas's registers and
# spills of the fused kernel (Mixtral's down dgrad), then the probe's kernel phase again.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s29c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 python3 - > $W/ptxas.log 2>&1 <<'PY'
import jax, jax.numpy as jnp
from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as fm
m, h, f, g = 8192, 4096, 14336, 8
args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in [(m, h), (m, f), (m, f), (g, f, h)]]
args.append(jax.ShapeDtypeStruct((g,), jnp.int32))
jax.jit(lambda *a: fm.fused_down_dgrad(*a, activation="swiglu")).lower(*args).compile()
print("compiled")
PY
echo "ptxas rc=$?"; grep -a -i -E "registers|spill|compiled|error" $W/ptxas.log | head -20
timeout 220 python3 benchmarks/glu_dgrad_probe.py --out-dir $W --phases kernel \
  --presets mixtral,qwen3 --rounds 10 --time-budget-s 200 > $W/probe.log 2>&1; echo "probe rc=$?"
python3 -c "
import json
for r in json.load(open('$W/glu-dgrad-probe.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if 'ms' in k or 'speedup' in k or 'routing' in k or 'preset' in k})"
grep -a -i -B2 "error" $W/probe.log | tail -12
tar czf "$OUT/call.tgz" -C $W .
