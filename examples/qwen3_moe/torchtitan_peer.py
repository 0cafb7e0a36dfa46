"""The peer of the ``h200`` preset: the same model trained by torchtitan 0.3.0 on one GPU.

torchtitan's Qwen3 ``30B-A3B`` flavour (``torchtitan.models.qwen3``) with only its layer list cut
to ``--layers`` (the ``h200`` preset's 8), built as torchtitan's trainer builds it (on the meta
device, then ``to_empty`` on the GPU and ``init_states``), and trained by a plain loop that does
what torchtitan's trainer does on one GPU for this model:

- float32 parameters, the forward under ``torch.autocast(bfloat16)``, the loss (cross-entropy of
  float32 logits) outside it;
- AdamW, ``fused`` (torchtitan's default implementation), lr 3e-4, betas (0.9, 0.95), weight decay
  0.1, eps 1e-8; the JAX side's schedule (a linear warmup, then a cosine decay to a tenth);
  gradients clipped to a global norm of 1.0;
- its default attention backend (``flex``: compiled FlexAttention, :func:`causal_block_mask`);
- its MoE as the flavour configures it: softmax top-8 renormalised, ``torch._grouped_mm``
  experts, ``load_balance_coeff=1e-3`` (an expert bias that torchtitan's optimizer hook updates
  between steps; this loop runs no hook, so the bias stays zero and routing is by the scores);
- no activation checkpointing; ``--compile`` compiles each block as torchtitan's
  ``compile.enable`` does.

Synthetic uniform token ids. Tokens/s counts from the end of the first step (which compiles) to
the end of the last, synchronising the GPU at both ends, as ``examples.qwen3_moe.train`` does;
MFU uses ``examples.qwen3_moe.flops`` on the same model shape, so both sides count the same FLOPs.
torchtitan's own ``get_nparams_and_flops`` is recorded beside it as a cross-check.

    python -m examples.qwen3_moe.torchtitan_peer --layers 8 --steps 50 --out tt-bf16
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path

from .flops import H100_BF16_DENSE_TFLOPS, flops_per_token, mfu, parameter_counts
from .presets import PRESETS, build_config

H200 = PRESETS["h200"]


def h200_config(num_layers: int):
    """The ``h200`` preset's :class:`DecoderConfig` with ``num_layers`` layers, all MoE."""
    model = dict(H200.model, num_layers=num_layers, moe_layers=tuple(range(num_layers)))
    return build_config(dataclasses.replace(H200, model=model))


def import_model_registry() -> tuple[object, list[str]]:
    """``(torchtitan.models.qwen3.model_registry, placeholders)``, on an older torch too.

    torchtitan 0.3.0's modules import, at module level, a few names of a newer torch's
    distributed API (``torch.distributed.fsdp.DataParallelMeshDims`` on torch 2.11) for the
    multi-GPU wrappers, which a one-GPU model never calls. Where the installed torch lacks one,
    the name gets a placeholder class and the import is retried; ``placeholders`` lists them
    (recorded in the metrics). Any other import error is raised.
    """
    placeholders: list[str] = []
    for _ in range(16):
        try:
            from torchtitan.models.qwen3 import model_registry

            return model_registry, placeholders
        except ImportError as error:
            missing = re.match(r"cannot import name '(\w+)' from '(torch[\w.]*)'", str(error))
            if not missing:
                raise
            name, module = missing.groups()
            setattr(importlib.import_module(module), name, type(name, (), {}))
            placeholders.append(f"{module}.{name}")
            for loaded in [key for key in sys.modules if key.startswith("torchtitan")]:
                del sys.modules[loaded]
    raise ImportError(f"torchtitan still fails to import after placeholders {placeholders}")


def build_model(num_layers: int, device: str):
    """torchtitan's Qwen3 30B-A3B flavour with its first ``num_layers`` layers, on ``device``."""
    import torch

    model_registry, placeholders = import_model_registry()

    config = model_registry("30B-A3B").model
    config.layers = list(config.layers)[:num_layers]
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_states(buffer_device=torch.device(device))
    return config, model, placeholders


