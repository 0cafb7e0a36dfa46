"""Trains the Qwen3-MoE decoder: ``python -m examples.qwen3_moe.train --preset tiny|h200``.

One jitted step: the model's forward, next-token cross-entropy plus every MoE block's router
``aux_loss``, gradients, AdamW (global-norm clipping 1.0, warmup then cosine decay), and each
MoE layer's tokens per expert (``MoEStats``). With ``--mesh fsdp=2,ep=4`` the same step runs
on a device mesh: the batch over ``(fsdp, ep)``, the experts over ``ep`` (expert
parallelism: ``jaxmoe.moe(..., mesh=...)``), and every weight and its Adam moments
FSDP-sharded over ``fsdp`` on its ``embed`` axis (the experts' ``H``:
``fsdp_expert_weights``), by jaxmoe's logical axis rules.

Reported: a progress bar with the loss and tokens/s; at the end tokens/s and MFU (see
:mod:`examples.qwen3_moe.flops` for the formula), measured from the end of the first step
(which compiles) to the end of the last, each end after blocking on the step's result; the
expert load; ``metrics.json`` and ``train.png`` in ``--out``. With ``--checkpoint-dir`` the
run is saved every ``--save-every`` steps (:mod:`jaxmoe.checkpoint`) and resumes from the
latest save with the same batches and losses as a run that never stopped.

Reused from ``jaxmoe demo`` (public functions of :mod:`jaxmoe.cli`): the mesh layout of the
model and optimizer state (``state_shardings``), the checkpoints (``DemoCheckpoints``), the
figure (``plot_demo``), the flag types, the corpus and its codec. The step is this example's own
(:mod:`examples.qwen3_moe.step`: it donates the state).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

import jaxmoe.parallel
from jaxmoe.cli.flags import Parser, integer, number, usage_error, writable_folder
from jaxmoe.cli.plot import expert_balance, plot_demo
from jaxmoe.cli.resume import DemoCheckpoints

from .config import DecoderConfig
from .data import DATA_SOURCES, Batches
from .flops import H100_BF16_DENSE_TFLOPS, flops_per_token, mfu, parameter_counts
from .model import attention_implementation
from .presets import PRESETS, build_config, memory_estimate
from .step import adamw, init_state, make_train_step

MESH_AXES = ("fsdp", "ep")


def mesh_axes(text: str) -> dict[str, int]:
    """``--mesh``: ``fsdp=F,ep=E`` (either may be left out; sizes >= 1)."""
    axes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, size = part.partition("=")
        if name not in MESH_AXES or name in axes or not size.isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(
                f"must be a comma list of AXIS=SIZE with AXIS in {MESH_AXES} (each once) and "
                f"SIZE >= 1, e.g. fsdp=2,ep=4; got {text!r}"
            )
        axes[name] = int(size)
    if not axes:
        raise argparse.ArgumentTypeError(f"names no axis; e.g. fsdp=2,ep=4; got {text!r}")
    return axes


def build_parser() -> Parser:
    parser = Parser(
        prog="python -m examples.qwen3_moe.train",
        description="Train the reference Qwen3-MoE decoder (examples/qwen3_moe/README.md).",
    )
    add = parser.add_argument
    add("--preset", choices=sorted(PRESETS), default="tiny", help="model and run defaults")
    add("--steps", type=integer(1), help="optimizer steps (default: the preset's)")
    add("--batch-size", type=integer(1), help="sequences a step (default: the preset's)")
    add("--seq-len", type=integer(2), help="tokens a sequence (default: the preset's)")
    add("--learning-rate", type=number(0, above=True), help="peak AdamW learning rate")
    add("--data", choices=DATA_SOURCES, default="corpus", help="training tokens")
    add("--out", type=writable_folder, default="qwen3-moe-run", help="metrics.json, train.png")
    add("--mesh", type=mesh_axes, help="a device mesh, e.g. fsdp=2,ep=4 (default: one device)")
    add("--fp8", choices=("rowwise", "blockwise"), help="FP8 expert matmuls (MoEConfig.fp8_recipe)")
    add("--dtype", choices=("float32", "bfloat16"), help="compute dtype (default: the preset's)")
    add("--param-dtype", choices=("float32", "bfloat16"), help="parameter dtype")
    add("--remat", action="store_true", help="recompute each layer in the backward pass")
    add("--attention", choices=("auto", "xla", "cudnn"), default="auto", help="attention kernel")
    add(
        "--logits-dtype",
        choices=("float32", "compute"),
        default="float32",
        help="what the head's matmul writes: float32 logits, or logits in the compute dtype "
        "taken to float32 for the loss (DecoderConfig.float32_logits)",
    )
    add(
        "--peak-tflops",
        type=number(0, above=True),
        default=H100_BF16_DENSE_TFLOPS,
        help="per-device peak for MFU (default 989: H100/H200 SXM bf16 dense)",
    )
    add("--checkpoint-dir", help="save here every --save-every steps; resume from the latest")
    add("--save-every", type=integer(1), default=100, help="steps between checkpoints")
    add("--log-every", type=integer(1), default=10, help="steps between progress readings")
    add("--seed", type=integer(0), default=0, help="parameters and batches")
    return parser


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: the model and every loop setting (the flags, preset defaults filled)."""

    cfg: DecoderConfig
    preset: str
    steps: int
    batch_size: int
    seq_len: int
    learning_rate: float
    warmup_steps: int
    data: str = "corpus"
    out: str = "qwen3-moe-run"
    mesh: dict | None = None
    peak_tflops: float = H100_BF16_DENSE_TFLOPS
    checkpoint_dir: str | None = None
    save_every: int = 100
    log_every: int = 10
    seed: int = 0


