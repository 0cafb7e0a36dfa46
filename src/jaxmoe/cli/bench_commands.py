"""The ``jaxmoe bench`` subcommands beside ``gemm|layer|ep``: their flags (``add_*``, called by
:func:`jaxmoe.cli.main.build_parser`) and :func:`run`, which runs one of them.

- ``fp8-gemm``: the FP8 grouped matmul against ``torch._scaled_grouped_mm`` (GPU);
- ``fp8-wgrad``: the FP8 weight gradient against the bf16 one and torch's (GPU; ``--smoke``
  checks it anywhere, in Mosaic GPU's interpreter on a CPU);
- ``fp8-quantize``: the FP8 quantizers, bit for bit against XLA's, and their GB/s (GPU;
  ``--tiny`` anywhere);
- ``layer-profile``: the layer's kernel time per XLA op (GPU);
- ``layer-api``: the layer through the public API, timed as users write it (any platform);
- ``ep-memory``: the temporaries XLA plans for the dropless EP layer (simulated CPU devices);
- ``ab``: two source trees, before and after a change: bits compared, then timed in interleaved
  rounds (:mod:`jaxmoe.cli.ab_command`; its workers hold the device, the parent none).

Each prints one JSON line per row as it is made, then a table (:func:`jaxmoe.bench.harness.
format_table`), and writes ``{"header", "rows"}`` JSON to ``--out`` after every row, with a
markdown table beside it. A subcommand that needs a GPU refuses elsewhere before any work, with
one ``jaxmoe: error:`` line and status 2. The exit status is otherwise 0 when something ran and
nothing failed, 1 if not.
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import jax

from jaxmoe.bench import (
    ab,
    ep_memory,
    fp8_gemm,
    fp8_quantize,
    fp8_wgrad,
    harness,
    layer_api,
    layer_profile,
)
from jaxmoe.bench.layer import PASSES
from jaxmoe.bench.presets import GEMM_SHAPES, LAYER_PRESETS
from jaxmoe.bench.tile_variants import SITE_NAMES, check_variant_fields, tile_sites
from jaxmoe.bench.timing import SETTLE_MS
from jaxmoe.cli import ab_command, ep_flags, flags
from jaxmoe.option_names import FP8_RECIPES, FP8_WGRAD_PRECISIONS

BENCH_MODULES = {
    "fp8-gemm": fp8_gemm,
    "fp8-wgrad": fp8_wgrad,
    "fp8-quantize": fp8_quantize,
    "layer-profile": layer_profile,
    "layer-api": layer_api,
    "ep-memory": ep_memory,
    "ab": ab,
}
KINDS = tuple(BENCH_MODULES)
BIG_PRESETS = ("mixtral", "dsv3", "qwen3")
Formatter = argparse.ArgumentDefaultsHelpFormatter


def platform() -> str:
    """JAX's default platform (``gpu``, ``cpu``, ...): which subcommands can run here."""
    return jax.default_backend()


def _parser(kinds, name: str, text: str):
    return kinds.add_parser(name, help=text, description=text, formatter_class=Formatter)


def _add_preset(sub) -> None:
    """``--preset``: a comma list of the layer presets, or ``all`` for the big three."""
    sub.add_argument(
        "--preset",
        type=flags.preset_names(tuple(LAYER_PRESETS), BIG_PRESETS),
        default="all",
        help=f"comma list of {', '.join(LAYER_PRESETS)}, or 'all' for {','.join(BIG_PRESETS)}",
    )


def _add_out(sub) -> None:
    sub.add_argument(
        "--out",
        type=flags.writable_file,
        default=None,
        help="JSON file for the results (a .md table beside it), rewritten after every row "
        "(None: not written)",
    )


def _add_settle(sub) -> None:
    sub.add_argument(
        "--settle-ms",
        type=flags.number(0),
        default=None,
        help="ms each contender runs untimed before each of its samples (None: "
        f"{SETTLE_MS:g} on a GPU, 0 elsewhere)",
    )


