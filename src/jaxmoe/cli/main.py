"""The ``jaxmoe`` command (also ``python -m jaxmoe``): ``demo`` and ``bench gemm|layer|ep`` (the
other bench subcommands are in :mod:`jaxmoe.cli.bench_commands`).

This module parses and prints; the work is in :mod:`jaxmoe.cli.demo` and :mod:`jaxmoe.bench`.
Every flag is checked while parsing (:mod:`jaxmoe.cli.flags`): a bad one prints one line,
``jaxmoe: error: ...``, and exits with status 2 before any work starts. Arguments are parsed
before JAX creates a device, because simulated CPU devices (``demo --devices N``, ``bench ep
--ep N``) must be requested through ``XLA_FLAGS`` before the first device is created.

The three benches print the same kind of table (:func:`jaxmoe.bench.harness.format_table`) and
write ``{"header", "rows"}`` JSON to ``--out``, after every row (a run cut short keeps what it
measured). The exit status is 0 when something ran and nothing failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from tqdm.auto import tqdm

from jaxmoe.bench import expert_parallel, gemm, gemm_tile_sweep, harness, layer, timing
from jaxmoe.bench.layer_scaling import LAYER_CASES
from jaxmoe.bench.presets import GEMM_SHAPES, LAYER_PRESETS
from jaxmoe.cli import bench_commands, ep_flags, flags
from jaxmoe.option_names import FP8_RECIPES, FP8_WGRAD_PRECISIONS
from jaxmoe.parallel.exchange import EXCHANGES

SCORES = ("softmax", "sigmoid", "sqrtsoftplus")
BIG_PRESETS = ("mixtral", "dsv3", "qwen3")
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
Formatter = argparse.ArgumentDefaultsHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    parser = flags.Parser(
        prog="jaxmoe",
        description="Mixture-of-Experts layers for JAX: a training demo and benchmarks.",
        formatter_class=Formatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{demo,bench}")
    _add_demo(commands)
    bench = commands.add_parser(
        "bench",
        help="benchmark the grouped matmul, the layer, or expert parallelism",
        description="Check then time implementations side by side; prints a table and writes "
        "JSON ({'header', 'rows'}) to --out.",
        formatter_class=Formatter,
    )
    metavar = "{" + ",".join(("gemm", "layer", "ep", *bench_commands.KINDS)) + "}"
    kinds = bench.add_subparsers(dest="kind", required=True, metavar=metavar)
    _add_gemm(kinds)
    _add_layer(kinds)
    _add_ep(kinds)
    bench_commands.add_fp8_gemm(kinds)
    bench_commands.add_fp8_wgrad(kinds)
    bench_commands.add_fp8_quantize(kinds)
    bench_commands.add_layer_profile(kinds)
    bench_commands.add_layer_api(kinds)
    bench_commands.add_ep_memory(kinds)
    bench_commands.add_ab(kinds)
    return parser


def _add_demo(commands) -> None:
    demo = commands.add_parser(
        "demo",
        help="train a small MoE character-level language model on Shakespeare (CPU, ~2 min)",
        description="Train a 2-layer decoder-only character transformer whose feed-forward "
        "layers are jaxmoe.nn.MoE, on the bundled tiny-Shakespeare corpus. Prints progress, a "
        "summary (loss, expert balance, dropped tokens) and sampled text; writes metrics.json "
        "and demo.png to --out.",
        formatter_class=Formatter,
    )
    demo.add_argument("--steps", type=flags.integer(1), default=300, help="training steps")
    demo.add_argument(
        "--experts", type=flags.integer(1), default=8, help="routed experts per layer (E)"
    )
    demo.add_argument("--top-k", type=flags.integer(1), default=2, help="experts per token (K)")
    demo.add_argument("--score", choices=SCORES, default="softmax", help="router score function")
    demo.add_argument(
        "--aux-loss",
        type=flags.number(0),
        default=1e-2,
        help="load-balancing loss coefficient (0 = off)",
    )
    demo.add_argument(
        "--expert-bias-rate",
        type=flags.number(0),
        default=0.0,
        help="aux-loss-free balancing: update a selection bias by this much after each step "
        "(needs --score sigmoid or sqrtsoftplus; 0 = off)",
    )
    demo.add_argument(
        "--devices",
        type=flags.device_count(1),
        default=1,
        help="expert parallelism over N simulated CPU devices (experts sharded over a mesh axis)",
    )
    demo.add_argument(
        "--seed", type=flags.integer(0, 2**32), default=0, help="parameter and data seed"
    )
    demo.add_argument("--out", type=flags.writable_folder, default="jaxmoe-demo", help="folder")
    demo.add_argument(
        "--checkpoint-dir",
        type=flags.writable_folder,
        default=None,
        help="save here every --save-every steps and resume from the latest (orbax)",
    )
    demo.add_argument(
        "--save-every", type=flags.integer(1), default=50, help="steps between checkpoints"
    )
    demo.add_argument(
        "--sample-chars",
        type=flags.integer(0),
        default=240,
        help="characters sampled from the trained model at the end (0: none)",
    )
    demo.add_argument(
        "--fp8",
        choices=FP8_RECIPES,
        default=None,
        help="run the routed experts' matmuls in FP8 (e4m3) with this scaling recipe "
        "(None: off, matmuls in float32)",
    )
    demo.add_argument(
        "--fp8-wgrad",
        choices=FP8_WGRAD_PRECISIONS,
        default="auto",
        help="with --fp8: 'fp8' (rowwise only) runs the weight gradients in FP8 too, 'high' in "
        "high precision, 'auto' in FP8 where that is faster (Fp8Recipe.wgrad)",
    )


def _add_common(sub, presets, all_presets, default_preset="tiny") -> None:
    """Flags every bench takes."""
    sub.add_argument(
        "--preset",
        type=flags.preset_names(presets, all_presets),
        default=default_preset,
        help=f"comma list of {', '.join(presets)}, or 'all' for {','.join(all_presets)}",
    )
    sub.add_argument(
        "--out",
        type=flags.writable_file,
        default=None,
        help="JSON file for the results, rewritten after every row (None: not written)",
    )


def _add_budget(sub) -> None:
    sub.add_argument(
        "--budget-s",
        "--time-budget-s",
        type=flags.number(0, above=True),
        default=None,
        help="start no new measurement after this many seconds (None: no limit)",
    )


def _add_sizes(sub, impls_help: str, impls_type) -> None:
    """Flags of the gemm and layer benches: tokens, dtype, peers, passes, repeats."""
    sub.add_argument(
        "--tokens",
        type=flags.integer(1),
        default=None,
        help="tokens instead of the preset's (None: the preset's)",
    )
    sub.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="operand dtype")
    sub.add_argument(
        "--compare",
        "--impls",
        dest="compare",
        type=impls_type,
        default=None,
        help=f"comma list of implementations; ratios are against the first that runs "
        f"({impls_help})",
    )
    sub.add_argument(
        "--pass",
        "--passes",
        dest="passes",
        type=flags.names(gemm.PASSES),
        default="fwd,fwd+bwd",
        help="comma list of fwd, fwd+bwd",
    )
    sub.add_argument(
        "--repeats", type=flags.integer(1), default=10, help="timed samples per measurement"
    )
    sub.add_argument(
        "--settle-ms",
        type=flags.number(0),
        default=None,
        help="ms each peer runs untimed before each of its samples, so that the sample sees the "
        f"clock its own load settles at (None: {timing.SETTLE_MS:g} on a GPU, 0 elsewhere)",
    )


def _add_gemm(kinds) -> None:
    text = "grouped matmul x[M,K] @ w[G,K,N]: jaxmoe kernels, lax.ragged_dot, jax Mosaic, torch"
    sub = kinds.add_parser("gemm", help=text, description=text, formatter_class=Formatter)
    _add_common(sub, tuple(LAYER_PRESETS), BIG_PRESETS)
    _add_sizes(
        sub,
        f"choose from {', '.join(gemm.IMPLS)}; None: all; those the platform cannot run "
        "are skipped",
        flags.names(gemm.IMPLS),
    )
    _add_budget(sub)
    sub.add_argument(
        "--shapes",
        type=flags.names(tuple(GEMM_SHAPES)),
        default=None,
        help=f"comma list of shapes instead of --preset's ({', '.join(GEMM_SHAPES)}; None: "
        "the preset's)",
    )
    sub.add_argument(
        "--routings",
        type=flags.names(gemm.ROUTINGS),
        default=",".join(gemm.ROUTINGS),
        help="comma list of balanced (equal groups), skewed (Dirichlet(0.3) group sizes)",
    )
    sub.add_argument(
        "--tune",
        choices=gemm_tile_sweep.TUNE_ROUNDS,
        default=None,
        help="sweep the Pallas Triton tile configs of this round instead (GPU)",
    )


def _add_layer(kinds) -> None:
    text = "the whole MoE layer: jaxmoe (default / named backend), dense JAX, torch, torchtitan"
    sub = kinds.add_parser("layer", help=text, description=text, formatter_class=Formatter)
    _add_common(sub, tuple(LAYER_PRESETS), BIG_PRESETS)
    _add_sizes(
        sub,
        "torch, torchtitan (torchtitan's MoE module, opt-in), jaxmoe, jaxmoe-<backend>, dense; "
        "None: " + ",".join(layer.DEFAULT_IMPLS),
        _layer_impls,
    )


def _layer_impls(text: str) -> list[str]:
    impls = [part.strip() for part in text.split(",")]
    try:
        layer.check_impls(impls)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return impls


def _add_ep(kinds) -> None:
    text = "expert parallelism: correctness of every exchange, exchange bandwidth, layer scaling"
    sub = kinds.add_parser("ep", help=text, description=text, formatter_class=Formatter)
    _add_common(sub, ("tiny", *LAYER_CASES), ("dsv3", "mixtral"))
    _add_budget(sub)
    sub.add_argument(
        "--ep",
        type=flags.device_counts(1),
        default="1,2",
        help="comma list of expert-parallel sizes (CPU: that many simulated devices)",
    )
    sub.add_argument(
        "--parts",
        type=flags.names(expert_parallel.PARTS),
        default=",".join(expert_parallel.PARTS),
        help="comma list of the parts to run (the exchange part is skipped on CPU)",
    )
    sub.add_argument(
        "--compare",
        "--exchanges",
        dest="compare",
        type=flags.names(tuple(EXCHANGES)),
        default=None,
        help="exchange part: only these exchanges (None: all that run here)",
    )
    sub.add_argument(
        "--exchange-ep",
        type=flags.device_counts(2),
        default=None,
        help="expert-parallel sizes of the exchange part (None: those of --ep)",
    )
    sub.add_argument(
        "--layer-exchange",
        choices=tuple(EXCHANGES),
        default=None,
        help="layer part's ep_exchange (None: the library's default)",
    )
    sub.add_argument(
        "--receive-factor",
        type=flags.number(0, above=True, none=True),
        default="1.25",
        help="layer part's ep_receive_factor ('none' = dropless)",
    )
    sub.add_argument(
        "--fast-slot-factor",
        type=flags.number(1, none=True),  # ep_fast_slot_factor's rule: a multiple >= 1
        default="1.125",
        help="ep_fast_slot_factor of the layer part and of the default exchange row",
    )
    sub.add_argument("--chunks", type=flags.integer(1), default=1, help="layer part's ep_chunks")


def _request_cpu_devices(count: int) -> None:
    flags_text = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags_text:
        flags_text = f"{flags_text} --xla_force_host_platform_device_count={count}".strip()
        os.environ["XLA_FLAGS"] = flags_text


def run_demo_command(args) -> int:
    if args.devices > 1:
        _request_cpu_devices(args.devices)
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # Imported here: flax, optax and the demo's model are needed by the demo only (slow imports).
    from jaxmoe.cli.demo import DemoConfig, check_demo_run, run_demo

    cfg = DemoConfig(
        steps=args.steps,
        num_experts=args.experts,
        top_k=args.top_k,
        score=args.score,
        aux_loss=args.aux_loss,
        expert_bias_rate=args.expert_bias_rate,
        devices=args.devices,
        seed=args.seed,
        out=args.out,
        checkpoint_dir=args.checkpoint_dir,
        save_every=args.save_every,
        fp8=args.fp8,
        fp8_wgrad=args.fp8_wgrad,
        sample_chars=args.sample_chars,
    )
    try:
        check_demo_run(cfg)
    except ValueError as error:
        flags.usage_error(str(error))
        return 2
    run_demo(cfg)
    return 0


def _progress(desc: str, total: int | None = None):
    """A progress bar on stderr, and a ``log`` that writes above it."""
    return tqdm(total=total, desc=desc, unit="row", dynamic_ncols=True), tqdm.write


class _Results:
    """The results of one bench: its header, its table, and ``--out`` rewritten on every
    :meth:`save` (so that a run cut short keeps what it measured)."""

    def __init__(self, args, command: str, columns, header_facts: dict):
        self.out, self.columns = args.out, columns
        self.header = harness.results_header(command, **header_facts)
        self.render = harness.markdown_report(f"jaxmoe bench {args.kind}", columns)

    def save(self, rows) -> list:
        return harness.write_results(self.out, self.header, rows, self.render) if self.out else []

    def finish(self, rows, facts_line: str) -> int:
        """Prints the header, the facts, the table; writes ``--out``; returns the exit status."""
        h = self.header
        print(
            f"\n{h['device']} x{h['num_devices']} ({h['platform']}); "
            f"jax {h['jax']}; torch {h['torch']}"
        )
        print(f"{facts_line}; {harness.RATIO_RULE}\n")
        print(harness.format_table(rows, self.columns))
        for path in self.save(rows):
            print(f"wrote {path}")
        failed = any(r.get("error") or r.get("ok") is False for r in rows)
        ran = any(r.get("ms") is not None or r.get("ok") for r in rows)
        return 0 if ran and not failed else 1


def run_bench_command(args) -> int:
    command = "jaxmoe " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.kind == "ep":
        return run_bench_ep(args, command)
    if args.kind == "ep-memory":  # simulated CPU devices must be asked for before JAX starts
        _request_cpu_devices(args.ep)
    if args.kind in bench_commands.KINDS:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU
        return bench_commands.run(args, command)
    # Let torch and JAX share one GPU: JAX otherwise reserves 75% of its memory up front.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.kind == "layer":
        impls = args.compare or list(layer.DEFAULT_IMPLS)
        results = _Results(args, command, layer.COLUMNS, layer.HEADER_FACTS)
        bar, log = _progress("bench layer", len(args.preset) * len(impls) * len(args.passes))
        with bar:
            extra, rows = layer.run_layer_benchmark(
                args.preset,
                impls,
                args.passes,
                dtype=args.dtype,
                tokens=args.tokens,
                repeats=args.repeats,
                settle_ms=args.settle_ms,
                progress=lambda what: (bar.set_postfix_str(what), bar.update()),
                log=log,
                on_row=results.save,
            )
        results.header.update(extra)
        return results.finish(
            rows,
            f"dense peak {extra['dense_peak']['tflops']:.2f} TFLOP/s ({extra['dtype']}); "
            "TFLOP/s = expert matmuls only (fwd 3*2*T*K*H*F, fwd+bwd 3x)",
        )

    dtype = DTYPES[args.dtype]
    budget = args.budget_s if args.budget_s is not None else float("inf")
    shapes = args.shapes or gemm.shapes_for_presets(args.preset, args.tokens)
    if args.tune:
        candidates = gemm_tile_sweep.tune_candidates(args.tune)
        results = _Results(args, command, gemm_tile_sweep.COLUMNS, {})
        bar, log = _progress("tile sweep", len(shapes) * sum(map(len, candidates.values())))
        with bar:
            rows = gemm_tile_sweep.sweep_pallas_tiles(
                shapes,
                candidates,
                dtype=dtype,
                repeats=args.repeats,
                time_budget_s=budget,
                log=log,
                on_row=lambda rows: (bar.update(), results.save(rows)),
            )
        return results.finish(rows, "balanced groups; TFLOP/s = useful 2*M*K*N")

    impls = args.compare or list(gemm.IMPLS)
    results = _Results(args, command, gemm.COLUMNS, gemm.HEADER_FACTS)
    total = len(shapes) * len(impls) * len(args.passes) * len(args.routings)
    bar, log = _progress("bench gemm", total)
    with bar:
        rows = gemm.run_gemm_benchmark(
            shapes,
            impls=impls,
            routings=args.routings,
            passes=args.passes,
            repeats=args.repeats,
            settle_ms=args.settle_ms,
            dtype=dtype,
            budget_s=budget,
            log=log,
            on_row=lambda rows: (bar.update(), results.save(rows)),
        )
    return results.finish(rows, "TFLOP/s = useful 2*M*K*N (fwd), 3x for fwd+bwd")


def run_bench_ep(args, command: str) -> int:
    try:
        cases, tiny = expert_parallel.cases_for_presets(args.preset)
    except ValueError as error:
        flags.usage_error(f"argument --preset: {error}")
        return 2
    try:
        ep_flags.check_bench_ep(args, cases, tiny)
        # Simulated CPU devices must be asked for before JAX starts (harmless on a GPU host).
        _request_cpu_devices(max(args.ep))
        ep_flags.check_devices(args)
    except ValueError as error:
        flags.usage_error(str(error))
        return 2
    results = _Results(args, command, expert_parallel.COLUMNS, expert_parallel.HEADER_FACTS)
    rows: list[dict] = []
    bar, _ = _progress("bench ep")

    def on_row(row) -> None:
        rows.append(row)
        bar.update()
        results.save(rows)

    with bar:
        expert_parallel.run_ep_benchmark(
            args.ep,
            parts=args.parts,
            cases=cases,
            tiny=tiny,
            receive_factor=args.receive_factor,
            fast_slot_factor=args.fast_slot_factor,
            chunks=args.chunks,
            budget_s=args.budget_s if args.budget_s is not None else float("inf"),
            exchange_ep=args.exchange_ep,
            exchanges=args.compare,
            layer_exchange=args.layer_exchange,
            log=lambda _: None,
            on_row=on_row,
        )
    return results.finish(rows, "GB/s/rank = " + expert_parallel.HEADER_FACTS["bandwidth"])


def main(argv: list[str] | None = None) -> int:
    """Runs ``jaxmoe ARGS``; returns the exit status (a bad flag raises SystemExit(2))."""
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        return run_demo_command(args)
    return run_bench_command(args)


if __name__ == "__main__":
    sys.exit(main())
