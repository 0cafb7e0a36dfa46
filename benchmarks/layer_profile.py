"""Where the MoE layer's time goes on the GPU: kernel time per XLA op (jaxmoe) and per CUDA kernel
(the torch peer), forward and forward+backward, for each preset.

The jaxmoe functions are the layer bench's (``jit(moe)``; ``jit`` of ``vjp`` returning ``y`` and
all gradients). Writes ``layer-profile-{impl}.json`` and ``.md`` under ``--out-dir``. XLA's
command buffers (CUDA graphs) hide which op launched a kernel: turn them off to see the ops::

    XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=src \
      python3 benchmarks/layer_profile.py --presets mixtral --out-dir /tmp/w

``--settle-s`` runs each function that long before profiling it (the clock of a GPU settled
under the load; an idle H100 boosts higher). ``--variants`` profiles tile variants after the
default, each traced with the default tiles of ``--sites``' kernels changed
(:mod:`jaxmoe.bench.tile_variants`), e.g. the plain gmm without the weight multicast (its
default on Mixtral's experts since session 22)::

    ... layer_profile.py --presets mixtral --passes fwd+bwd --settle-s 1 --sites gmm \
      --variants '{"no_multicast": {"multicast_weights": false}}'

``--backend-variants`` sets fields of the layer's gated FFN backend instead, e.g. without the
fused down dgrad (``fused_backward``, on by default since session 31): the default's kernel
times against the unfused backward's, per launch::

    ... layer_profile.py --presets mixtral --passes fwd+bwd --settle-s 1.5 \
      --backend-variants '{"unfused_backward": {"fused_backward": false}}'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe.bench.harness import results_header
from jaxmoe.bench.kernel_profile import format_breakdown, kernel_breakdown, summarize
from jaxmoe.bench.layer import forward_backward, layer_inputs
from jaxmoe.bench.presets import LAYER_PRESETS
from jaxmoe.bench.tile_variants import compile_variant, tile_sites


def layer_function(cfg, pass_):
    """The layer bench's function of ``pass_`` (not jitted): ``moe``'s output, or its VJP."""

    def forward(params, x):
        return jaxmoe.moe(params, x, cfg)[0]

    return forward if pass_ == "fwd" else forward_backward(forward)


def torch_breakdown(params, x, dy, top_k, pass_, calls=5):
    """The plain torch peer's CUDA kernels, per kernel name (torch.profiler)."""
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
        y = layer(tx)
        return torch.autograd.grad(y, [tx, *weights], tdy)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    activity = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    events = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            start = event.time_range.start * 1e3
            events.append((event.name, "", start, event.time_range.elapsed_us() * 1e3))
    return summarize(events, calls)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", default="mixtral,dsv3,qwen3")
    parser.add_argument("--passes", default="fwd,fwd+bwd")
    # One per process: once torch's profiler has held CUPTI, JAX's trace gets no GPU events.
    parser.add_argument("--impl", choices=("jaxmoe", "torch"), default="jaxmoe")
    parser.add_argument("--out-dir", default=".")
    parser.add_argument(
        "--fp8-recipe", default=None, help="jaxmoe only: the layer with MoEConfig.fp8_recipe"
    )
    parser.add_argument(
        "--fp8-wgrad", choices=("high", "fp8"), default="high", help="with --fp8-recipe rowwise"
    )
    parser.add_argument("--top", type=int, default=25, help="jaxmoe only: rows (ops) listed")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        help="jaxmoe only: run each function this long before profiling it (the settled clock)",
    )
    parser.add_argument(
        "--variants",
        default="{}",
        help="jaxmoe only: JSON, variant name -> MosaicTileConfig changes to the default tiles of "
        "--sites' kernels; each variant profiled after the default",
    )
    parser.add_argument(
        "--sites", default="gmm,gated", help="kernels whose tiles --variants change"
    )
    parser.add_argument(
        "--backend-variants",
        default="{}",
        help="jaxmoe only: JSON, variant name -> fields of the layer's gated FFN backend "
        '(PallasMosaicGatedGroupedMatmul), e.g. \'{"fused_bwd": {"fused_backward": true}}\'; '
        "each profiled after the tile variants",
    )
    parser.add_argument(
        "--dump-hlo",
        action="store_true",
        help="jaxmoe only: also write each function's optimized HLO (hlo-<preset>-<pass>.txt)",
    )
    args = parser.parse_args()
    recipe = args.fp8_recipe
    if recipe and args.fp8_wgrad == "fp8":
        recipe = jaxmoe.ops.fp8.Fp8Recipe(recipe, wgrad="fp8")
        args.fp8_recipe += "-fp8wgrad"
    # name -> (tile changes, gated backend fields)
    variants = {name: (changes, None) for name, changes in json.loads(args.variants).items()}
    for name, fields in json.loads(args.backend_variants).items():
        variants[name] = (None, fields)
    sites = tile_sites(args.sites)
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, text = [], ["# MoE layer: kernel time per op", ""]
    for name in args.presets.split(","):
        preset = LAYER_PRESETS[name]
        cfg, params, x, dy = layer_inputs(preset, jnp.bfloat16)
        if args.fp8_recipe:
            cfg = dataclasses.replace(cfg, fp8_recipe=recipe)
        for pass_ in args.passes.split(","):
            for variant, (changes, fields) in {"default": (None, None), **variants}.items():
                if args.impl == "jaxmoe":
                    operands = (params, x) if pass_ == "fwd" else (params, x, dy)
                    compiled, _ = compile_variant(
                        layer_function(cfg, pass_), operands, sites, changes, fields
                    )
                    breakdown = kernel_breakdown(
                        compiled, *operands, top=args.top, settle_s=args.settle_s
                    )
                    if args.dump_hlo:
                        hlo = compiled.as_text()
                        (out_dir / f"hlo-{name}-{pass_}-{variant}.txt").write_text(hlo)
                else:
                    breakdown = torch_breakdown(params, x, dy, preset.top_k, pass_)
                title = f"{name} {pass_} {args.impl}" + (
                    f" fp8 {args.fp8_recipe}" * bool(args.fp8_recipe)
                )
                if variants:
                    title += f" ({variant})"
                row = {
                    "preset": name,
                    "pass": pass_,
                    "impl": args.impl,
                    "variant": variant,
                    "fp8_recipe": args.fp8_recipe,
                }
                results.append({**row, **breakdown})
                text += [format_breakdown(title, breakdown), ""]
                print(format_breakdown(title, breakdown), flush=True)
                if args.impl != "jaxmoe":
                    break
    header = results_header("benchmarks/layer_profile.py")
    stem = f"layer-profile-{args.impl}" + (f"-fp8-{args.fp8_recipe}" * bool(args.fp8_recipe))
    (out_dir / f"{stem}.json").write_text(json.dumps({"header": header, "rows": results}, indent=1))
    (out_dir / f"{stem}.md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
