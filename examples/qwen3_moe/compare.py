"""The model-level comparison on one GPU: jaxmoe's ``h200`` preset beside torchtitan's same model.

Runs each phase as its own process, one after the other, on synthetic tokens (each model holds
about 80% of an H200, so two cannot be resident at once and phases alternate by process rather
than within one): ``examples.qwen3_moe.train --preset h200`` in bf16, then
``examples.qwen3_moe.torchtitan_peer``, then each ``--fp8`` recipe; ``--rounds 2`` runs that
sequence twice. Each phase writes its ``metrics.json`` under ``--out``; the rows (tokens/s, MFU,
peak memory, first-step seconds, first and last loss, and each jaxmoe row's tokens/s over the
torchtitan row of its round) go to ``--out/rows.json`` for ``python -m jaxmoe.bench.tables``.

    python -m examples.qwen3_moe.compare --steps 50 --out model-h200
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


def phases(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """``(impl, command)`` of one round."""
    common = ["--steps", str(args.steps), "--data", "synthetic"]
    jaxmoe = [sys.executable, "-m", "examples.qwen3_moe.train", "--preset", args.preset, *common]
    result = [("jaxmoe-bf16", jaxmoe)]
    if not args.skip_torchtitan:
        peer = [sys.executable, "-m", "examples.qwen3_moe.torchtitan_peer"]
        result.append(("torchtitan", [*peer, "--steps", str(args.steps)]))
        if args.torchtitan_compile:
            result.append(("torchtitan-compile", [*peer, "--steps", str(args.steps), "--compile"]))
    for recipe in args.fp8:
        result.append((f"jaxmoe-fp8-{recipe}", [*jaxmoe, "--fp8", recipe]))
    for variant in args.jaxmoe_variant:
        name, _, flags = variant.partition("=")
        result.append((f"jaxmoe-{name}", [*jaxmoe, *shlex.split(flags)]))
    return result


def row(impl: str, round_: int, metrics: dict, model: str) -> dict:
    loss = metrics.get("loss") or [None]
    return {
        "model": model,
        "impl": impl,
        "round": round_,
        "ms": 1e3 * metrics["tokens_per_step"] / metrics["tokens_per_second"],
        "tokens_per_second": metrics["tokens_per_second"],
        "mfu": metrics["mfu"],
        "peak_memory_gib": (metrics.get("peak_memory_bytes") or 0) / 2**30,
        "first_step_s": metrics["compile_seconds"],
        "timed_steps": metrics["timed_steps"],
        "loss_first": loss[0],
        "loss_last": loss[-1],
        "flops_per_token": metrics["flops_per_token"],
    }


def model_name(preset: str, steps: int) -> str:
    return f"qwen3_moe {preset}, {steps} steps, synthetic tokens"


def run_header(argv: list[str]) -> dict:
    """Device, versions, date and command, as ``python -m jaxmoe.bench.tables`` reads them.

    The device's name comes from ``nvidia-smi``: this driver process must not start JAX or
    torch on the GPU, whose memory the phases need."""
    try:
        smi = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        names = subprocess.run(smi, capture_output=True, text=True, check=True).stdout.split("\n")
        device = names[0].strip() or "cpu"
    except (OSError, subprocess.CalledProcessError):
        device = "cpu"
    versions = {}
    for package in ("jax", "torch", "torchtitan"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "device": device,
        **versions,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m examples.qwen3_moe.compare " + " ".join(argv),
    }


def add_ratios(rows: list[dict]) -> None:
    """Sets each row's ``vs_torchtitan``: its tokens/s over the torchtitan row of its round."""
    peers = {r["round"]: r["tokens_per_second"] for r in rows if r["impl"] == "torchtitan"}
    for entry in rows:
        if entry["round"] in peers:
            entry["vs_torchtitan"] = entry["tokens_per_second"] / peers[entry["round"]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="h200")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--fp8", nargs="*", default=["rowwise"], help="FP8 recipes to add")
    parser.add_argument(
        "--jaxmoe-variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="one more jaxmoe phase: the train command with FLAGS, its row named jaxmoe-NAME "
        "(e.g. 'bf16-logits=--logits-dtype compute'); repeatable",
    )
    parser.add_argument("--skip-torchtitan", action="store_true")
    parser.add_argument("--torchtitan-compile", action="store_true")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per phase")
    parser.add_argument("--out", default="model-compare")
    return parser


def main(argv=None) -> list[dict]:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION="0.95")
    rows, failures = [], []
    for round_ in range(args.rounds):
        for impl, command in phases(args):
            folder = out / f"{impl}-{round_}"
            print(f"compare: {impl} (round {round_}): {' '.join(command[1:])}", flush=True)
            with open(out / f"{impl}-{round_}.log", "w") as log:
                try:
                    done = subprocess.run(
                        [*command, "--out", str(folder)],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        timeout=args.timeout,
                        check=False,
                    )
                    status = done.returncode
                except subprocess.TimeoutExpired:
                    status = "timeout"
            metrics_file = folder / "metrics.json"
            if status != 0 or not metrics_file.exists():
                failures.append({"impl": impl, "round": round_, "status": status})
                print(f"compare: {impl} failed ({status}); see {log.name}", flush=True)
                continue
            metrics = json.loads(metrics_file.read_text())
            rows.append(row(impl, round_, metrics, model_name(args.preset, args.steps)))
            print(
                f"compare: {impl}: {rows[-1]['tokens_per_second']:,.0f} tokens/s, "
                f"MFU {100 * rows[-1]['mfu']:.1f}%",
                flush=True,
            )
    add_ratios(rows)
    header = run_header(argv if argv is not None else sys.argv[1:])
    results = {"header": header, "rows": rows, "failures": failures}
    (out / "rows.json").write_text(json.dumps(results, indent=1))
    return rows


if __name__ == "__main__":
    main()
