#!/usr/bin/env bash
# Session 31, H100 run 31 call 3 (<= 560 s), on the working tree with
# MosaicTileConfig.zero_foreign_halves (new, off by default): a tile's lhs half that holds none of
# its work item's rows (the next group's, multiplied and thrown away) loaded from zeros, after
# call 2 found a zero row ~28% cheaper than a data row at the power limit.
# 1. zero_rows_probe on the layer's kind of groups (multinomial loads padded to 64, half tiles
#    at group ends): the gmm with and without it, Mixtral down and up, Qwen3 up; results equal.
# 2. group_start_probe: the layer with it on the plain gmm's and the fused gated kernel's
#    default tiles against the default, Mixtral and Qwen3, fwd and fwd+bwd, outputs compared.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s31c3; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm,temperature.gpu --format=csv > $W/smi-start.txt
cat $W/smi-start.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -l 2 > $W/smi-trace.csv &
SMI=$!
timeout 150 python3 benchmarks/zero_rows_probe.py --out-dir $W --routing layer \
  --variants data,zero_foreign_halves --shapes mixtral-down,mixtral-up,qwen3-up --rounds 16 > $W/zero.log 2>&1
echo "zero rc=$?"; grep '^{' $W/zero.log
timeout 360 python3 benchmarks/group_start_probe.py --out-dir $W --stem zero-halves \
  --variants '{"default": {}, "zero_halves": {"zero_foreign_halves": true}}' --sites gmm,gated \
  --presets mixtral,qwen3 --passes fwd+bwd,fwd --rounds 10 --time-budget-s 330 > $W/layer.log 2>&1
echo "layer rc=$?"
python3 -c "
import json
for r in json.load(open('$W/zero-halves.json'))['rows']:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})"
kill $SMI
awk -F, 'NR>1 && $3+0>300 {c+=$2; p+=$3; n++} END {if (n) printf "smi: %d loaded samples, mean SM clock %.0f MHz, power %.0f W\n", n, c/n, p/n}' $W/smi-trace.csv
grep -a -i -B3 "error" $W/*.log | tail -20
tar czf "$OUT/call.tgz" -C $W .
