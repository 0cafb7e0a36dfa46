#!/usr/bin/env bash
# Session 7, H100 call 6 (<= 585 s): the gmm's swizzled epilogue against the current one; the
# DeepSeek-like EP layer (T=4096/GPU, H=7168) compiled for mock 4- and 8-GPU topologies after the
# loop-free search, with a training step's cotangent (what overlaps the exchanges; memory); one
# XLA scheduler flag; the qwen3 layer rows.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/w; mkdir -p $W
timeout 220 python3 benchmarks/mosaic_probe.py --phases smoke,time --shapes qwen3-up,qwen3-down,dsv3-down,mixtral-up \
  --variants s4e64,s4e64swz,s4e64chain,s4e64chainswz --out-dir $W --time-budget-s 190 > $W/probe.log 2>&1
echo "probe rc=$?"; grep -a -o -E '"(phase|shape|op|impl|variant|ok|rel_err|ms)": [^,]*' $W/probe.log | paste -sd' ' \
  | sed 's/"phase"/\n"phase"/g' | tail -40
A=--xla_gpu_autotune_level=0
XLA_FLAGS=$A timeout 110 python3 benchmarks/ep_mock_topology.py --ep 4 --variants default,chunks2 \
  --tag=-ep4 --out-dir $W 2>&1 | grep -v -E "Warn|^ *\{" | tail -4
XLA_FLAGS="$A --xla_gpu_experimental_parallel_collective_overlap_limit=2" timeout 60 python3 \
  benchmarks/ep_mock_topology.py --ep 4 --variants chunks2 --tag=-ep4-overlap2 --out-dir $W 2>&1 \
  | grep -v -E "Warn|^ *\{" | tail -3
XLA_FLAGS=$A timeout 90 python3 benchmarks/ep_mock_topology.py --ep 8 --variants default \
  --tag=-ep8 --out-dir $W 2>&1 | grep -v -E "Warn|^ *\{" | tail -3
timeout 90 python3 -m jaxmoe bench layer --preset qwen3 --impls torch,jaxmoe --out $W/layer-qwen3.json \
  > $W/layer.log 2>&1; echo "layer rc=$?"
tr '\r' '\n' < $W/layer.log | grep -a -E " ms " | grep -v "bench layer" | tail -4
gzip $W/hlo-*.txt 2>/dev/null
tar czf "$OUT/call.tgz" -C $W .