def run_from_flags(args: argparse.Namespace) -> Run:
    """The :class:`Run` of parsed flags; a bad combination is a one-line usage error."""
    preset = PRESETS[args.preset]
    axes = args.mesh or {}
    moe_fields = {"fp8_recipe": args.fp8}
    if axes:
        moe_fields.update(ep_axis="ep", data_axes=("fsdp",) if "fsdp" in axes else ())
        moe_fields["fsdp_expert_weights"] = axes.get("fsdp", 1) > 1
        axes = {"fsdp": axes.get("fsdp", 1), "ep": axes.get("ep", 1)}
    try:
        cfg = build_config(
            preset, dtype=args.dtype, param_dtype=args.param_dtype, remat=args.remat, **moe_fields
        )
        cfg = dataclasses.replace(
            cfg, attention=args.attention, float32_logits=args.logits_dtype == "float32"
        )
    except ValueError as error:
        raise usage_error(str(error)) from None
    batch = args.batch_size or preset.batch_size
    devices = math.prod(axes.values()) if axes else 1
    mesh_text = ",".join(f"{name}={size}" for name, size in (args.mesh or {}).items())
    if axes and cfg.moe.num_experts % axes["ep"]:
        raise usage_error(
            f"--mesh {mesh_text}: ep={axes['ep']} must divide the preset's "
            f"{cfg.moe.num_experts} experts."
        )
    if devices > len(jax.devices()):
        raise usage_error(
            f"--mesh {mesh_text} needs {devices} devices; JAX sees {len(jax.devices())}. On a "
            "CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts."
        )
    if batch % devices:
        raise usage_error(
            f"--batch-size {batch} must be a multiple of the mesh's {devices} devices "
            f"(--mesh {mesh_text})."
        )
    return Run(
        cfg=cfg,
        preset=preset.name,
        steps=args.steps or preset.steps,
        batch_size=batch,
        seq_len=args.seq_len or preset.seq_len,
        learning_rate=args.learning_rate or preset.learning_rate,
        warmup_steps=preset.warmup_steps,
        data=args.data,
        out=args.out,
        mesh=axes or None,
        peak_tflops=args.peak_tflops,
        checkpoint_dir=args.checkpoint_dir,
        save_every=args.save_every,
        log_every=args.log_every,
        seed=args.seed,
    )


def make_mesh(axes: dict | None):
    """A ``(fsdp, ep)`` mesh over the first ``fsdp * ep`` devices, or None."""
    if not axes:
        return None
    count = axes["fsdp"] * axes["ep"]
    devices = np.array(jax.devices()[:count]).reshape(axes["fsdp"], axes["ep"])
    return jax.sharding.Mesh(devices, MESH_AXES)


def place_batch(tokens: np.ndarray, cfg: DecoderConfig, mesh) -> jax.Array:
    """The batch on the mesh's batch axes (``(fsdp, ep)``), or on the default device."""
    if mesh is None:
        return jnp.asarray(tokens)
    spec = jaxmoe.parallel.batch_partition_spec(cfg.moe, tokens.ndim)
    return jax.device_put(tokens, NamedSharding(mesh, spec))


