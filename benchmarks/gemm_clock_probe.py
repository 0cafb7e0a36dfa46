"""Probe (issue 15): the SM clock and power of one grouped-matmul shape under torch's kernel and
jaxmoe's, phase by phase.

At the 700 W limit a kernel's time is its energy per call (``raw/h100-run28/README.md``). Where
two kernels of the same work differ in time, this tells why: ``ms x MHz`` is the SM cycles a
call takes. Equal clocks and more cycles point at the instructions (the kernel does more per
tile); equal cycles at a lower clock point at the energy (it draws more power per cycle).
Each contender (``torch``: ``torch._grouped_mm``; ``jaxmoe``: the public ``grouped_matmul``,
the default ``auto``; ``jaxmoe-<name>``: the Mosaic ``gmm`` with the default tiles changed by
``--variants``; ``jaxmoe-kmajor`` with ``--kmajor``: the same product on the weights laid out
``[G, N, K]``, as torch's bench lays them out, through the dgrad's transposed operand)
runs alone in phases of ``--phase-s`` seconds, alternating, while
``nvidia-smi`` is read every ``--smi-period-s`` (``variant_clock_probe.run_phases``). Rows go
to ``<out-dir>/gemm-clock-probe.json``, each with ``mcycles_per_call`` (ms x MHz / 1000)::

    PYTHONPATH=src python benchmarks/gemm_clock_probe.py --out-dir $OUT --shape mixtral-down \\
        --variants '{"uncut": {"split_last_round": false}}'
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp

from jaxmoe.bench.gemm import group_sizes_for
from jaxmoe.bench.gemm_cases import jax_case, torch_case, torch_unavailable
from jaxmoe.bench.harness import results_header, row_emitter
from jaxmoe.bench.presets import GEMM_SHAPES
from jaxmoe.ops.grouped_matmul import pallas_mosaic, pallas_mosaic_tiles

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from variant_clock_probe import run_phases, summarize_phases  # noqa: E402 - the one phase runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--shape", default="mixtral-down")
    parser.add_argument("--routing", default="balanced")
    parser.add_argument("--variants", default="{}", help="JSON: name -> tile field changes")
    parser.add_argument(
        "--kmajor", action="store_true", help="also the product on [G, N, K] weights"
    )
    parser.add_argument("--phases", type=int, default=8, help="phases in all, alternating")
    parser.add_argument("--phase-s", type=float, default=3.0)
    parser.add_argument("--smi-period-s", type=float, default=0.2)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    emit_row = row_emitter(
        os.path.join(args.out_dir, "gemm-clock-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )

    def emit(row):  # the row, printed and written, with its cycles per call
        if row.get("ms_per_call") and row.get("sm_mhz"):
            row["mcycles_per_call"] = row["ms_per_call"] * row["sm_mhz"] / 1e3
        emit_row(row)

    shape = GEMM_SHAPES[args.shape]
    sizes = group_sizes_for(shape, args.routing)
    contenders = {}
    if torch_unavailable() is None:
        torch_fn, torch_args, _, torch_sync = torch_case(shape, sizes, "fwd", "bfloat16", 0)
        contenders["torch"] = (lambda: torch_fn(*torch_args), torch_sync)
    fn, operands, _, sync = jax_case("jaxmoe", None, shape, sizes, "fwd", jnp.bfloat16, 0)
    contenders["jaxmoe"] = (lambda: fn(*operands), sync)
    default = pallas_mosaic_tiles.default_mosaic_gmm_tiles(shape.m, shape.k, shape.n)
    lhs, rhs, group_sizes = operands
    for name, changes in json.loads(args.variants).items():
        tiles = dataclasses.replace(default, **changes)
        variant = jax.jit(functools.partial(pallas_mosaic.gmm, tiles=tiles))
        contenders[f"jaxmoe-{name}"] = (
            lambda variant=variant: variant(lhs, rhs, group_sizes),
            jax.block_until_ready,
        )
    if args.kmajor:
        rhs_nk = jnp.swapaxes(rhs, 1, 2).copy()
        kmajor = jax.jit(functools.partial(pallas_mosaic.gmm, transpose_rhs=True, tiles=default))
        contenders["jaxmoe-kmajor"] = (
            lambda: kmajor(lhs, rhs_nk, group_sizes),
            jax.block_until_ready,
        )
    for call, sync in contenders.values():  # compile and warm up outside the phases
        sync(call())
    emit(
        summarize_phases(run_phases(contenders, args.phases, args.phase_s, args.smi_period_s, emit))
    )


if __name__ == "__main__":
    main()
