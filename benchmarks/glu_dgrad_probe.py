"""Probe (issue 15): the gated FFN's backward with the activation's derivative fused into the
down projection's dgrad (``fused_down_dgrad``), against the unfused path, on one GPU.

Rows go to ``<out-dir>/glu-dgrad-probe.json`` as they come:

1. ``kernel``, per layer preset (Mixtral-, DeepSeek-, Qwen3-like: ``M = tokens * top_k`` rows,
   ``[M, H] x [G, F, H]^T``), balanced and skewed (Dirichlet 0.3, two groups forced empty, 77
   rows past the sum): ``gate_bar`` and ``up_bar`` of the fused kernel (default tiles and
   ``block_n`` 128) and of the unfused path (the Mosaic dgrad, then XLA's elementwise pass)
   against a float32 reference (one float32 dot per group, the derivative in float32); rows
   past the groups must be zero. Balanced: all timed in interleaved rounds.
2. ``layer``, per preset: ``jaxmoe.moe`` fwd+bwd (bf16) with the gated FFN's backend variants
   of ``layer_variants`` (fused backward, unfused, fused with ``block_n`` 128, the forward
   kernel writing the residuals), interleaved; each one's gradients against the unfused one's.
   They differ only where ``auto`` takes the fused gated op (``K <= 4096``: Mixtral, Qwen3).
   ``--cotangents from_output`` times the pass with the cotangent ``dy + y`` too (a backward
   that waits for the forward's output, as in a model; ``forward_backward``'s
   ``cotangent_from_output``).

    PYTHONPATH=src python benchmarks/glu_dgrad_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np


def down_dgrad_operands(preset):
    """``(m, h, f, g), (out_bar, gate, up, down_w)``: the down projection's dgrad of a layer
    preset (``M = tokens * top_k`` rows), standard normal bf16 operands, weights scaled by
    ``1 / sqrt(F)``."""
    m, h, f, g = (
        preset.tokens * preset.top_k,
        preset.hidden_size,
        preset.ffn_size,
        preset.num_experts,
    )
    keys = jax.random.split(jax.random.key(0), 4)
    out_bar = jax.random.normal(keys[0], (m, h), jnp.bfloat16)
    gate, up = (jax.random.normal(key, (m, f), jnp.bfloat16) for key in keys[1:3])
    down_w = (jax.random.normal(keys[3], (g, f, h)) / np.sqrt(f)).astype(jnp.bfloat16)
    return (m, h, f, g), (out_bar, gate, up, down_w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--presets", default="mixtral,dsv3,qwen3")
    parser.add_argument("--phases", default="kernel,layer")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--kernel-variants", default="fused,fused_bn128")
    parser.add_argument("--layer-variants", default="fused,unfused,fused_bn128,unfused_residuals")
    parser.add_argument("--time-budget-s", type=float, default=400)
    parser.add_argument(
        "--cotangents",
        default="given",
        help="comma-separated: 'given' (the bench's dy, independent of the output) and/or "
        "'from_output' (dy + y: the backward needs the forward's output, as in a model)",
    )
    args = parser.parse_args()
    start = time.time()

    import jaxmoe
    from jaxmoe.bench.gemm import hard_group_sizes
    from jaxmoe.bench.harness import relative_error, results_header, row_emitter
    from jaxmoe.bench.layer import expert_flops, forward_backward, layer_inputs
    from jaxmoe.bench.presets import LAYER_PRESETS
    from jaxmoe.bench.tile_variants import gated_backend_with
    from jaxmoe.bench.timing import jax_sync, time_interleaved, warm_up
    from jaxmoe.ops.gated_grouped_matmul import ffn_primitives
    from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as fused_mosaic
    from jaxmoe.ops.grouped_matmul import resolve_backend

    os.makedirs(args.out_dir, exist_ok=True)
    emit = row_emitter(
        os.path.join(args.out_dir, "glu-dgrad-probe.json"),
        results_header(" ".join(sys.argv), device=str(jax.devices()[0])),
    )
    presets = [LAYER_PRESETS[name] for name in args.presets.split(",")]
    phases = args.phases.split(",")
    grouped = resolve_backend("auto")
    unfused_kernel = fused_mosaic.PallasMosaicGatedGroupedMatmul(
        grouped=grouped, fused_backward=False
    )

    def out_of_time() -> bool:
        return time.time() - start > args.time_budget_s

    def sizes_for(m, g, routing):
        if routing == "balanced":
            return np.full(g, m // g, np.int32)
        return hard_group_sizes(m, g)

    def fused_with(**changes):
        """The fused kernel on its default tiles for the operands' shape, changed."""

        def run(out_bar, gate, up, down_w, sizes):
            (m, h), f = out_bar.shape, down_w.shape[1]
            tiles = dataclasses.replace(fused_mosaic.default_down_dgrad_tiles(m, h, f), **changes)
            return fused_mosaic.fused_down_dgrad(
                out_bar, gate, up, down_w, sizes, activation="swiglu", tiles=tiles
            )

        return jax.jit(run)

    base_tiles = fused_mosaic.default_down_dgrad_tiles(1, 1, 1)
    # The fused kernel's tiles: its default (the gmm's, approx_math on); block_n 128 (half the
    # epilogue's loads and registers per thread); the activation's exact math (approx_math off:
    # the default before session 30).
    kernel_variants = {
        "fused": fused_with(),
        "fused_bn128": fused_with(block_n=128),
        "fused_exact": fused_with(approx_math=False),
    }
    kernel_variants = {name: kernel_variants[name] for name in args.kernel_variants.split(",")}
    unfused = jax.jit(
        lambda *a: ffn_primitives.unfused_glu_dgrad(*a, kernel=unfused_kernel, activation="swiglu")
    )

    def reference(out_bar, gate, up, down_w, sizes):
        """float32, one dot per group (static bounds: no dense rewrite of ragged_dot, which
        runs out of memory on the Qwen3 preset)."""
        bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes))])

        @jax.jit
        def run(out_bar, gate, up, down_w):
            f32 = jnp.float32
            parts = [
                jnp.dot(out_bar[lo:hi], down_w[e].T, preferred_element_type=f32)
                for e, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
            ]
            hidden_bar = jnp.concatenate(parts)
            end = hidden_bar.shape[0]
            gate, up = gate[:end].astype(f32), up[:end].astype(f32)
            s = jax.nn.sigmoid(gate)
            return hidden_bar * up * (s + gate * s * (1 - s)), hidden_bar * gate * s

        return run(out_bar, gate, up, down_w)

    if "kernel" in phases:
        for preset in presets:
            (m, _, _, g), (out_bar, gate, up, down_w) = down_dgrad_operands(preset)
            for routing in ("balanced", "skewed"):
                if out_of_time():
                    break
                row = {"phase": "kernel", "preset": preset.name, "routing": routing}
                try:
                    sizes = jnp.asarray(sizes_for(m, g, routing))
                    end = int(sizes.sum())
                    operands = (out_bar, gate, up, down_w, sizes)
                    want = reference(*operands)
                    variants = {**kernel_variants, "unfused": unfused}
                    for name, fn in variants.items():
                        got = fn(*operands)
                        for label, a, b in zip(("gate_bar", "up_bar"), got, want, strict=True):
                            row[f"{name}_{label}_rel_err"] = relative_error(a[:end], b)
                            row[f"{name}_{label}_tail_zero"] = bool(jnp.all(a[end:] == 0))
                    if routing == "balanced":
                        contenders = {}
                        for name, fn in variants.items():
                            call = lambda fn=fn, operands=operands: fn(*operands)
                            contenders[name] = (call, jax_sync, warm_up(call, jax_sync))
                        timings = time_interleaved(contenders, rounds=args.rounds)
                        for name, timing in timings.items():
                            row[f"{name}_ms"] = timing.median_ms
                            row[f"{name}_min_ms"] = timing.min_ms
                        for name in kernel_variants:
                            row[f"{name}_speedup"] = row["unfused_ms"] / row[f"{name}_ms"]
                except Exception as error:  # noqa: BLE001 - a probe reports and goes on
                    row["error"] = f"{type(error).__name__}: {error}"[:2000]
                    traceback.print_exc()
                row["elapsed_s"] = round(time.time() - start, 1)
                emit(row)

    # The layer's gated-FFN backend fields: the fused backward (default tiles, block_n 128), the
    # unfused one, and the fused forward writing the residuals (so no separate gate, up, product).
    layer_variants = {
        "fused": {"fused_backward": True},
        # The backend's defaults otherwise: since session 25 these write the residuals from the
        # fused kernel, so "unfused" and "unfused_residuals" are the same program (a control).
        "unfused": {"fused_backward": False},
        "fused_bn128": {
            "fused_backward": True,
            "down_dgrad_tiles": dataclasses.replace(base_tiles, block_n=128),
        },
        "unfused_residuals": {"fused_backward": False, "residuals_from_kernel": True},
        # Both: no elementwise pass left in fwd+bwd (session 19: not measured together before).
        "fused_residuals": {"fused_backward": True, "residuals_from_kernel": True},
        # The projections' input gradient as one kernel (pallas_mosaic.gmm_pair).
        "input_dgrad": {"fused_backward": False, "fused_input_dgrad": True},
        # The residuals' three stores through the swizzled epilogue (two slots per warpgroup,
        # one store in flight) instead of one unswizzled slab (session 25).
        "residuals_swizzled": {
            "fused_backward": False,
            "residuals_from_kernel": True,
            "tiles": dataclasses.replace(
                fused_mosaic.default_gated_tiles(1, 1, 1), swizzled_epilogue=True
            ),
        },
    }
    layer_variants = {name: layer_variants[name] for name in args.layer_variants.split(",")}

    passes = {
        "given": forward_backward,
        "from_output": functools.partial(forward_backward, cotangent_from_output=True),
    }
    cases = [(preset, c) for preset in presets for c in args.cotangents.split(",")]
    if "layer" in phases:
        for preset, cotangent in cases:
            if out_of_time():
                break
            row = {"phase": "layer", "preset": preset.name, "pass": "fwd+bwd"}
            row["cotangent"] = cotangent
            try:
                cfg, params, x, dy = layer_inputs(preset, jnp.bfloat16)
                calls, grads = {}, {}
                for name, kernel_fields in layer_variants.items():
                    # Traced, run and warmed up (compiled) inside: the variant's program.
                    with gated_backend_with(**kernel_fields):
                        layer = lambda p, x, cfg=cfg: jaxmoe.moe(p, x, cfg)[0]  # noqa: E731
                        fn = jax.jit(passes[cotangent](layer))
                        text = str(jax.make_jaxpr(fn)(params, x, dy))
                        row[f"{name}_glu_dgrad_in_jaxpr"] = "jaxmoe_glu_dgrad" in text
                        grads[name] = fn(params, x, dy)
                        call = lambda fn=fn, args=(params, x, dy): fn(*args)  # noqa: E731
                        calls[name] = (call, jax_sync, warm_up(call, jax_sync))
                for name in layer_variants:
                    if name == "unfused":
                        continue
                    for label, a, b in (
                        ("dx", grads[name][2], grads["unfused"][2]),
                        *(
                            (
                                f"d_{w}",
                                grads[name][1]["experts"][w],
                                grads["unfused"][1]["experts"][w],
                            )
                            for w in ("w_gate", "w_up", "w_down")
                        ),
                    ):
                        row[f"{name}_{label}_rel_diff"] = relative_error(a, b)
                timings = time_interleaved(calls, rounds=args.rounds)
                flops = expert_flops(preset, "fwd+bwd")
                for name, timing in timings.items():
                    row[f"{name}_ms"] = timing.median_ms
                    row[f"{name}_min_ms"] = timing.min_ms
                    row[f"{name}_tflops"] = flops / timing.median_ms / 1e9
                for name in layer_variants:
                    row[f"{name}_speedup"] = row["unfused_ms"] / row[f"{name}_ms"]
            except Exception as error:  # noqa: BLE001
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            row["elapsed_s"] = round(time.time() - start, 1)
            emit(row)


if __name__ == "__main__":
    main()
