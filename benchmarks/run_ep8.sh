#!/usr/bin/env bash
# Issue 7 in one device call (kind nvidia-h200-x8): the layer at EP=8 on Megatron-Core's two
# per-layer proxies with forced-balanced routing (4096 tokens per GPU, bf16, fwd+bwd), dropless
# (the default: slots of 1.125x the balanced share, which forced-balanced routing always fits;
# the run reports fullest_slot_over_share) and with ep_receive_factor=1.25; the exchange at
# EP=8 against the dense all_to_all; and the dense bf16 peak of one GPU, measured in the same
# call. Writes under $OUT.
#   run (device tool, kind nvidia-h200-x8): bash benchmarks/run_ep8.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/jaxmoe-ep8}
mkdir -p "$OUT"
python3 -c 'import json, jax.numpy as jnp; from jaxmoe.bench.layer import measure_dense_peak; print(json.dumps(measure_dense_peak(jnp.bfloat16)))' >"$OUT/dense-peak.json" 2>>"$OUT/log"
cases=megatron-mixtral,megatron-dsv3
timeout 240 python3 -m jaxmoe bench ep --ep 8 --parts layer --preset $cases --receive-factor none \
  --out "$OUT/ep8-h200-layer-dropless.json" >>"$OUT/log" 2>&1
timeout 180 python3 -m jaxmoe bench ep --ep 8 --parts layer --preset $cases --receive-factor 1.25 \
  --out "$OUT/ep8-h200-layer-rf125.json" >>"$OUT/log" 2>&1
timeout 120 python3 -m jaxmoe bench ep --ep 8 --parts exchange --preset dsv3 --exchange-ep 8 \
  --exchanges all_to_all,all_to_all_chunked --out "$OUT/ep8-h200-exchange.json" >>"$OUT/log" 2>&1
rm -f "$OUT"/*.md  # at most 8 files come back
cat "$OUT/dense-peak.json"; grep -a -h "tflops_per_gpu\|gbps" "$OUT"/*.json | head -40
