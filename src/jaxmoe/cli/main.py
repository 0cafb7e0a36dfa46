"""The ``jaxmoe`` command (also ``python -m jaxmoe``): ``demo`` and ``bench gemm|layer|ep``.

Arguments are parsed before JAX starts, because simulated CPU devices (``--devices N``) must be
requested through ``XLA_FLAGS`` before the first device is created.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

SCORES = ("softmax", "sigmoid", "sqrtsoftplus")
LAYER_PRESET_NAMES = ("mixtral", "dsv3", "qwen3", "tiny")


def _parallel_available() -> bool:
    # Checked on disk, not by import: importing jaxmoe would start JAX too early.
    return (Path(__file__).resolve().parents[1] / "parallel" / "__init__.py").exists()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxmoe",
        description="Mixture-of-Experts layers for JAX: a training demo and benchmarks.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{demo,bench}")

    demo = commands.add_parser(
        "demo",
        help="train a small MoE character-level language model on Shakespeare (CPU, ~2 min)",
        description="Train a 2-layer decoder-only character transformer whose feed-forward "
        "layers are jaxmoe.nn.MoE, on the bundled tiny-Shakespeare corpus. Prints progress, a "
        "summary (loss, expert balance, dropped tokens) and sampled text; writes metrics.json "
        "and demo.png to --out.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument("--steps", type=int, default=300, help="training steps")
    demo.add_argument("--experts", type=int, default=8, help="routed experts per layer (E)")
    demo.add_argument("--top-k", type=int, default=2, help="experts per token (K)")
    demo.add_argument("--score", choices=SCORES, default="softmax", help="router score function")
    demo.add_argument(
        "--aux-loss", type=float, default=1e-2, help="load-balancing loss coefficient (0 = off)"
    )
    demo.add_argument(
        "--expert-bias-rate",
        type=float,
        default=0.0,
        help="aux-loss-free balancing: update a selection bias by this much after each step "
        "(needs --score sigmoid or sqrtsoftplus; 0 = off)",
    )
    demo.add_argument(
        "--devices",
        type=int,
        default=1,
        help="expert parallelism over N simulated CPU devices (experts sharded over a mesh axis)",
    )
    demo.add_argument("--seed", type=int, default=0, help="parameter and data seed")
    demo.add_argument("--out", default="jaxmoe-demo", help="output folder")
    demo.add_argument(
        "--checkpoint-dir", default=None, help="save here and resume from the latest (orbax)"
    )
    demo.add_argument("--save-every", type=int, default=50, help="steps between checkpoints")

    bench = commands.add_parser(
        "bench",
        help="benchmark the grouped matmul, the layer, or the expert-parallel exchange",
        description="Check then time implementations side by side; prints a table and writes JSON.",
    )
    kinds = bench.add_subparsers(dest="kind", required=True, metavar="{gemm,layer,ep}")
    for kind, text in (
        ("gemm", "grouped matmul x[M,K] @ w[G,K,N]: jaxmoe kernel, lax.ragged_dot, torch"),
        ("layer", "the whole MoE layer: jaxmoe (default / named backend), dense JAX, torch"),
        ("ep", "the expert-parallel exchange"),
    ):
        sub = kinds.add_parser(kind, help=text, description=text)
        sub.add_argument(
            "--preset",
            default="tiny",
            help=f"comma list of {', '.join(LAYER_PRESET_NAMES)} (or 'all' for the three big ones)",
        )
        sub.add_argument("--tokens", type=int, default=None, help="override the preset's tokens")
        sub.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
        sub.add_argument(
            "--compare",
            default=None,
            help="comma list of implementations; ratios are against the first that runs "
            "(layer: torch,jaxmoe,jaxmoe-xla,dense; gemm: torch,jaxmoe,xla_ragged_dot)",
        )
        sub.add_argument(
            "--pass",
            dest="passes",
            default="fwd,fwd+bwd",
            help="comma list of fwd, fwd+bwd",
        )
        sub.add_argument("--repeats", type=int, default=10, help="timed samples per row")
        if kind == "ep":
            sub.add_argument(
                "--ep",
                default="1,2",
                help="comma list of expert-parallel sizes (CPU: that many simulated devices)",
            )
        sub.add_argument("--out", default=None, help="JSON file to write (default: none)")
    return parser


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _presets(text: str) -> list[str]:
    names = ["mixtral", "dsv3", "qwen3"] if text == "all" else _split(text)
    for name in names:
        if name not in LAYER_PRESET_NAMES:
            raise SystemExit(
                f"jaxmoe bench: unknown --preset {name!r}; choose from "
                f"{', '.join(LAYER_PRESET_NAMES)} (comma-separated) or 'all'."
            )
    return names


def _request_cpu_devices(count: int) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flags = f"{flags} --xla_force_host_platform_device_count={count}".strip()
        os.environ["XLA_FLAGS"] = flags


def run_demo_command(args) -> int:
    if args.devices > 1:
        if not _parallel_available():
            print(
                "jaxmoe demo: --devices needs expert parallelism (jaxmoe.parallel), which is not "
                "in this install yet. Run without --devices.",
                file=sys.stderr,
            )
            return 2
        _request_cpu_devices(args.devices)
        os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from jaxmoe.cli.demo import DemoConfig, check_demo_config, run_demo

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
    )
    try:
        check_demo_config(cfg)
    except ValueError as error:
        print(f"jaxmoe demo: {error}", file=sys.stderr)
        return 2
    run_demo(cfg)
    return 0


def format_table(rows: list[dict], keys: list[str]) -> str:
    """A plain-text table: the ``keys`` columns, then ms, TFLOP/s, MFU (when known), ratio."""
    has_mfu = any(r.get("mfu") is not None for r in rows)
    ratio_key = "ratio" if any("ratio" in r for r in rows) else "ratio_vs_torch"
    header = [*keys, "ms", "TFLOP/s", *(["MFU"] if has_mfu else []), "ratio", "note"]
    lines = []
    for r in rows:
        cells = [str(r.get(k, "")) for k in keys]
        if r.get("ms") is None:
            why = r.get("skipped") or r.get("error") or "not run"
            cells += ["-", "-", *(["-"] if has_mfu else []), "-", why[:70]]
        else:
            ratio = r.get(ratio_key)
            cells += [
                f"{r['ms']:.3f}",
                f"{r['tflops']:.3f}" if r.get("tflops") is not None else "-",
                *(
                    [f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"]
                    if has_mfu
                    else []
                ),
                f"{ratio:.2f}x" if ratio else "-",
                f"vs {r['baseline']}" if r.get("baseline") and ratio else "",
            ]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) for cells in lines]
    return "\n".join(out)


def _write_json(path: str | None, header: dict, rows: list[dict]) -> None:
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"header": header, "rows": rows}, indent=1, default=str))
    print(f"wrote {path}")


def run_bench_command(args) -> int:
    command = "jaxmoe " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    presets = _presets(args.preset)
    passes = _split(args.passes)
    if args.kind == "ep":
        return run_bench_ep(args, presets, command)
    # Let torch and JAX share one GPU: JAX otherwise reserves 75% of its memory up front.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from tqdm.auto import tqdm

    if args.kind == "layer":
        from jaxmoe.bench import layer

        impls = _split(args.compare) or list(layer.DEFAULT_IMPLS)
        total = len(presets) * len(impls) * len(passes)
        with tqdm(total=total, desc="bench layer", unit="case", dynamic_ncols=True) as bar:

            def progress(what: str) -> None:
                bar.set_postfix_str(what)
                bar.update()

            try:
                extra, rows = layer.run_layer_benchmark(
                    presets,
                    impls,
                    passes,
                    dtype=args.dtype,
                    tokens=args.tokens,
                    repeats=args.repeats,
                    progress=progress,
                    log=tqdm.write,
                )
            except ValueError as error:
                print(f"jaxmoe bench layer: {error}", file=sys.stderr)
                return 2
        header = {**layer.benchmark_header(command), **extra}
        print(f"\n{header['device']}; jax {header['jax']}; torch {header['torch']}")
        print(
            f"dense peak {extra['dense_peak']['tflops']:.2f} TFLOP/s ({extra['dtype']}); "
            "TFLOP/s = expert matmuls only (fwd 3*2*T*K*H*F, fwd+bwd 3x); "
            "ratio = baseline ms / ms (> 1 is faster)\n"
        )
        print(format_table(rows, ["preset", "tokens", "pass", "impl"]))
        _write_json(args.out, header, rows)
        return 0 if any(r["ms"] is not None for r in rows) else 1

    # gemm
    from jaxmoe.bench import gemm
    from jaxmoe.bench.presets import GEMM_SHAPES, LAYER_PRESETS

    shapes = []
    for name in presets:
        for shape_name in (f"{name}-up", f"{name}-down", name):
            if shape_name in GEMM_SHAPES:
                shape = GEMM_SHAPES[shape_name]
                if args.tokens is not None:  # rows = tokens * top_k of the layer preset
                    m = args.tokens * LAYER_PRESETS[name].top_k
                    shape = type(shape)(shape.name, m, shape.k, shape.n, shape.groups)
                shapes.append(shape)
    impls = _split(args.compare) or list(gemm.IMPLS)
    total = len(shapes) * len(impls) * len(passes) * len(gemm.ROUTINGS)
    with tqdm(total=total, desc="bench gemm", unit="case", dynamic_ncols=True) as bar:

        def log(line: str) -> None:
            tqdm.write(line)
            if not line.startswith("torch with CUDA"):
                bar.update()

        try:
            rows = gemm.run_gemm_benchmark(
                shapes,
                impls=impls,
                passes=passes,
                repeats=args.repeats,
                dtype={"bf16": "bfloat16", "fp32": "float32"}[args.dtype],
                log=log,
            )
        except ValueError as error:
            print(f"jaxmoe bench gemm: {error}", file=sys.stderr)
            return 2
    # ratio against the first --compare entry that ran (gemm itself reports ratio_vs_torch).
    for key in {(r["shape"], r["pass"], r["routing"]) for r in rows}:
        group = {r["impl"]: r for r in rows if (r["shape"], r["pass"], r["routing"]) == key}
        timed = [i for i in impls if group.get(i, {}).get("ms")]
        for row in group.values():
            row["baseline"] = timed[0] if timed else None
            base_ms = group[timed[0]]["ms"] if timed else None
            row["ratio"] = base_ms / row["ms"] if base_ms and row.get("ms") else None
    header = gemm.benchmark_header(command)
    print(f"\n{header['device']}; jax {header['jax']}; torch {header['torch']}")
    print(
        "TFLOP/s = useful 2*M*K*N (fwd), 3x for fwd+bwd; ratio = baseline ms / ms (> 1 is faster)\n"
    )
    print(format_table(rows, ["shape", "m", "k", "n", "groups", "routing", "pass", "impl"]))
    _write_json(args.out, header, rows)
    return 0 if any(r["ms"] is not None for r in rows) else 1


def run_bench_ep(args, presets: list[str], command: str) -> int:
    ep_sizes = [int(v) for v in _split(args.ep)]
    # Simulated CPU devices must be asked for before JAX starts (harmless on a GPU host).
    _request_cpu_devices(max(ep_sizes, default=1))
    try:
        from jaxmoe.bench import ep
    except ImportError:
        print(
            "jaxmoe bench ep: the expert-parallel benchmark lands with expert parallelism "
            "(jaxmoe.parallel, jaxmoe.bench.ep), which is not in this install yet.",
            file=sys.stderr,
        )
        return 2
    tiny = presets == ["tiny"]
    cases = ["dsv3", "mixtral"] if tiny else [p for p in presets if p in ("dsv3", "mixtral")]
    if not cases:
        print("jaxmoe bench ep: --preset must be dsv3, mixtral or tiny.", file=sys.stderr)
        return 2
    import jax
    from tqdm.auto import tqdm

    parts = ["correctness", "exchange", "layer"]
    if jax.default_backend() == "cpu":
        # Timed loops of CPU collectives can deadlock XLA's in-process rendezvous.
        parts.remove("exchange")
        print("jaxmoe bench ep: on CPU the exchange bandwidth part is skipped.", file=sys.stderr)
    rows = ep.run_ep_benchmark(ep_sizes, parts=parts, cases=cases, tiny=tiny, log=tqdm.write)
    header = ep.benchmark_header(command)
    print(ep.markdown(rows, header))
    _write_json(args.out, header, rows)
    return 0 if rows and not all(r.get("error") for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        return run_demo_command(args)
    return run_bench_command(args)


if __name__ == "__main__":
    sys.exit(main())
