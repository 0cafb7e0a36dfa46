"""Probe (issue 15): the fused gate/up Mosaic kernel against the unfused path on one H100.

One device call, each row appended to ``$OUT/fused-glu-probe.json`` as it comes:

1. exactness, per shape (Mixtral-, DeepSeek-, Qwen3-like ``[M, K] x [G, K, F]``), balanced and
   skewed (Dirichlet 0.3, two groups forced empty, 77 rows past the sum): ``h`` of the fused
   kernel (``backend=None``, ``auto``) and of the unfused path (two Mosaic ``gmm`` and the product
   in XLA, ``backend=resolve_backend("auto")``) against a float32 reference (``ragged_dot``
   accumulating in float32, the product in float32); tail rows must be zero. The gradients
   (``d lhs``, ``d gate``, ``d up``) of the fused and unfused paths against each other, with the
   default backend (``residuals_from_kernel=False``) and with the kernel writing the residuals;
2. timing (balanced, same run, interleaved per shape): fused vs unfused forward, and fwd+bwd
   (``jax.vjp`` and its cotangent pass) for the default and for ``residuals_from_kernel=True``;
3. the whole layer (``jaxmoe.moe``, presets mixtral/dsv3/qwen3, bf16): ``grouped_matmul_backend``
   None (fused where it applies; the row says whether the jaxpr holds the fused primitive) vs
   the resolved ``auto`` backend object (the same grouped matmul kernels, unfused), fwd and
   fwd+bwd.

    PYTHONPATH=src python benchmarks/fused_glu_probe.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import traceback

import numpy as np

SHAPES = {
    "mixtral": (16384, 4096, 14336, 8),
    "dsv3": (32768, 7168, 2048, 32),
    "qwen3": (65536, 2048, 768, 128),
    "tiny": (512, 128, 256, 4),  # a dry run on a CPU
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--shapes", default="mixtral,dsv3,qwen3")
    parser.add_argument("--layers", default="mixtral,dsv3,qwen3")
    parser.add_argument("--time-budget-s", type=float, default=250)
    parser.add_argument(
        "--ring",
        action="store_true",
        help="also check and time the fused kernel on the hand-written ring (fwd; fwd+bwd with "
        "the kernel writing the residuals), with and without the swizzled epilogue",
    )
    args = parser.parse_args()
    start = time.time()

    import jax
    import jax.numpy as jnp

    import jaxmoe
    from jaxmoe.bench.gemm import hard_group_sizes
    from jaxmoe.bench.layer import layer_config
    from jaxmoe.bench.presets import LAYER_PRESETS
    from jaxmoe.bench.timing import time_jax
    from jaxmoe.ops.gated_grouped_matmul import gated_grouped_matmul
    from jaxmoe.ops.gated_grouped_matmul.pallas_mosaic import (
        PallasMosaicGatedGroupedMatmul,
        default_gated_tiles,
    )
    from jaxmoe.ops.grouped_matmul import resolve_backend

    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "fused-glu-probe.json")
    rows = []

    def emit(row):
        row["elapsed_s"] = round(time.time() - start, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(path, "w") as f:
            json.dump(
                {"device": str(jax.devices()[0]), "jax": jax.__version__, "rows": rows}, f, indent=1
            )

    unfused_backend = resolve_backend("auto")  # the grouped matmul kernels "auto" takes

    def op(backend):
        return jax.jit(
            lambda x, wg, wu, gs: gated_grouped_matmul(
                x, wg, wu, gs, activation="swiglu", backend=backend
            )
        )

    def fwd_bwd(backend):
        def run(x, wg, wu, gs, ct):
            out, vjp = jax.vjp(
                lambda *a: gated_grouped_matmul(*a, gs, activation="swiglu", backend=backend),
                x,
                wg,
                wu,
            )
            return out, *vjp(ct)

        return jax.jit(run)

    # The fused kernel writing h, gate and up under differentiation (run1's fused fwd+bwd).
    kernel_residuals = PallasMosaicGatedGroupedMatmul(
        grouped=unfused_backend, residuals_from_kernel=True
    )
    fused_fwd, unfused_fwd = op(None), op(unfused_backend)
    fused_train, unfused_train = fwd_bwd(None), fwd_bwd(unfused_backend)
    residual_train = fwd_bwd(kernel_residuals)

    def sizes_for(m, g, routing):
        if routing == "balanced":
            return np.full(g, m // g, np.int32)
        return hard_group_sizes(m, g)

    @jax.jit
    def reference(x, wg, wu, gs):
        f32 = jnp.float32
        gate = jax.lax.ragged_dot(x, wg, gs, preferred_element_type=f32)
        up = jax.lax.ragged_dot(x, wu, gs, preferred_element_type=f32)
        return jax.nn.silu(gate) * up

    def rel(a, b):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-6))

    def ring_rows(name, m, k, f, g, x, wg, wu, ct):
        """The ring variants against the reference (balanced and skewed), then timed against
        the default fused forward and the default (unfused) fwd+bwd, interleaved."""
        base = default_gated_tiles(m, k, f)
        for swizzled in (True, False):
            tiles = dataclasses.replace(
                base, ring=True, pipelined_tiles=False, swizzled_epilogue=swizzled
            )
            row = {"phase": "ring", "shape": name, "tiles": str(tiles)}
            try:
                fused = PallasMosaicGatedGroupedMatmul(tiles=tiles)
                residual = PallasMosaicGatedGroupedMatmul(
                    grouped=unfused_backend, residuals_from_kernel=True, tiles=tiles
                )
                ring_fwd, ring_train = op(fused), fwd_bwd(residual)
                for routing in ("balanced", "skewed"):
                    gs = jnp.asarray(sizes_for(m, g, routing))
                    end = int(gs.sum())
                    want = reference(x, wg, wu, gs)
                    got = ring_fwd(x, wg, wu, gs)
                    row[f"{routing}_rel_err"] = rel(got, want)
                    row[f"{routing}_tail_zero"] = bool(jnp.all(got[end:] == 0))
                    h, *grads = ring_train(x, wg, wu, gs, ct)
                    _, *want_grads = unfused_train(x, wg, wu, gs, ct)
                    row[f"{routing}_train_rel_err"] = rel(h, want)
                    row[f"{routing}_grads_bitwise"] = all(
                        bool(jnp.all(a == b)) for a, b in zip(grads, want_grads, strict=True)
                    )
                    del want, got, h, grads, want_grads
                gs = jnp.asarray(sizes_for(m, g, "balanced"))
                samples = {}
                for _ in range(3):  # interleaved rounds
                    for label, fn, fargs in (
                        ("fused_fwd", fused_fwd, (x, wg, wu, gs)),
                        ("ring_fwd", ring_fwd, (x, wg, wu, gs)),
                        ("unfused_fwd_bwd", unfused_train, (x, wg, wu, gs, ct)),
                        ("ring_residuals_fwd_bwd", ring_train, (x, wg, wu, gs, ct)),
                    ):
                        timing = time_jax(fn, *fargs, repeats=5)
                        samples.setdefault(label, []).append(timing.median_ms)
                for label, values in samples.items():
                    row[f"{label}_ms"] = float(np.median(values))
                row["ring_fwd_speedup"] = row["fused_fwd_ms"] / row["ring_fwd_ms"]
                row["ring_residuals_fwd_bwd_speedup"] = (
                    row["unfused_fwd_bwd_ms"] / row["ring_residuals_fwd_bwd_ms"]
                )
            except Exception as error:  # noqa: BLE001
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            emit(row)

    for name in args.shapes.split(","):
        m, k, f, g = SHAPES[name]
        keys = jax.random.split(jax.random.key(0), 4)
        x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
        wg = (jax.random.normal(keys[1], (g, k, f), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
        wu = (jax.random.normal(keys[2], (g, k, f), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
        ct = jax.random.normal(keys[3], (m, f), jnp.bfloat16)
        for routing in ("balanced", "skewed"):
            row = {
                "phase": "exact",
                "shape": name,
                "m": m,
                "k": k,
                "f": f,
                "g": g,
                "routing": routing,
            }
            try:
                gs = jnp.asarray(sizes_for(m, g, routing))
                end = int(gs.sum())
                text = str(jax.make_jaxpr(fused_fwd)(x, wg, wu, gs))
                row["fused_primitive_ran"] = "jaxmoe_gated" in text
                want = reference(x, wg, wu, gs)
                h_fused, *g_fused = fused_train(x, wg, wu, gs, ct)
                h_unfused, *g_unfused = unfused_train(x, wg, wu, gs, ct)
                h_residual, *g_residual = residual_train(x, wg, wu, gs, ct)
                row["rel_err_fused_with_kernel_residuals"] = rel(h_residual, want)
                row["grad_bitwise_with_kernel_residuals"] = all(
                    bool(jnp.all(a == b)) for a, b in zip(g_residual, g_unfused, strict=True)
                )
                del h_residual, g_residual
                h_fused = fused_fwd(x, wg, wu, gs)  # the kernel (nothing differentiated)
                row["rel_err_fused"] = rel(h_fused, want)
                row["rel_err_unfused"] = rel(h_unfused, want)
                row["fused_tail_zero"] = bool(jnp.all(h_fused[end:] == 0))
                for label, a, b in zip(("dx", "dwg", "dwu"), g_fused, g_unfused, strict=True):
                    row[f"grad_rel_diff_{label}"] = rel(a, b)
                    row[f"grad_bitwise_{label}"] = bool(jnp.all(a == b))
                del want, h_fused, h_unfused, g_fused, g_unfused
            except Exception as error:  # noqa: BLE001 - record and go on
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            emit(row)
        gs = jnp.asarray(sizes_for(m, g, "balanced"))
        flops = 2 * 2 * m * k * f
        row = {
            "phase": "time",
            "shape": name,
            "m": m,
            "k": k,
            "f": f,
            "g": g,
            "routing": "balanced",
        }
        try:
            for label, fn, fargs in (
                ("fused_fwd", fused_fwd, (x, wg, wu, gs)),
                ("unfused_fwd", unfused_fwd, (x, wg, wu, gs)),
                ("fused_fwd_bwd", fused_train, (x, wg, wu, gs, ct)),
                ("unfused_fwd_bwd", unfused_train, (x, wg, wu, gs, ct)),
                ("kernel_residuals_fwd_bwd", residual_train, (x, wg, wu, gs, ct)),
                ("fused_fwd_again", fused_fwd, (x, wg, wu, gs)),
            ):
                timing = time_jax(fn, *fargs, repeats=7)
                row[f"{label}_ms"] = timing.median_ms
                row[f"{label}_spread_ms"] = [timing.min_ms, timing.max_ms]
                mult = 1 if "bwd" not in label else 3
                row[f"{label}_tflops"] = mult * flops / timing.median_ms / 1e9
            row["fwd_speedup"] = row["unfused_fwd_ms"] / row["fused_fwd_ms"]
            row["fwd_bwd_speedup"] = row["unfused_fwd_bwd_ms"] / row["fused_fwd_bwd_ms"]
            row["kernel_residuals_fwd_bwd_speedup"] = (
                row["unfused_fwd_bwd_ms"] / row["kernel_residuals_fwd_bwd_ms"]
            )
        except Exception as error:  # noqa: BLE001
            row["error"] = f"{type(error).__name__}: {error}"[:2000]
            traceback.print_exc()
        emit(row)
        if args.ring:
            ring_rows(name, m, k, f, g, x, wg, wu, ct)
        del x, wg, wu, ct

    for name in args.layers.split(","):
        if time.time() - start > args.time_budget_s:
            emit({"phase": "layer", "preset": name, "skipped": "time budget"})
            continue
        preset = LAYER_PRESETS[name]
        row = {"phase": "layer", "preset": name, "tokens": preset.tokens}
        try:
            cfg = layer_config(preset, jnp.bfloat16)
            params = jaxmoe.init_params(jax.random.key(0), cfg)
            x = jax.random.normal(jax.random.key(1), (preset.tokens, cfg.hidden_size), jnp.bfloat16)
            for label, backend in (("fused", None), ("unfused", unfused_backend)):
                layer_cfg = dataclasses.replace(cfg, grouped_matmul_backend=backend)
                fwd = jax.jit(lambda p, x, c=layer_cfg: jaxmoe.moe(p, x, c)[0])
                loss = lambda p, x, c=layer_cfg: jnp.sum(  # noqa: E731
                    jaxmoe.moe(p, x, c)[0].astype(jnp.float32) ** 2
                )
                train = jax.jit(jax.grad(loss, argnums=(0, 1)))
                if label == "fused":
                    row["fused_primitive_ran"] = "jaxmoe_gated" in str(
                        jax.make_jaxpr(fwd)(params, x)
                    )
                row[f"{label}_fwd_ms"] = time_jax(fwd, params, x, repeats=5).median_ms
                row[f"{label}_fwd_bwd_ms"] = time_jax(train, params, x, repeats=5).median_ms
                row[f"{label}_out"] = fwd(params, x)
            row["out_rel_diff"] = rel(row.pop("fused_out"), row.pop("unfused_out"))
            row["fwd_speedup"] = row["unfused_fwd_ms"] / row["fused_fwd_ms"]
            row["fwd_bwd_speedup"] = row["unfused_fwd_bwd_ms"] / row["fused_fwd_bwd_ms"]
        except Exception as error:  # noqa: BLE001
            row.pop("fused_out", None)
            row.pop("unfused_out", None)
            row["error"] = f"{type(error).__name__}: {error}"[:2000]
            traceback.print_exc()
        emit(row)


if __name__ == "__main__":
    main()
