#!/usr/bin/env bash
# Prepared in session 22 (its device time spent), for the first call of the next session
# (<= 590 s, one H100: name kind nvidia-h100-x1).
#  1. The wgrad in clusters of two CTAs at neighbouring K tiles, the rhs block multicast
#     (MosaicTgmmTileConfig.multicast_rhs, built in session 22, only lowered so far) on the GPU
#     for the first time: smoke, exactness on the six shapes balanced and skewed (NaN past the
#     sum, empty groups, a poisoned output), then balanced timing against the default
#     (split rows) and torch's wgrad, settled rounds; the Mixtral layer's fwd+bwd with each as
#     the wgrad's default (AOT-compiled per variant), gradients compared. A barrier bug would
#     hang: each step has its own timeout.
#  2. The fused gated kernel with the weight multicast (already exact on the GPU, run 19 call 1)
#     in the Mixtral layer's forward, sustained alternating 3 s phases with SM clock and power.
#     The forward only: under jax.grad the gate and up projections run as two plain gmm calls
#     (which multicast already), so that the residuals are kept (residuals_from_kernel=False).
# Predicted: the multicast wgrad 1.02-1.05x on Mixtral's products (the plain gmm's was
# 1.03-1.05x, run 22 call 1), ~1% of the layer's fwd+bwd (3 of its 9 products); the gated
# kernel 1-2% of the layer's forward (2 of its 3 products).
# Run from the repository root: bash benchmarks/results/raw/h100-run23/call1/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s23c1; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 5 > $W/smi-trace.csv &
SMI=$!
show() { python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})" "$1"; }
V=m64k128n256s4e64split,m64k128n256s4e64splitmc
timeout 170 python3 benchmarks/mosaic_wgrad_probe.py --out-dir $W/exact --phases smoke,exact \
  --variants $V --exact-variants m64k128n256s4e64splitmc --time-budget-s 160 \
  > $W/exact.log 2>&1; echo "exact rc=$?"
show $W/exact/mosaic-wgrad-probe.json | grep -v "'ok': True" | tail -12
grep -c "'ok': True" <(show $W/exact/mosaic-wgrad-probe.json)
timeout 250 python3 benchmarks/mosaic_wgrad_probe.py --out-dir $W/time --phases time,layer \
  --variants $V --routings balanced --rounds 8 --presets mixtral --time-budget-s 200 \
  > $W/time.log 2>&1; echo "time rc=$?"
show $W/time/mosaic-wgrad-probe.json | tail -16
timeout 120 python3 benchmarks/variant_clock_probe.py --out-dir $W/gated --phases 8 --phase-s 3 \
  --pass fwd --sites gated --variants '{"multicast": {"multicast_weights": true}}' > $W/gated.log 2>&1
echo "gated rc=$?"
grep '^{' $W/gated.log | tail -10
kill $SMI
grep -a -i -B2 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
