"""Reads Nsight Compute's per-instruction source page (``ncu --import R.ncu-rep --page source
--csv --print-source sass``, plain or gzipped) of one Mosaic GPU kernel and summarises two
regions of its SASS, given by instruction index: the compute warpgroups' main loop and the
epilogue after it. Per kernel: each region's share of all sampled warp stalls (every warp of
the CTA, the memory warpgroup's too), the epilogue's share of the two, its stall reasons, its
samples by opcode and the warp instructions executed in it. Session 33 (H200 run 33 calls
8-10)::

    python benchmarks/ncu_source_summary.py \\
      "fused down dgrad=benchmarks/results/raw/h200-run33/call8/source.csv.gz:2395:2465:6245"

Each case is ``name=path:main_loop_start:epilogue_start:epilogue_end``; the indices are found
by reading the SASS column (the ring's ``SYNCS.PHASECHK`` before the first ``HGMMA``, the last
``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after the loop, the tile loop's end).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_source_page(path: str):
    """``(columns, rows, stall reason columns)`` of the CSV's instruction table."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header = rows[1]  # rows[0] names the kernel
    columns = {name: i for i, name in enumerate(header)}
    reasons = [n for n in header if n.startswith("stall_") and "(Not Issued)" not in n]
    return columns, rows[2:], reasons


def _number(text: str) -> float:
    return float(text) if text else 0.0


def _opcode(sass: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", sass.strip()).split(" ")[0].split(".")[0]


def summary_row(name: str, path: str, main_start: int, epilogue_start: int, end: int) -> str:
    columns, rows, reasons = read_source_page(path)
    samples = [_number(r[columns[SAMPLES]]) for r in rows]
    main, epilogue = sum(samples[main_start:epilogue_start]), sum(samples[epilogue_start:end])
    by_reason, by_opcode = collections.Counter(), collections.Counter()
    executed = 0.0
    for row, sampled in zip(rows[epilogue_start:end], samples[epilogue_start:end], strict=True):
        for reason in reasons:
            by_reason[reason.removeprefix("stall_")] += _number(row[columns[reason]])
        by_opcode[_opcode(row[columns["Source"]])] += sampled
        executed += _number(row[columns[EXECUTED]])

    def shares(counter, top):
        return ", ".join(f"{k} {v / epilogue:.0%}" for k, v in counter.most_common(top))

    total = sum(samples)
    return (
        f"| {name} | {main / total:.1%} | {epilogue / total:.1%} | "
        f"{epilogue / (main + epilogue):.1%} | {shares(by_reason, 6)} | {shares(by_opcode, 8)} | "
        f"{executed / 1e6:.1f} M |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="+", help="name=path:main_start:epilogue_start:end")
    args = parser.parse_args()
    print(
        "| kernel | main loop (of all warps' samples) | epilogue | epilogue / (main loop + "
        "epilogue) | the epilogue's stall reasons | its samples by opcode | warp instructions "
        "executed in it |"
    )
    print("|---|---|---|---|---|---|---|")
    for case in args.cases:
        name, spec = case.split("=", 1)
        path, *bounds = spec.rsplit(":", 3)
        print(summary_row(name, path, *map(int, bounds)))


if __name__ == "__main__":
    main()
