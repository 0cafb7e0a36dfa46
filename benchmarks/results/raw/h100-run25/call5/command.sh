#!/usr/bin/env bash
# Session 25, call 5 (<= 420 s, one H100): does the weight multicast (the default on Mixtral's
# products since run 22) pay on the layer's group sizes? Call 3 (5 rounds, layer kind of
# groups) had it 0.94x / 0.98x / 0.99x / 0.98x against the same tiles without (Mixtral down fwd,
# dgrad, up fwd, dgrad), where run 22 call 1 (balanced) had 1.03-1.05x.
#  1. mosaic_probe: Mixtral up and down, fwd and dgrad, without (default) and with (mc) the
#     multicast and torch, 8 interleaved rounds, on balanced groups and on the layer's kind.
#  2. group_start_probe: the Mixtral layer, fwd and fwd+bwd, the default (multicast) against
#     the same tiles without it, 10 settled interleaved rounds.
# Run from the repository root: bash benchmarks/results/raw/h100-run25/call5/command.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s25c5; rm -rf $W; mkdir -p $W/balanced $W/layerkind $W/layer
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
for routing in balanced layer; do
  out=$W/balanced; [ $routing = layer ] && out=$W/layerkind
  timeout 110 python3 benchmarks/mosaic_probe.py --out-dir $out --phases time \
    --shapes mixtral-down,mixtral-up --variants default,mc --time-routing $routing \
    --rounds 8 --time-budget-s 100 > $out.log 2>&1; echo "$routing rc=$?"
  grep '^{' $out.log | grep '"phase": "time"' | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print({k: v for k, v in r.items() if k in ('routing','shape','op','impl','ms','min_ms')})
"
done
timeout 170 python3 benchmarks/group_start_probe.py --out-dir $W/layer --stem multicast \
  --sites gmm --presets mixtral --rounds 10 --time-budget-s 160 \
  --variants '{"multicast": {}, "no_multicast": {"multicast_weights": false}}' \
  > $W/layer.log 2>&1; echo "layer rc=$?"
grep '^{' $W/layer.log | cut -c1-400
tar czf "$OUT/call.tgz" -C $W .