def _peak_memory_bytes() -> int | None:
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def train(run: Run) -> dict:
    """Runs ``run``; returns the metrics also written to ``run.out/metrics.json``."""
    from tqdm.auto import tqdm

    out = Path(run.out)
    out.mkdir(parents=True, exist_ok=True)
    mesh = make_mesh(run.mesh)
    tx = adamw(run.learning_rate, run.warmup_steps, run.steps)
    graphdef, state, shardings = init_state(run.cfg, tx, run.seed, mesh)
    train_step = make_train_step(graphdef, shardings)
    rng = np.random.default_rng(run.seed)
    batches = Batches(run.data, run.cfg.vocab_size, run.batch_size, run.seq_len, rng)
    devices = 1 if mesh is None else mesh.size
    tokens_per_step = run.batch_size * run.seq_len
    counts = parameter_counts(run.cfg)
    print(
        f"qwen3_moe: preset {run.preset}, {run.cfg.num_layers} layers, "
        f"{counts['total'] / 1e9:.3g}B parameters ({counts['active'] / 1e9:.3g}B active), "
        f"batch {run.batch_size}x{run.seq_len}, {run.steps} steps on {devices} "
        f"{jax.default_backend()} device(s), attention {attention_implementation(run.cfg)}"
    )

    record = {"loss": [], "aux_loss": [], "tokens_per_expert": [], "dropped": []}
    metrics = {"step": [], "val_step": [], "val_loss": []}
    first, checkpoints = 1, None
    if run.checkpoint_dir:
        checkpoints = DemoCheckpoints(run.checkpoint_dir, run.save_every)
        state, first = checkpoints.resume(state, rng, record, metrics)
        if shardings is not None:
            state = jax.device_put(state, shardings)

    compile_s, start, windows = 0.0, time.perf_counter(), []
    window_start, window_steps = start, 0
    bar = tqdm(range(first, run.steps + 1), desc="training", unit="step", dynamic_ncols=True)
    for step in bar:
        t0 = time.perf_counter()
        state, loss, aux, load, dropped = train_step(
            state, place_batch(batches.next(), run.cfg, mesh)
        )
        metrics["step"].append(step)
        for key, value in zip(record, (loss, aux, load, dropped), strict=True):
            record[key].append(value)
        if step == first:  # compiles: excluded from the throughput
            jax.block_until_ready(loss)
            start = window_start = time.perf_counter()
            compile_s = start - t0
        else:
            window_steps += 1
        if window_steps and (window_steps == run.log_every or step == run.steps):
            loss_now = float(loss)  # blocks on the step's result
            now = time.perf_counter()
            rate = tokens_per_step * window_steps / (now - window_start)
            windows.append({"last_step": step, "steps": window_steps, "tokens_per_second": rate})
            bar.set_postfix(loss=f"{loss_now:.3f}", tok_s=f"{rate:,.0f}")
            window_start, window_steps = now, 0
        if checkpoints:
            checkpoints.maybe_save(step, run.steps, state, rng, record, metrics)
    bar.close()
    jax.block_until_ready(state)
    timed_steps = run.steps - first
    train_s = time.perf_counter() - start
    tokens_per_second = tokens_per_step * timed_steps / train_s if timed_steps else None

    host = jax.device_get(record)
    loss = np.array(host["loss"], np.float64)
    load = np.array(host["tokens_per_expert"], np.int64)  # [steps, MoE layers, E]
    last = load[-max(1, len(load) // 10) :].sum(0)
    utilisation = (
        None
        if tokens_per_second is None
        else mfu(tokens_per_second / devices, run.cfg, run.seq_len, run.peak_tflops)
    )
    metrics.update(
        title=(
            f"qwen3_moe {run.preset}: {run.cfg.num_layers} layers, {run.cfg.moe.num_experts} "
            f"experts top-{run.cfg.moe.top_k}, {run.data} data"
            + (f", fp8={run.cfg.moe.fp8_recipe}" if run.cfg.moe.fp8_recipe else "")
        ),
        loss=loss.tolist(),
        aux_loss=np.array(host["aux_loss"], np.float64).tolist(),
        tokens_per_expert=load.tolist(),
        dropped_tokens=np.array(host["dropped"], np.int64).tolist(),
        max_over_mean_load=expert_balance(last).tolist(),
        moe_layers=list(run.cfg.moe_layers),
        parameters=counts,
        flops_per_token=flops_per_token(run.cfg, run.seq_len),
        tokens_per_step=tokens_per_step,
        devices=devices,
        compile_seconds=compile_s,
        train_seconds=train_s,
        timed_steps=timed_steps,
        tokens_per_second=tokens_per_second,
        windows=windows,
        mfu=utilisation,
        peak_tflops=run.peak_tflops,
        peak_memory_bytes=_peak_memory_bytes(),
        memory_estimate_gb=memory_estimate(run.cfg, tokens_per_step // devices),
        backend=jax.default_backend(),
        attention=attention_implementation(run.cfg),
        run={k: v for k, v in dataclasses.asdict(run).items() if k != "cfg"},
        model=repr(run.cfg),
    )
    if tokens_per_second is not None:
        print(
            f"qwen3_moe: loss {loss[0]:.3f} -> {loss[-1]:.3f}; {tokens_per_second:,.0f} tokens/s "
            f"over {timed_steps} steps ({compile_s:.1f} s compile); MFU {100 * utilisation:.1f}% "
            f"of {run.peak_tflops:g} TFLOP/s per device"
        )
    for layer, balance in zip(run.cfg.moe_layers, metrics["max_over_mean_load"], strict=True):
        print(f"  layer {layer}: max/mean tokens per expert {balance:.2f}")
    (out / "metrics.json").write_text(json.dumps(metrics))
    if metrics["step"]:
        plot_demo(metrics, out / "train.png")
    print(f"qwen3_moe: wrote {out / 'metrics.json'} and {out / 'train.png'}")
    return metrics


def main(argv=None) -> dict:
    return train(run_from_flags(build_parser().parse_args(argv)))


if __name__ == "__main__":
    main()
