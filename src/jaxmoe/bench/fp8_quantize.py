"""``jaxmoe bench fp8-quantize``: the FP8 quantizers, checked bit for bit then timed, GB/s.

Each kind is a list of cases; a case is one shape and the paths that quantize its operand
(jitted), each with the bytes it must move at least. Where a case names a reference path, every
other path's outputs are compared with it element by element (``differing``: differing elements
per output, ``bitwise_equal``). A case's paths are timed against each other in interleaved rounds
(:func:`jaxmoe.bench.timing.time_interleaved`); ``gbps`` is those bytes over the median time.

- ``weights``: the rowwise recipe's two weight quantizations (``q_fwd_nk [G, N, K]``,
  ``scale_fwd``, ``q_dgrad [G, K, N]``, ``scale_dgrad``) of expert weights ``[G, K, N]`` (bf16,
  per-row and per-column magnitudes spread over ``exp(uniform(-3, 3))``):
  :func:`~jaxmoe.ops.fp8.weight_quantize_pallas.quantize_weights_rowwise_pallas` (two passes)
  against XLA's (the reference), and on a GPU the Pallas path with the correctly rounded
  division (``pallas_ieee_div``: its counts show which division XLA's bits come from). 6 bytes
  per element (2 + 2 read, 1 + 1 written). ``sweep`` adds the Pallas path with other tiles.
- ``columnwise``: the FP8 weight gradient's operand quantization (``x_t_q [K, Mp]``, ``scale
  [G, K]``, ``starts [G]``) of the layers' activations ``[M, K]`` (Dirichlet-skewed groups, an
  empty group, NaN past the groups): the Pallas path against XLA's
  :func:`~jaxmoe.ops.fp8.columnwise.quantize_columnwise`. 5 bytes per element.
- ``layouts``: one Mixtral expert weight's rowwise quantization in each layout the layer could
  run it (amax over K, cast, then the K-major copy; a bf16 transpose first, with and without an
  optimization barrier; the cast then a 1-byte transpose), the amax, cast and transpose alone,
  and the activations' quantization; no reference (the layouts differ).

``tiny``: small shapes (and tiles) that Pallas' interpreter runs on a CPU in seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.bench.harness import differing_elements
from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
from jaxmoe.ops.fp8 import E4M3, quantize
from jaxmoe.ops.fp8.columnwise import quantize_columnwise
from jaxmoe.ops.fp8.columnwise_pallas import quantize_columnwise_pallas
from jaxmoe.ops.fp8.weight_quantize_pallas import (
    WeightQuantizeTiles,
    quantize_weights_rowwise_pallas,
    quantize_weights_rowwise_xla,
)

KINDS = ("weights", "columnwise", "layouts")
# [G, K, N] expert weights.
WEIGHT_SHAPES = {
    "mixtral-up": (8, 4096, 14336),
    "mixtral-down": (8, 14336, 4096),
    "dsv3-up": (32, 7168, 2048),
    "dsv3-down": (32, 2048, 7168),
}
TINY_WEIGHT_SHAPES = {"tiny-a": (2, 64, 256), "tiny-b": (3, 256, 48)}
TINY_WEIGHT_TILES = WeightQuantizeTiles(32, 32, 4, 32, 32, 4)
WEIGHT_TILE_SWEEP = {
    "cast64x128": WeightQuantizeTiles(cast_block_k=64, cast_block_n=128),
    "cast128x64": WeightQuantizeTiles(cast_block_k=128, cast_block_n=64),
    "cast128x256": WeightQuantizeTiles(cast_block_n=256),
    "amax256x256": WeightQuantizeTiles(amax_block_k=256),
    "warps4": WeightQuantizeTiles(amax_num_warps=4, cast_num_warps=4),
}
WEIGHT_OUTPUTS = ("q_fwd_nk", "scale_fwd", "q_dgrad", "scale_dgrad")
# (rows, width, groups): the layers' wgrad operands (x and the hidden activations).
COLUMNWISE_SHAPES = {
    "mixtral-x": (8192, 4096, 8),
    "mixtral-hidden": (8192, 14336, 8),
    "dsv3-x": (32768, 7168, 32),
    "dsv3-hidden": (32768, 2048, 32),
    "qwen3-x": (65536, 2048, 128),
    "qwen3-hidden": (65536, 768, 128),
}
TINY_COLUMNWISE_SHAPES = {"tiny": (700, 256, 4)}
COLUMNWISE_OUTPUTS = ("x_t_q", "scale", "starts")
# (G, K, N, tokens): one Mixtral expert weight and the layer's activations.
LAYOUT_SHAPES = {"mixtral": (8, 4096, 14336, 8192)}
TINY_LAYOUT_SHAPES = {"tiny": (2, 64, 256, 128)}
HEADER_FACTS = {
    "timing": "a case's paths in interleaved rounds (jaxmoe.bench.timing.time_interleaved)",
    "gbps": "the bytes a path must move (reads + writes) over its median time",
}
COLUMNS = (
    ("kind", "kind", ""),
    ("shape", "shape", ""),
    ("path", "path", ""),
    ("tiles", "tiles", ""),
    ("ms", "ms", "{:.3f}"),
    ("gbps", "GB/s", "{:.0f}"),
    ("bitwise_equal", "bitwise", ""),
)


@dataclasses.dataclass(frozen=True)
class QuantizeCase:
    """The paths that quantize one shape's operand: ``paths[name] = (jitted fn, its operands,
    the bytes it moves at least)``; the others are compared with the ``reference`` path element
    by element (None: not compared), and those in ``must_match`` must match it bit for bit
    (their rows' ``ok``)."""

    kind: str
    shape: str
    dims: tuple[int, ...]
    paths: dict[str, tuple[Callable, tuple, int]]
    reference: str | None = None
    outputs: tuple[str, ...] = ()
    tiles: str = "-"
    must_match: tuple[str, ...] = ("pallas",)


def spread_weight(shape, seed: int = 0) -> jax.Array:
    """bf16 normal weights times per-row and per-column magnitudes ``exp(uniform(-3, 3))``."""
    groups, k, n = shape
    keys = jax.random.split(jax.random.key(seed), 3)
    base = jax.random.normal(keys[0], shape, jnp.float32)
    rows = jnp.exp(jax.random.uniform(keys[1], (groups, k, 1), minval=-3.0, maxval=3.0))
    cols = jnp.exp(jax.random.uniform(keys[2], (groups, 1, n), minval=-3.0, maxval=3.0))
    return (base * rows * cols).astype(jnp.bfloat16)


def skewed_activations(rows: int, width: int, groups: int, seed: int = 0):
    """bf16 rows of spread magnitude, Dirichlet(0.3) group sizes with group 1 empty and NaN in
    the rows past the groups (never to be read)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, width)) * np.exp(rng.uniform(-3, 3, (rows, 1)))
    sizes = np.floor(rng.dirichlet(np.full(groups, 0.3)) * (rows - 10)).astype(np.int32)
    sizes[1] = 0
    x[sizes.sum() :] = np.nan
    return jnp.asarray(x, jnp.bfloat16), jnp.asarray(sizes)


def weight_cases(tiny: bool, sweep: bool, on_gpu: bool) -> Iterator[QuantizeCase]:
    tile_sets = {"tiny": TINY_WEIGHT_TILES} if tiny else {"default": WeightQuantizeTiles()}
    if sweep and not tiny:
        tile_sets |= WEIGHT_TILE_SWEEP
    for name, shape in (TINY_WEIGHT_SHAPES if tiny else WEIGHT_SHAPES).items():
        weight = spread_weight(shape)
        nbytes = 6 * weight.size  # read w twice (2 + 2), write both FP8 copies (1 + 1)
        for tiles_name, tiles in tile_sets.items():
            paths = {"xla": (jax.jit(quantize_weights_rowwise_xla), (weight,), nbytes)}
            paths["pallas"] = (
                jax.jit(lambda w, t=tiles: quantize_weights_rowwise_pallas(w, tiles=t)),
                (weight,),
                nbytes,
            )
            if on_gpu:
                paths["pallas_ieee_div"] = (
                    jax.jit(
                        lambda w, t=tiles: quantize_weights_rowwise_pallas(
                            w, tiles=t, ieee_division=True
                        )
                    ),
                    (weight,),
                    nbytes,
                )
            yield QuantizeCase("weights", name, shape, paths, "xla", WEIGHT_OUTPUTS, tiles_name)


def columnwise_cases(tiny: bool) -> Iterator[QuantizeCase]:
    for name, (m, k, g) in (TINY_COLUMNWISE_SHAPES if tiny else COLUMNWISE_SHAPES).items():
        x, sizes = skewed_activations(m, k, g)
        nbytes = 5 * m * k  # read x twice (2 + 2), write the FP8 copy (1)
        paths = {
            "xla": (jax.jit(quantize_columnwise), (x, sizes), nbytes),
            "pallas": (jax.jit(quantize_columnwise_pallas), (x, sizes), nbytes),
        }
        yield QuantizeCase("columnwise", name, (m, k, g), paths, "xla", COLUMNWISE_OUTPUTS)


def layout_paths(elements: int, tokens_x_k: int) -> dict[str, tuple[Callable, int, str]]:
    """name -> (fn, bytes it moves at best, ``"weight"`` or ``"acts"``: its operand)."""

    def quantize_then_transpose(w):  # quantize [G, K, N], then swap to K-major
        q, scale = quantize(w, (1, None, 1))
        return jnp.swapaxes(q, 1, 2), scale

    def transpose_then_quantize(w):  # transpose in bf16 first, then amax along the last axis
        return quantize(jnp.swapaxes(w, 1, 2), (1, 1, None))

    def transpose_barrier_quantize(w):  # the bf16 transpose kept out of the quantization fusion
        return quantize(jax.lax.optimization_barrier(jnp.swapaxes(w, 1, 2)), (1, 1, None))

    def quantize_barrier_transpose(w):  # quantize in place, then a separate 1-byte transpose
        q, scale = quantize(w, (1, None, 1))
        return jnp.swapaxes(jax.lax.optimization_barrier(q), 1, 2), scale

    return {
        "weight_transpose_barrier_quantize": (
            transpose_barrier_quantize, elements * (4 + 2 + 2 + 1), "weight"),
        "weight_quantize_barrier_transpose": (
            quantize_barrier_transpose, elements * (2 + 2 + 1 + 2), "weight"),
        "weight_quantize_then_transpose": (quantize_then_transpose, elements * 5, "weight"),
        "weight_transpose_then_quantize": (transpose_then_quantize, elements * 5, "weight"),
        "weight_quantize_no_transpose": (
            lambda w: quantize(w, (1, None, 1)), elements * 5, "weight"),
        "weight_amax_only": (lambda w: jnp.max(jnp.abs(w), axis=1), elements * 2, "weight"),
        "weight_cast_only": (lambda w: w.astype(E4M3), elements * 3, "weight"),
        "weight_transpose_bf16_only": (lambda w: jnp.swapaxes(w, 1, 2), elements * 4, "weight"),
        "activation_quantize": (lambda a: quantize(a, (1, None)), tokens_x_k * 5, "acts"),
    }  # fmt: skip


def layout_cases(tiny: bool) -> Iterator[QuantizeCase]:
    for name, (g, k, n, tokens) in (TINY_LAYOUT_SHAPES if tiny else LAYOUT_SHAPES).items():
        weight = jax.random.normal(jax.random.key(0), (g, k, n), jnp.bfloat16)
        acts = jax.random.normal(jax.random.key(1), (tokens, k), jnp.bfloat16)
        operands = {"weight": (weight,), "acts": (acts,)}
        paths = {
            path: (jax.jit(fn), operands[operand], nbytes)
            for path, (fn, nbytes, operand) in layout_paths(weight.size, acts.size).items()
        }
        yield QuantizeCase("layouts", name, (g, k, n, tokens), paths)


def cases_for(kind: str, *, tiny: bool, sweep: bool, on_gpu: bool) -> Iterator[QuantizeCase]:
    """The cases of ``kind`` (one of :data:`KINDS`)."""
    if kind == "weights":
        return weight_cases(tiny, sweep, on_gpu)
    if kind == "columnwise":
        return columnwise_cases(tiny)
    if kind == "layouts":
        return layout_cases(tiny)
    raise ValueError(f"`kind` must be one of {', '.join(KINDS)}; got {kind!r}.")


def run_case(case: QuantizeCase, *, rounds: int, settle_ms: float | None) -> list[dict]:
    """The rows of one case: each path's differing elements against the reference, then the
    paths timed in interleaved rounds."""
    outputs = {}
    rows = {}
    for path, (fn, args, nbytes) in case.paths.items():
        rows[path] = {
            "kind": case.kind, "shape": case.shape, "dims": list(case.dims), "path": path,
            "tiles": case.tiles if path != case.reference else "-", "bytes": nbytes,
        }  # fmt: skip
        try:
            outputs[path] = jax.block_until_ready(fn(*args))
        except Exception as error:  # noqa: BLE001 - recorded in the row, the others still run
            traceback.print_exc()
            rows[path]["error"] = f"{type(error).__name__}: {error}"[:300]
    want = outputs.get(case.reference)
    for path, got in outputs.items():
        if want is not None and path != case.reference:
            pairs = zip(case.outputs, got, want, strict=True)
            differing = {name: differing_elements(g, w) for name, g, w in pairs}
            rows[path] |= {"differing": differing, "bitwise_equal": not any(differing.values())}
            if path in case.must_match:
                rows[path]["ok"] = rows[path]["bitwise_equal"]
    ready = {}
    for path, (fn, args, _) in case.paths.items():
        if path in outputs:
            call = functools.partial(fn, *args)  # compiled by the check above
            ready[path] = (call, jax_sync, warm_up(call, jax_sync, warmup=1))
    for path, timing in time_interleaved(ready, rounds=rounds, settle_ms=settle_ms).items():
        rows[path] |= {"ms": timing.median_ms, "gbps": rows[path]["bytes"] / timing.median_ms / 1e6}
    return list(rows.values())


def run_fp8_quantize_benchmark(
    kinds,
    *,
    tiny: bool = False,
    sweep: bool = False,
    rounds: int = 10,
    settle_ms: float | None = None,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """Every case of each of ``kinds`` (:func:`cases_for`), its rows passed to ``on_row`` as
    they are made."""
    on_gpu = jax.default_backend() == "gpu"
    rows: list[dict[str, Any]] = []
    for kind in kinds:
        for case in cases_for(kind, tiny=tiny, sweep=sweep, on_gpu=on_gpu):
            for row in run_case(case, rounds=rounds, settle_ms=settle_ms):
                rows.append(row)
                on_row(row)
    return rows