def causal_block_mask(batch_size: int, seq_len: int, device: str):
    """FlexAttention's causal ``BlockMask``: what torchtitan's document mask is for sequences of
    one document each, built with torch's ``create_block_mask`` directly (torchtitan 0.3.0's
    builder passes ``separate_full_blocks``, which torch 2.11 does not take)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(batch, head, query, key):
        return query >= key

    return create_block_mask(causal, batch_size, None, seq_len, seq_len, device=device)


def lr_lambda(warmup_steps: int, total_steps: int):
    """The learning-rate multiplier of ``step``: a linear warmup, then a cosine decay to a tenth
    at ``total_steps`` (``examples.qwen3_moe.step.adamw``'s schedule)."""

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return multiplier


def train(args: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(args.seed)
    device = "cuda"
    cfg = h200_config(args.layers)
    config, model, placeholders = build_model(args.layers, device)
    if args.compile:
        torch._dynamo.config.capture_scalar_outputs = True
        for block in model.layers.values():
            block.compile(fullgraph=True)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=args.learning_rate,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        fused=True,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(args.warmup_steps, args.steps)
    )
    generator = torch.Generator(device="cpu").manual_seed(args.seed)
    masks = causal_block_mask(args.batch_size, args.seq_len, device)

    def step() -> torch.Tensor:
        tokens = torch.randint(
            0, config.vocab_size, (args.batch_size, args.seq_len + 1), generator=generator
        ).to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1], attention_masks=masks)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    tokens_per_step = args.batch_size * args.seq_len
    losses, t0 = [], time.perf_counter()
    losses.append(step())
    torch.cuda.synchronize()
    start = time.perf_counter()
    compile_s = start - t0
    for _ in range(args.steps - 1):
        losses.append(step())
    torch.cuda.synchronize()
    train_s = time.perf_counter() - start
    tokens_per_second = tokens_per_step * (args.steps - 1) / train_s
    counts = parameter_counts(cfg)
    tt_params, tt_flops = config.get_nparams_and_flops(model, args.seq_len)
    metrics = {
        "impl": "torchtitan" + ("-compile" if args.compile else ""),
        "loss": [float(x) for x in losses],
        "tokens_per_step": tokens_per_step,
        "timed_steps": args.steps - 1,
        "compile_seconds": compile_s,
        "train_seconds": train_s,
        "tokens_per_second": tokens_per_second,
        "parameters": counts,
        "parameters_torchtitan": sum(p.numel() for p in model.parameters()),
        "flops_per_token": flops_per_token(cfg, args.seq_len),
        "flops_per_token_torchtitan": tt_flops,
        "nparams_torchtitan": tt_params,
        "mfu": mfu(tokens_per_second, cfg, args.seq_len, args.peak_tflops),
        "peak_tflops": args.peak_tflops,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "torch_placeholders": placeholders,
        "torch": torch.__version__,
        "run": vars(args),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics))
    print(
        f"torchtitan_peer: loss {metrics['loss'][0]:.3f} -> {metrics['loss'][-1]:.3f}; "
        f"{tokens_per_second:,.0f} tokens/s over {args.steps - 1} steps ({compile_s:.1f} s first "
        f"step); MFU {100 * metrics['mfu']:.1f}%; "
        f"peak {metrics['peak_memory_bytes'] / 2**30:.1f} GiB"
    )
    return metrics


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=H200.model["num_layers"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=H200.batch_size)
    parser.add_argument("--seq-len", type=int, default=H200.seq_len)
    parser.add_argument("--learning-rate", type=float, default=H200.learning_rate)
    parser.add_argument("--warmup-steps", type=int, default=H200.warmup_steps)
    parser.add_argument("--compile", action="store_true", help="torch.compile each block")
    parser.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="torchtitan-run")
    return parser


def main(argv=None) -> dict:
    # This process is torch's: JAX (imported for the model's shape) must not claim the GPU.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    args = build_parser().parse_args(argv)
    if args.steps < 2:
        build_parser().error("--steps: at least 2 (the first step compiles and is not timed)")
    return train(args)


if __name__ == "__main__":
    main()
