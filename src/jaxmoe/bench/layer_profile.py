"""``jaxmoe bench layer-profile``: where the MoE layer's time goes on the GPU, kernel time per
XLA op (jaxmoe) or per CUDA kernel (the torch peer), for each preset and pass.

The jaxmoe functions are ``jaxmoe bench layer``'s (``jit(moe)``; ``jit`` of the VJP returning
``y`` and all gradients), compiled ahead of time and profiled with
:func:`jaxmoe.bench.kernel_profile.kernel_breakdown`. XLA's command buffers (CUDA graphs) hide
which op launched a kernel: ``XLA_FLAGS=--xla_gpu_enable_command_buffer=`` shows the ops.

Variants are profiled after the default: tile variants change the default tiles of some
kernels (:func:`jaxmoe.bench.tile_variants.compile_variant`), backend variants set fields of the
layer's gated FFN backend, e.g. ``{"unfused_backward": {"fused_backward": false}}``. One impl
per process: once torch's profiler has held CUPTI, JAX's trace gets no GPU events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe.bench import kernel_profile
from jaxmoe.bench.layer import forward_backward, layer_inputs
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.tile_variants import compile_variant, tile_sites

IMPLS = ("jaxmoe", "torch")
COLUMNS = (
    ("preset", "preset", ""),
    ("pass", "pass", ""),
    ("impl", "impl", ""),
    ("variant", "variant", ""),
    ("total_ms", "kernel ms", "{:.3f}"),
    ("span_ms", "span ms", "{:.3f}"),
    ("kernels", "launches", "{:.0f}"),
)
HEADER_FACTS = {
    "timing": "kernel durations from a profiler trace, per call (the sum over the traced calls "
    "over their number); span = first kernel's start to last one's end per call",
}


def layer_function(cfg: jaxmoe.MoEConfig, pass_: str) -> Callable:
    """The layer bench's function of ``pass_`` (not jitted): ``moe``'s output, or its VJP."""

    def forward(params, x):
        return jaxmoe.moe(params, x, cfg)[0]

    return forward if pass_ == "fwd" else forward_backward(forward)


def torch_breakdown(params, x, dy, top_k: int, pass_: str, calls: int = 5) -> dict[str, Any]:
    """The plain torch peer's CUDA kernels, per kernel name (``torch.profiler``)."""
    import torch

    from jaxmoe.bench.torch_layer import TorchMoELayer, to_torch_input

    layer = TorchMoELayer(jax.device_get(params), top_k, torch.bfloat16, "cuda")
    tx = to_torch_input(jax.device_get(x), torch.bfloat16, "cuda")
    tdy = to_torch_input(jax.device_get(dy), torch.bfloat16, "cuda")
    weights = list(layer.parameters())

    def call():
        if pass_ == "fwd":
            with torch.no_grad():
                return layer(tx)
        tx.requires_grad_(True)
        return torch.autograd.grad(layer(tx), [tx, *weights], tdy)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    events = [
        (event.name, "", event.time_range.start * 1e3, event.time_range.elapsed_us() * 1e3)
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]
    return kernel_profile.summarize(events, calls)


def run_layer_profile(
    presets: Sequence[str],
    passes: Sequence[str],
    *,
    impl: str = "jaxmoe",
    fp8_recipe: str | None = None,
    fp8_wgrad: str = "auto",
    top: int = 25,
    settle_s: float = 0.0,
    tile_variants: dict[str, dict] | None = None,
    backend_variants: dict[str, dict] | None = None,
    sites: str = "gmm,gated",
    hlo_dir: str | Path | None = None,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """One row per (preset, pass, variant): ``{"preset", "pass", "impl", "variant",
    "fp8_recipe"}`` and the breakdown (:func:`jaxmoe.bench.kernel_profile.summarize`). The torch
    peer has no variants. ``hlo_dir``: also write each jaxmoe function's optimized HLO there."""
    recipe = fp8_recipe
    if fp8_recipe and fp8_wgrad != "auto":
        recipe = jaxmoe.ops.fp8.Fp8Recipe(fp8_recipe, wgrad=fp8_wgrad)
    # name -> (tile changes, gated backend fields)
    variants: dict[str, tuple] = {"default": (None, None)}
    variants |= {name: (changes, None) for name, changes in (tile_variants or {}).items()}
    variants |= {name: (None, fields) for name, fields in (backend_variants or {}).items()}
    if impl != "jaxmoe":
        variants = {"default": (None, None)}
    kernel_sites = tile_sites(sites)
    rows: list[dict[str, Any]] = []
    for name in presets:
        preset = LAYER_PRESETS[name]
        cfg, params, x, dy = layer_inputs(preset, jnp.bfloat16)
        if recipe:
            cfg = dataclasses.replace(cfg, fp8_recipe=recipe)
        for pass_ in passes:
            for variant, (changes, fields) in variants.items():
                if impl == "jaxmoe":
                    operands = (params, x) if pass_ == "fwd" else (params, x, dy)
                    compiled, _ = compile_variant(
                        layer_function(cfg, pass_), operands, kernel_sites, changes, fields
                    )
                    breakdown = kernel_profile.kernel_breakdown(
                        compiled, *operands, top=top, settle_s=settle_s
                    )
                    if hlo_dir is not None:
                        path = Path(hlo_dir) / f"hlo-{name}-{pass_}-{variant}.txt"
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_text(compiled.as_text())
                else:
                    breakdown = torch_breakdown(params, x, dy, preset.top_k, pass_)
                row = {"preset": name, "pass": pass_, "impl": impl, "variant": variant}
                row |= {"fp8_recipe": fp8_recipe, "fp8_wgrad": fp8_wgrad if fp8_recipe else None}
                rows.append({**row, **breakdown})
                on_row(rows[-1])
    return rows


def row_title(row: dict[str, Any]) -> str:
    """``mixtral fwd+bwd jaxmoe fp8 rowwise (variant)``: what one breakdown profiles."""
    title = f"{row['preset']} {row['pass']} {row['impl']}"
    if row.get("fp8_recipe"):
        wgrad = row["fp8_wgrad"]
        title += f" fp8 {row['fp8_recipe']}" + ("" if wgrad == "auto" else f" {wgrad} wgrad")
    return title + ("" if row["variant"] == "default" else f" ({row['variant']})")


def render(header: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The markdown beside the JSON: the header's facts, then each row's breakdown."""
    lines = [
        f"# MoE layer: kernel time per op ({header['device']})",
        "",
        f"jax {header['jax']}; torch {header['torch']}; {header['date']}; `{header['command']}`.",
        "",
    ]
    for row in rows:
        lines += [kernel_profile.format_breakdown(row_title(row), row), ""]
    return "\n".join(lines)
