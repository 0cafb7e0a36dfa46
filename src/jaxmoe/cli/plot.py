"""The demo's figure, ``demo.png``: the loss curve, expert imbalance, and expert load per layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def expert_balance(tokens_per_expert: np.ndarray) -> np.ndarray:
    """Max over mean load per layer (1.0 = perfectly balanced): ``[..., E] -> [...]``."""
    counts = tokens_per_expert.astype(np.float64)
    return counts.max(-1) / np.maximum(counts.mean(-1), 1e-9)


def plot_demo(metrics: dict, path: Path) -> None:
    """``demo.png``: the loss curve, max/mean load per layer, and a load heatmap per layer."""
    # matplotlib is slow to import and only needed here; Agg draws without a display.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array(metrics["step"])
    loss = np.array(metrics["loss"])
    load = np.array(metrics["tokens_per_expert"], dtype=np.float64)  # [steps, L, E]
    num_layers, num_experts = load.shape[1], load.shape[2]
    share = load / np.maximum(load.sum(-1, keepdims=True), 1)  # fraction of assignments

    fig = plt.figure(figsize=(11, 3.2 + 2.2 * num_layers), layout="constrained")
    grid = fig.add_gridspec(1 + num_layers, 2, height_ratios=[1.4] + [1.0] * num_layers)
    ax = fig.add_subplot(grid[0, 0])
    ax.plot(steps, loss, color="0.75", lw=0.8, label="train (per step)")
    window = max(1, len(loss) // 30)
    if len(loss) >= window > 1:
        smooth = np.convolve(loss, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, color="C0", lw=2, label=f"train ({window}-step mean)")
    if metrics.get("val_step"):
        ax.plot(metrics["val_step"], metrics["val_loss"], "o-", color="C3", label="validation")
    ax.set(xlabel="step", ylabel="cross-entropy (nats/char)", title="Loss")
    ax.grid(alpha=0.3)
    ax.legend()

    ax = fig.add_subplot(grid[0, 1])
    for layer in range(num_layers):
        balance = expert_balance(load[:, layer])
        ax.plot(steps, balance, lw=1.2, label=f"layer {layer}")
    ax.axhline(1.0, color="k", ls="--", lw=0.8, label="perfect balance")
    ax.set(
        xlabel="step",
        ylabel="max / mean tokens per expert",
        title="Expert imbalance (lower is better)",
    )
    ax.grid(alpha=0.3)
    ax.legend()

    vmax = max(2.0 / num_experts, float(share.max()))
    for layer in range(num_layers):
        ax = fig.add_subplot(grid[1 + layer, :])
        image = ax.imshow(
            share[:, layer].T,
            aspect="auto",
            interpolation="nearest",
            cmap="viridis",
            vmin=0.0,
            vmax=vmax,
            extent=(steps[0] - 0.5, steps[-1] + 0.5, num_experts - 0.5, -0.5),
        )
        ax.set(
            ylabel="expert",
            title=f"Layer {layer}: share of token assignments per expert "
            f"(balanced = 1/{num_experts} = {1 / num_experts:.3f})",
        )
        ax.set_yticks(range(num_experts))
        if layer == num_layers - 1:
            ax.set_xlabel("step")
        fig.colorbar(image, ax=ax, label="share", pad=0.01)
    fig.suptitle(metrics["title"])
    fig.savefig(path, dpi=110)
    plt.close(fig)
