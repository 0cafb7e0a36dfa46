"""Probe (issue 15): the permutation's row gathers (``jaxmoe.permutation._gather_rows``) as XLA
compiles them, on one GPU.

Run 24 call 8's profiles: the dispatch gather of the Qwen3-like layer's forward writes its
``[R, 2048]`` bf16 buffer (~300 MB) in 228 us, ~1.3 TB/s, a sixth of the forward; the fwd+bwd
pass's two gathers (tokens and output gradient, one fusion) 383 us. Variants of the gather:

* ``take``: ``jnp.take(values, index, axis=0, mode="fill")`` on the bf16 rows (the library's);
* ``words``: the same on a ``uint32`` view of the rows (two bf16 a word, ``bitcast_convert_type``
  either side), so that XLA moves half as many elements per row (run 24 call 9: 1.2-1.3x alone,
  0.90-0.95x in the layers, where the bitcasts keep XLA from fusing the gather);
* ``blocks``: the rows reshaped to ``[T, H / 8, 8]`` (no bitcast; 16 bytes of bf16 per inner
  row), gathered along the first axis and reshaped back;
* ``triton_<rows>x<cols>w<warps>`` (session 32): a Pallas Triton kernel, each program copying
  ``rows`` whole index entries' ``cols``-column slices (a masked load of the gathered rows,
  zeros where the index is out of range, and one store of the block), ``warps`` warps.

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
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxmoe import permutation
from jaxmoe.bench.harness import results_header, row_emitter
from jaxmoe.bench.layer import layer_inputs
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
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
    """``values[index]`` (zeros for out-of-range ``index``) by a Pallas Triton kernel: program
    ``(i, j)`` loads rows ``index[i * rows : (i + 1) * rows]`` of ``values``' column block ``j``
    (masked where out of range) and stores them as one block."""
    if values.ndim != 2 or index.ndim != 1:
        return TAKE(values, index)
    num_in, width = values.shape
    (num_out,) = index.shape
    cols = min(cols, width)
    if width % cols or num_out % rows:
        return TAKE(values, index)

    def kernel(index_ref, values_ref, out_ref):
        entries = index_ref[...]
        valid = (entries >= 0) & (entries < num_in)
        safe = jnp.where(valid, entries, 0)
        # Both indices as arrays (rows down, columns across): the form that Pallas' interpreter
        # gathers as well as Triton (a slice beside an array index it does not take).
        columns = pl.program_id(1) * cols + jnp.arange(cols, dtype=jnp.int32)
        out_ref[...] = plgpu.load(
            values_ref.at[safe[:, None], columns[None, :]],
            mask=jnp.broadcast_to(valid[:, None], (rows, cols)),
            other=0,
        )

    return pl.pallas_call(
        kernel,
        grid=(num_out // rows, width // cols),
        in_specs=[pl.BlockSpec((rows,), lambda i, j: (i,)), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((rows, cols), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((num_out, width), values.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=1),
        interpret=jax.default_backend() != "gpu",
    )(index.astype(jnp.int32), values)


TRITON_SHAPES = ((8, 1024, 4), (16, 512, 4), (4, 2048, 4), (16, 1024, 8), (32, 512, 8))
VARIANTS = {"take": TAKE, "words": gather_words, "blocks": gather_blocks} | {
    f"triton_{r}x{c}w{w}": functools.partial(gather_triton, rows=r, cols=c, warps=w)
    for r, c, w in TRITON_SHAPES
}


def spread_triton(tokens, row_assignment, live_rows, top_k, weights=None):
    """``permutation._spread`` with its unweighted gather (the dispatch's forward) as the
    ``triton_16x512w4`` kernel; the weighted one (the combine's backward) as before, fused."""
    if weights is not None:
        return SPREAD(tokens, row_assignment, live_rows, top_k, weights)
    rows = gather_triton(tokens, row_assignment // top_k, rows=16, cols=512, warps=4)
    return permutation.debug.poison_rows(rows, live_rows)


SPREAD = permutation._spread


@contextlib.contextmanager
def spread_variant():
    permutation._spread = spread_triton
    try:
        yield
    finally:
        permutation._spread = SPREAD


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
        "--spread-triton",
        action="store_true",
        help="layer phase: also the dispatch's forward gather alone as a Triton kernel",
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
        if args.spread_triton:
            patches["spread_triton"] = spread_variant
        for row in layer_rows(presets, patches, baseline="take", rounds=args.rounds):
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)
    emit({"done": True, "elapsed_s": round(time.time() - start, 1)})


if __name__ == "__main__":
    main()
