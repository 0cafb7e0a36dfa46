#!/usr/bin/env bash
# Session 28, H100 run 28 call 5 (<= 400 s): where our Mixtral down kernel spends the ~2.5% more
# cycles per K step than torch's CUTLASS kernel (call 4). If Nsight Compute (ncu) is on the
# image and may read the counters: one launch of each kernel (balanced Mixtral down fwd, after
# warm-up calls), its warp stall reasons, scheduler and memory statistics, at ncu's locked
# base clock (cycles are the point, not speed). Then the warp stall reasons per issued
# instruction and the tensor pipe's active share (raw metrics) of the same two launches.
# (First run of this call: torch's kernel is named `device_kernel` to ncu, not `cutlass`.)
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s28c5; rm -rf $W; mkdir -p $W
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
if [ -z "$NCU" ]; then ls /usr/local/ | head; tar czf "$OUT/call.tgz" -C $W .; exit 0; fi
cat > $W/one_call.py <<'PY'
import sys
import jax, jax.numpy as jnp
from jaxmoe.bench.gemm import group_sizes_for
from jaxmoe.bench.gemm_cases import jax_case, torch_case
from jaxmoe.bench.presets import GEMM_SHAPES
shape = GEMM_SHAPES["mixtral-down"]
sizes = group_sizes_for(shape, "balanced")
if sys.argv[1] == "torch":
    fn, args, _, sync = torch_case(shape, sizes, "fwd", "bfloat16", 0)
else:
    fn, args, _, sync = jax_case("jaxmoe", None, shape, sizes, "fwd", jnp.bfloat16, 0)
for _ in range(3):
    sync(fn(*args))
PY
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats"
timeout 150 $NCU $SECTIONS --kernel-name regex:mosaic --launch-skip 2 --launch-count 1 \
  --csv --page details python3 $W/one_call.py jaxmoe > $W/ncu-jaxmoe.csv 2> $W/ncu-jaxmoe.err; echo "jaxmoe rc=$?"
timeout 150 $NCU $SECTIONS --kernel-name regex:device_kernel --launch-skip 2 --launch-count 1 \
  --csv --page details python3 $W/one_call.py torch > $W/ncu-torch.csv 2> $W/ncu-torch.err; echo "torch rc=$?"
tail -n 3 $W/ncu-jaxmoe.err $W/ncu-torch.err
for f in $W/ncu-jaxmoe.csv $W/ncu-torch.csv; do
  echo "== $f"; grep -a -E '"(Kernel Name|Duration|Elapsed Cycles|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|Registers Per Thread|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Avg. Active Threads Per Warp|Executed Ipc Active|DRAM Throughput|L1/TEX Hit Rate)"' $f | cut -d, -f5- | head -30
done
METRICS="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg,smsp__inst_executed.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum"
for who in jaxmoe torch; do
  name=mosaic; [ $who = torch ] && name=device_kernel
  timeout 100 $NCU --metrics "$METRICS" --kernel-name regex:$name --launch-skip 2 --launch-count 1 \
    --csv --page raw python3 $W/one_call.py $who > $W/ncu-raw-$who.csv 2> $W/ncu-raw-$who.err; echo "raw $who rc=$?"
done
python3 - $W/ncu-raw-jaxmoe.csv $W/ncu-raw-torch.csv <<'PY'
import csv, sys
tables = []
for path in sys.argv[1:]:
    rows = list(csv.reader(open(path)))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        tables.append({}); continue
    names, values = rows[start], rows[start + 2] if len(rows) > start + 2 else []
    tables.append(dict(zip(names, values)))
keys = sorted(set(tables[0]) | set(tables[1]))
for key in keys:
    if key.startswith(("smsp__", "sm__", "lts__", "dram__")):
        a, b = tables[0].get(key, ""), tables[1].get(key, "")
        if a not in ("", "0") or b not in ("", "0"):
            print(f"{key:90s} jaxmoe {a:>16s} torch {b:>16s}")
PY
tar czf "$OUT/call.tgz" -C $W .