def _add_shapes(sub, every: tuple[str, ...]) -> None:
    sub.add_argument(
        "--shapes",
        type=flags.names(tuple(GEMM_SHAPES), aliases={"all": list(every)}),
        default="all",
        help=f"comma list of shapes ({', '.join(GEMM_SHAPES)}); 'all': the presets' six",
    )


def _add_rounds(sub, default: int) -> None:
    sub.add_argument("--rounds", type=flags.integer(1), default=default, help="interleaved rounds")


def _json_variants(text: str) -> dict[str, dict]:
    """``--tile-variants`` / ``--backend-variants``: a JSON object of name -> object of fields."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"must be JSON ({error}); got {text!r}") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise argparse.ArgumentTypeError(
            f'must be a JSON object of name -> object, e.g. \'{{"name": {{"field": 1}}}}\'; '
            f"got {text!r}"
        )
    return value


def _tile_sites(text: str) -> str:
    """``--sites``: a comma list of :data:`jaxmoe.bench.tile_variants.SITE_NAMES` keys."""
    try:
        tile_sites(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def add_fp8_gemm(kinds) -> None:
    sub = _parser(
        kinds,
        "fp8-gemm",
        "FP8 (e4m3) grouped matmul, forward: jaxmoe's Mosaic GPU kernel against "
        "torch._scaled_grouped_mm and jaxmoe bf16, with GPU checks (needs a CUDA GPU and torch)",
    )
    _add_shapes(sub, fp8_gemm.SHAPES)
    sub.add_argument(
        "--sweep",
        choices=fp8_gemm.SWEEPS,
        default="fixed",
        help="extra rowwise tile rows: the fixed Qwen3 list, the ring variants, none",
    )
    sub.add_argument("--skip-checks", action="store_true", help="no GPU exactness checks first")
    _add_rounds(sub, fp8_gemm.ROUNDS)
    _add_settle(sub)
    _add_out(sub)


def add_fp8_wgrad(kinds) -> None:
    sub = _parser(
        kinds,
        "fp8-wgrad",
        "FP8 weight gradient (Mosaic GPU tgmm on e4m3) against the bf16 Mosaic wgrad and "
        "torch's, checked then timed (needs a GPU; --smoke runs anywhere)",
    )
    _add_shapes(sub, fp8_wgrad.SHAPES)
    sub.add_argument(
        "--routings",
        type=flags.names(fp8_wgrad.ROUTINGS),
        default=",".join(fp8_wgrad.ROUTINGS),
        help="comma list of balanced, skewed (Dirichlet(0.3), one group empty)",
    )
    _add_rounds(sub, fp8_wgrad.ROUNDS)
    sub.add_argument(
        "--smoke",
        action="store_true",
        help="check only, a tiny shape with small tiles, on any backend (CPU: the interpreter)",
    )
    sub.add_argument(
        "--whole-slab",
        action="store_true",
        help="also check and time the whole-slab tiles (rows fp8_mosaic_variant)",
    )
    _add_settle(sub)
    _add_out(sub)


def add_fp8_quantize(kinds) -> None:
    sub = _parser(
        kinds,
        "fp8-quantize",
        "FP8 quantizers: the Pallas weight and columnwise quantizers bit for bit against "
        "XLA's, the weight quantization's layouts; GB/s (needs a GPU; --tiny runs anywhere)",
    )
    sub.add_argument(
        "--kind",
        dest="quantize_kinds",  # ``kind`` names the bench subcommand
        type=flags.names(fp8_quantize.KINDS),
        default=",".join(fp8_quantize.KINDS),
        help="comma list of weights, columnwise, layouts",
    )
    sub.add_argument(
        "--tiny", action="store_true", help="small shapes and tiles (CPU: Pallas' interpreter)"
    )
    sub.add_argument("--sweep", action="store_true", help="weights: also other Pallas tiles")
    sub.add_argument(
        "--repeats", type=flags.integer(1), default=10, help="interleaved rounds per case"
    )
    _add_settle(sub)
    _add_out(sub)


def add_layer_profile(kinds) -> None:
    sub = _parser(
        kinds,
        "layer-profile",
        "where the MoE layer's time goes: GPU kernel time per XLA op (jaxmoe) or per CUDA "
        "kernel (torch), per preset and pass (needs a GPU)",
    )
    _add_preset(sub)
    sub.add_argument(
        "--pass",
        "--passes",
        dest="passes",
        type=flags.names(PASSES),
        default="fwd,fwd+bwd",
        help="comma list of fwd, fwd+bwd",
    )
    sub.add_argument(
        "--impl",
        choices=layer_profile.IMPLS,
        default="jaxmoe",
        help="one per process: once torch's profiler has held CUPTI, JAX's trace is empty",
    )
    sub.add_argument(
        "--fp8", choices=FP8_RECIPES, default=None, help="jaxmoe: the layer with this FP8 recipe"
    )
    sub.add_argument(
        "--fp8-wgrad",
        choices=FP8_WGRAD_PRECISIONS,
        default="auto",
        help="with --fp8: the weight gradients' precision (Fp8Recipe.wgrad; 'fp8' needs rowwise)",
    )
    sub.add_argument("--top", type=flags.integer(1), default=25, help="ops listed per profile")
    sub.add_argument(
        "--settle-s",
        type=flags.number(0),
        default=0.0,
        help="run each function this long before profiling it (the clock settled under load)",
    )
    sub.add_argument(
        "--tile-variants",
        type=_json_variants,
        default="{}",
        help="jaxmoe: JSON, variant name -> MosaicTileConfig changes to the default tiles of "
        "--sites' kernels, each profiled after the default",
    )
    sub.add_argument(
        "--sites",
        type=_tile_sites,
        default="gmm,gated",
        help=f"comma list of the kernels whose tiles --tile-variants change "
        f"({', '.join(SITE_NAMES)})",
    )
    sub.add_argument(
        "--backend-variants",
        type=_json_variants,
        default="{}",
        help="jaxmoe: JSON, variant name -> fields of the layer's gated FFN backend, e.g. "
        '\'{"unfused_backward": {"fused_backward": false}}\'',
    )
    sub.add_argument(
        "--hlo-dir",
        type=flags.writable_folder,
        default=None,
        help="jaxmoe: also write each function's optimized HLO into this folder",
    )
    _add_out(sub)


def add_layer_api(kinds) -> None:
    sub = _parser(
        kinds,
        "layer-api",
        "the layer through the public API (jit(moe), jit(grad)), timed back to back, one call "
        "at a time, and by host launch: why a user's timing can differ from 'bench layer'",
    )
    _add_preset(sub)
    sub.add_argument(
        "--cases",
        type=flags.names(layer_api.CASES),
        default=",".join(layer_api.CASES),
        help=f"comma list of {', '.join(layer_api.CASES)}",
    )
    sub.add_argument(
        "--repeats", type=flags.integer(1), default=10, help="timed samples (pipelined)"
    )
    _add_out(sub)


def add_ep_memory(kinds) -> None:
    sub = _parser(
        kinds,
        "ep-memory",
        "temporaries XLA plans for the dropless EP layer against fast slots alone and "
        "worst-case slots (compiled only; CPU: simulated devices)",
    )
    sub.add_argument(
        "--ep",
        type=flags.device_count(1),
        default=8,
        help="expert-parallel size (CPU: that many simulated devices)",
    )
    sub.add_argument(
        "--pass",
        "--passes",
        dest="passes",
        type=flags.names(ep_memory.PASSES),
        default=",".join(ep_memory.PASSES),
        help="comma list of fwd (jit(moe)), fwd+bwd (jit(grad))",
    )
    _add_out(sub)


def add_ab(kinds) -> None:
    ab_command.add_flags(_parser(kinds, "ab", ab_command.DESCRIPTION))


def _check_flags(args) -> None:
    """``ValueError`` naming the flag for a rule between flags that the bench would otherwise
    break only after its earlier work (no device needed)."""
    if args.kind == "layer-profile":
        check_variant_fields(args.sites, args.tile_variants, args.backend_variants)


def _refusal(args) -> str | None:
    """Why this subcommand cannot run on this platform (None: it can)."""
    here = platform()
    if args.kind == "fp8-gemm":
        if here != "gpu" or importlib.util.find_spec("torch") is None:
            return f"bench fp8-gemm needs a CUDA GPU and torch; JAX's platform here is {here}"
    elif args.kind == "fp8-wgrad" and not args.smoke and here != "gpu":
        return f"bench fp8-wgrad needs a GPU (JAX's platform here is {here}); --smoke runs here"
    elif args.kind == "fp8-quantize" and not args.tiny and here != "gpu":
        return (
            f"bench fp8-quantize's full shapes need a GPU (JAX's platform here is {here}); "
            "--tiny runs here"
        )
    elif args.kind == "layer-profile" and here != "gpu":
        return f"bench layer-profile needs a GPU (JAX's platform here is {here})"
    return None


def _produce(args, on_row):
    """Runs ``args.kind``'s bench, each row through ``on_row``; returns its rows."""
    if args.kind == "fp8-gemm":
        return fp8_gemm.run_fp8_gemm_benchmark(
            [GEMM_SHAPES[name] for name in args.shapes],
            sweep=args.sweep,
            checks=not args.skip_checks,
            rounds=args.rounds,
            settle_ms=args.settle_ms,
            on_row=on_row,
        )
    if args.kind == "fp8-wgrad":
        return fp8_wgrad.run_fp8_wgrad_benchmark(
            [GEMM_SHAPES[name] for name in args.shapes],
            args.routings,
            smoke=args.smoke,
            rounds=args.rounds,
            whole_slab=args.whole_slab,
            settle_ms=args.settle_ms,
            on_row=on_row,
        )
    if args.kind == "fp8-quantize":
        return fp8_quantize.run_fp8_quantize_benchmark(
            args.quantize_kinds,
            tiny=args.tiny,
            sweep=args.sweep,
            rounds=args.repeats,
            settle_ms=args.settle_ms,
            on_row=on_row,
        )
    if args.kind == "layer-profile":
        return layer_profile.run_layer_profile(
            args.preset,
            args.passes,
            impl=args.impl,
            fp8_recipe=args.fp8,
            fp8_wgrad=args.fp8_wgrad,
            top=args.top,
            settle_s=args.settle_s,
            tile_variants=args.tile_variants,
            backend_variants=args.backend_variants,
            sites=args.sites,
            hlo_dir=args.hlo_dir,
            on_row=on_row,
        )
    if args.kind == "layer-api":
        return layer_api.run_layer_api_benchmark(
            args.preset, args.cases, repeats=args.repeats, on_row=on_row
        )
    if args.kind == "ep-memory":
        return ep_memory.run_ep_memory(args.ep, args.passes, on_row=on_row)
    raise ValueError(f"unknown bench kind {args.kind!r}; choose from {', '.join(KINDS)}")


