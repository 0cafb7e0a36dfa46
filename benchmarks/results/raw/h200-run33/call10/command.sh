#!/usr/bin/env bash
# Session 33, H200 run 33 call 10 (<= 100 s, the session's last device seconds): as call 8, for
# the plain dgrad the fused down dgrad replaces (its epilogue a cast and one store). Nsight
# Compute on one launch of the kernel (Mixtral's layer groups, M = 8704), WarpStateStats and
# SourceCounters (sampled warp stalls per SASS instruction), the report exported; then its
# details page and, if this ncu prints it, the per-instruction source page as CSV.
# Run from the repository root: bash benchmarks/results/raw/h200-run33/call10/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s33c10; rm -rf $W; mkdir -p $W
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
cat > $W/one_call.py <<'PY'
import jax, jax.numpy as jnp
from jaxmoe.ops.grouped_matmul import pallas_mosaic
m, h, f = 8704, 4096, 14336
sizes = jnp.asarray([1088, 960, 1088, 1088, 1024, 1024, 1088, 1088], jnp.int32)
k = jax.random.split(jax.random.key(0), 2)
dy = jax.random.normal(k[0], (m, h), jnp.bfloat16)
w = (jax.random.normal(k[1], (8, f, h)) / 64).astype(jnp.bfloat16)
fn = jax.jit(lambda *a: pallas_mosaic.gmm(*a, transpose_rhs=True))
for _ in range(3):
    jax.block_until_ready(fn(dy, w, sizes))
print("ok")
PY
timeout 110 $NCU --section WarpStateStats --section SourceCounters --kernel-name regex:mosaic \
  --launch-skip 2 --launch-count 1 -o $W/plain-dgrad python3 $W/one_call.py > $W/ncu.log 2>&1; echo "ncu rc=$?"
tail -n 4 $W/ncu.log
timeout 20 $NCU --import $W/plain-dgrad.ncu-rep --page details --csv > $W/details.csv 2> $W/details.err; echo "details rc=$?"
grep -a -E "Stall|Warp Cycles|Issued|Eligible" $W/details.csv | cut -d, -f5- | head -40
timeout 20 $NCU --import $W/plain-dgrad.ncu-rep --page source --csv --print-source sass > $W/source.csv 2> $W/source.err; echo "source rc=$?"
head -c 600 $W/source.csv; tail -n 2 $W/source.err
tar czf "$OUT/call.tgz" -C $W .
