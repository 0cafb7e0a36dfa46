#!/usr/bin/env bash
# Session 28, H100 run 28 call 6 (<= 300 s): call 5 found our Mixtral down kernel issuing 64%
# more warp instructions than torch's CUTLASS kernel (362 M against 221 M a launch) in fewer
# cycles under ncu. Which instructions: Nsight Compute's source counters (executed
# instructions and warp stall samples per SASS instruction) for one launch of each, exported
# per SASS line as CSV, plus the instruction mix.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
W=/tmp/s28c6; rm -rf $W; mkdir -p $W
NCU=/usr/local/cuda/bin/ncu
cp benchmarks/results/raw/h100-run28/call5/one_call.py $W/
for who in jaxmoe torch; do
  name=mosaic; [ $who = torch ] && name=device_kernel
  timeout 120 $NCU --section SourceCounters --section InstructionStats --section WarpStateStats \
    --kernel-name regex:$name --launch-skip 2 --launch-count 1 -o $W/$who \
    python3 $W/one_call.py $who > $W/ncu-$who.log 2>&1; echo "$who rc=$?"
  timeout 60 $NCU --import $W/$who.ncu-rep --page source --csv --print-source sass > $W/$who-sass.csv 2> $W/$who-sass.err
  echo "$who sass rc=$? lines=$(wc -l < $W/$who-sass.csv)"
  timeout 60 $NCU --import $W/$who.ncu-rep --page details --csv > $W/$who-details.csv 2>&1
done
head -3 $W/jaxmoe-sass.csv | cut -c1-400
rm -f $W/*.ncu-rep
tar czf "$OUT/call.tgz" -C $W .