def run(args, command: str) -> int:
    """Runs the bench subcommand ``args.kind`` (one of :data:`KINDS`); returns the exit status."""
    if args.kind == "ab":  # before anything here starts JAX: the workers hold the device
        return ab_command.run(args, command)
    try:
        _check_flags(args)
    except ValueError as error:
        flags.usage_error(str(error))
        return 2
    reason = _refusal(args)
    if reason is not None:
        flags.usage_error(reason)
        return 2
    if args.kind == "ep-memory":
        try:
            if args.ep > jax.device_count():
                raise ValueError(
                    f"argument --ep: {args.ep} devices asked for; {jax.device_count()} available"
                )
            ep_flags.check_ep_memory(args)
        except ValueError as error:
            flags.usage_error(str(error))
            return 2
    module = BENCH_MODULES[args.kind]
    header = harness.results_header(command, **getattr(module, "HEADER_FACTS", {}))
    render = getattr(module, "render", None) or harness.markdown_report(
        f"jaxmoe bench {args.kind}", module.COLUMNS
    )
    rows = _produce(args, harness.row_emitter(args.out, header, render))
    print(
        f"\n{header['device']} x{header['num_devices']} ({header['platform']}); "
        f"jax {header['jax']}; torch {header['torch']}\n"
    )
    print(harness.format_table(rows, module.COLUMNS))
    if args.out:
        print(f"wrote {args.out}")
    failed = any(row.get("error") or row.get("ok") is False for row in rows)
    return 0 if rows and not failed else 1
