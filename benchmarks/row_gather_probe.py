"""Probe (issue 15): the permutation's row gathers (``jaxmoe.permutation._gather_rows``) as XLA
compiles them, on one GPU.

Run 24 call 8's profiles: the dispatch gather of the Qwen3-like layer's forward writes its
``[R, 2048]`` bf16 buffer (~300 MB) in 228 us, ~1.3 TB/s, a sixth of the forward; the fwd+bwd
pass's two gathers (tokens and output gradient, one fusion) 383 us. Variants of the gather:

* ``take``: XLA's gather on the bf16 rows (the library's ``permutation._gather_rows``:
  ``jnp.take(values, index, axis=0, mode="fill")`` until session 32, one ``lax.gather`` since);
* ``words``: the same on a ``uint32`` view of the rows (two bf16 a word, ``bitcast_convert_type``
  either side), so that XLA moves half as many elements per row (run 24 call 9: 1.2-1.3x alone,
  0.90-0.95x in the layers, where the bitcasts keep XLA from fusing the gather);
* ``blocks``: the rows reshaped to ``[T, H / 8, 8]`` (no bitcast; 16 bytes of bf16 per inner
  row), gathered along the first axis and reshaped back;
* ``triton_<rows>x<cols>w<warps>`` (session 32): the row gather op's Pallas Triton kernel
  (:mod:`jaxmoe.ops.row_gather.pallas_triton`) with that block and warp count.

Since session 32 the dispatch's forward gather is the row gather op (the kernel on a GPU), so
the ``layer`` phase's patches reach only the gathers fused with their neighbours (the combine's
and the transposes'); run 32 calls 3-4 ran this probe before that, as kept in
``benchmarks/results/raw/h200-run32/call4/row_gather_probe.py``. ``--weighted-spread-xla`` adds
a layer variant ``weighted_spread_xla``: the combine's backward spread (a weight per row) on
XLA's gather fused with its weight instead of the row gather kernel's ``row_scale`` form (the
library's since session 33; run 33 call 1 measured the kernel as the variant, with the probe as
kept in ``benchmarks/results/raw/h200-run33/call1/row_gather_probe.py``).

1. ``gather`` rows: the gather alone on each preset's dispatch (``x [T, H]``, the plan's
   ``row_assignment // K``), every variant checked equal to ``take``, GB/s written.
2. ``layer`` rows: the preset's ``jit(moe)`` forward and fwd+bwd with each variant patched in
   while tracing (jax's caches cleared, compiled ahead of time), outputs compared, settled and
   interleaved.

    PYTHONPATH=src python benchmarks/row_gather_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp

from jaxmoe import permutation
from jaxmoe.bench.harness import results_header, row_emitter
from jaxmoe.bench.layer import layer_inputs
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
from jaxmoe.ops.row_gather import pallas_triton
from jaxmoe.stages import resolve_alignment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dispatch_plan_probe import layer_rows, random_experts  # noqa: E402 - shared with it

TAKE = permutation._gather_rows


def gather_words(values: jax.Array, index: jax.Array) -> jax.Array:
    """``values[index]`` (zeros for out-of-range ``index``) moved as ``uint32`` words where
    the rows are 2-byte elements of an even count."""
    if values.ndim != 2 or values.dtype.itemsize != 2 or values.shape[1] % 2:
        return TAKE(values, index)
    rows, cols = values.shape
    words = jax.lax.bitcast_convert_type(values.reshape(rows, cols // 2, 2), jnp.uint32)
    gathered = jnp.take(words, index, axis=0, mode="fill", fill_value=0)
    return jax.lax.bitcast_convert_type(gathered, values.dtype).reshape(index.shape[0], cols)


def gather_blocks(values: jax.Array, index: jax.Array) -> jax.Array:
    """``values[index]`` (zeros for out-of-range ``index``) on a ``[T, H / 8, 8]`` view where
    ``H`` is a multiple of 8."""
    if values.ndim != 2 or values.shape[1] % 8:
        return TAKE(values, index)
    rows, cols = values.shape
    blocks = values.reshape(rows, cols // 8, 8)
    gathered = jnp.take(blocks, index, axis=0, mode="fill", fill_value=0)
    return gathered.reshape(index.shape[0], cols)


def gather_triton(values: jax.Array, index: jax.Array, *, rows: int, cols: int, warps: int):
    """The row gather kernel with a ``rows x cols`` block and ``warps`` warps where it takes
    the operands, ``take`` elsewhere (the permutation's 1-D weight gathers, odd widths)."""
    if values.ndim != 2 or index.ndim != 1:
        return TAKE(values, index)
    if pallas_triton.unsupported_reason(values, index, rows=rows, columns=cols):
        return TAKE(values, index)
    return pallas_triton.gather_rows(
        values,
        index,
        rows=rows,
        columns=cols,
        num_warps=warps,
        interpret=jax.default_backend() != "gpu",
    )


TRITON_SHAPES = ((8, 1024, 4), (16, 512, 4), (4, 2048, 4), (16, 1024, 8), (32, 512, 8))
VARIANTS = {"take": TAKE, "words": gather_words, "blocks": gather_blocks} | {
    f"triton_{r}x{c}w{w}": functools.partial(gather_triton, rows=r, cols=c, warps=w)
    for r, c, w in TRITON_SHAPES
}


@contextlib.contextmanager
def weighted_spread_xla_variant():
    saved = permutation.WEIGHTED_SPREAD_BACKEND
    permutation.WEIGHTED_SPREAD_BACKEND = "xla"
    try:
        yield
    finally:
        permutation.WEIGHTED_SPREAD_BACKEND = saved


@contextlib.contextmanager
def gather_variant(name: str):
    saved = permutation._gather_rows
    permutation._gather_rows = VARIANTS[name]
    try:
        yield
    finally:
        permutation._gather_rows = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--presets", default="qwen3,dsv3,mixtral")
    parser.add_argument("--phases", default="gather,layer")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--weighted-spread-xla",
        action="store_true",
        help="layer phase: also the combine's backward spread on XLA's fused gather",
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated; 'take' always runs"
    )
    args = parser.parse_args()
    variants = {"take": TAKE} | {name: VARIANTS[name] for name in args.variants.split(",")}
    start = time.time()
    emit = row_emitter(
        os.path.join(args.out_dir, "row-gather-probe.json"),
        results_header("benchmarks/row_gather_probe.py"),
    )
    presets = [LAYER_PRESETS[name] for name in args.presets.split(",")]
    phases = args.phases.split(",")

    if "gather" in phases:
        for preset in presets:
            row = {"phase": "gather", "preset": preset.name}
            try:
                cfg, params, x, _ = layer_inputs(preset, jnp.bfloat16)
                experts = random_experts(preset.tokens, preset.top_k, preset.num_experts)
                plan = permutation.plan_dispatch(
                    experts, preset.num_experts, alignment=resolve_alignment(cfg)
                )
                index = plan.row_assignment // preset.top_k
                calls, outs = {}, {}
                for name, gather in variants.items():
                    fn = jax.jit(gather)
                    outs[name] = fn(x, index)
                    call = lambda fn=fn, x=x, index=index: fn(x, index)  # noqa: E731
                    calls[name] = (call, jax_sync, warm_up(call, jax_sync))
                row["equal"] = all(bool(jnp.all(outs["take"] == outs[name])) for name in outs)
                row["rows"] = int(index.shape[0])
                moved = index.shape[0] * x.shape[1] * x.dtype.itemsize  # bytes written
                for name, timing in time_interleaved(calls, rounds=args.rounds).items():
                    row[f"{name}_us"] = timing.median_ms * 1e3
                    row[f"{name}_write_gbs"] = moved / timing.median_ms / 1e6
                for name in variants:
                    row[f"{name}_speedup"] = row["take_us"] / row[f"{name}_us"]
            except Exception as error:  # noqa: BLE001 - a probe reports and goes on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)

    if "layer" in phases:
        patches = {name: functools.partial(gather_variant, name) for name in variants}
        if args.weighted_spread_xla:
            patches["weighted_spread_xla"] = weighted_spread_xla_variant
        for row in layer_rows(presets, patches, baseline="take", rounds=args.rounds):
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)
    emit({"done": True, "elapsed_s": round(time.time() - start, 1)})


if __name__ == "__main__":
    main()
