"""``jaxmoe demo --checkpoint-dir DIR --save-every N``: save the run every N steps, resume it.

A demo checkpoint (:mod:`jaxmoe.checkpoint`, one orbax step directory) holds the model and
optimizer state (item ``"state"``, the pure dict of ``nnx.state((model, optimizer))``) and, as
JSON metadata, what the rest of the loop needs to continue exactly where it stopped: the data
sampler's NumPy bit-generator state and the per-step record and metrics so far. A resumed run
therefore draws the same batches and reports the same losses, bitwise, as one that never stopped
(with the same flags: ``--steps`` also sets the learning-rate schedule). The metadata also holds
the run's flags (``"config"``, the ``DemoConfig`` fields), so that a run resumed with other flags
is refused before any work (:func:`jaxmoe.cli.demo.check_resume`).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from jaxmoe import checkpoint

METRIC_KEYS = ("step", "val_step", "val_loss")
# The demo flag that sets each field of DemoConfig (fields without one: sizes the demo picks).
DEMO_FLAGS = {
    "steps": "--steps",
    "num_experts": "--experts",
    "top_k": "--top-k",
    "score": "--score",
    "aux_loss": "--aux-loss",
    "expert_bias_rate": "--expert-bias-rate",
    "devices": "--devices",
    "seed": "--seed",
    "out": "--out",
    "fp8": "--fp8",
    "fp8_wgrad": "--fp8-wgrad",
    "checkpoint_dir": "--checkpoint-dir",
    "save_every": "--save-every",
    "sample_chars": "--sample-chars",
}
# What a resumed run may change: where it writes, how often it saves, the devices it runs on (a
# checkpoint restores onto any mesh), and --steps (it trains on to the new count, saying so).
RESUMABLE = ("steps", "devices", "out", "checkpoint_dir", "save_every", "sample_chars")


def saved_run(directory: str) -> tuple[int, dict | None]:
    """The latest step in ``directory`` (0: none) and the flags its run saved (the
    ``DemoConfig`` fields; None: no checkpoint, or one saved before checkpoints held them)."""
    step = checkpoint.latest_step(directory)
    if step is None:
        return 0, None
    saved = checkpoint.restore_metadata(directory, step=step) or {}
    return step, saved.get("config")


def check_resume(cfg) -> int:
    """The step the checkpoint in ``cfg.checkpoint_dir`` holds (``cfg``: a ``DemoConfig``; 0:
    no checkpoint, or no directory).

    Raises ValueError naming every flag whose value differs from the one the checkpoint's run
    was saved with, except those of :data:`RESUMABLE` (restoring would fail on another shape,
    or silently continue another run's training)."""
    if not cfg.checkpoint_dir:
        return 0
    step, saved = saved_run(cfg.checkpoint_dir)
    if saved is None:  # nothing saved, or saved before checkpoints held their flags
        return step
    current = dataclasses.asdict(cfg)
    differ = [
        field
        for field, value in current.items()
        if field not in RESUMABLE
        and field in saved
        and saved[field] != value
        # Without --fp8 the weight gradients' precision sets nothing.
        and not (field == "fp8_wgrad" and current["fp8"] is None)
    ]
    if differ:
        described = ", ".join(
            f"{DEMO_FLAGS.get(field, field)} {saved[field]} (this run: {current[field]})"
            for field in differ
        )
        raise ValueError(
            f"argument --checkpoint-dir: {cfg.checkpoint_dir} holds step {step} of a run with "
            f"other flags: {described}. Resume with the checkpoint's flags, or give another "
            "--checkpoint-dir."
        )
    return step


class DemoCheckpoints:
    """Saves every ``save_every`` steps (and the last) to ``directory``, with the run's flags
    ``config`` (the ``DemoConfig`` fields); resumes from the latest."""

    def __init__(self, directory: str, save_every: int, config: dict | None = None):
        if save_every < 1:
            raise ValueError(f"--save-every must be >= 1; got {save_every}.")
        self.directory = directory
        self.save_every = save_every
        self.config = config or {}

    def resume(self, state, rng: np.random.Generator, record: dict, metrics: dict):
        """Loads the latest checkpoint into ``state`` / ``rng`` / ``record`` / ``metrics``.

        Returns ``(state, first_step)``: the step to run next (1 without a checkpoint).
        ``metrics["resumed_from_step"]`` says which step was loaded (0: none).
        """
        step = checkpoint.latest_step(self.directory)
        metrics["resumed_from_step"] = step or 0
        if step is None:
            return state, 1
        pure = nnx.to_pure_dict(state)
        restored = checkpoint.restore(
            self.directory, {"state": checkpoint.abstract_like(pure)}, step=step
        )
        nnx.replace_by_pure_dict(state, restored["state"])
        saved = checkpoint.restore_metadata(self.directory, step=step)
        rng.bit_generator.state = saved["rng"]
        for key in record:
            record[key][:] = saved["record"][key]
        for key in METRIC_KEYS:
            metrics[key][:] = saved["metrics"][key]
        steps, saved_steps = self.config.get("steps"), (saved.get("config") or {}).get("steps")
        more = ""
        if steps is not None and saved_steps is not None and steps != saved_steps:
            more = (
                f", training on to --steps {steps} (the checkpoint's run had --steps "
                f"{saved_steps}; the learning-rate schedule now spans {steps} steps)"
            )
        print(f"jaxmoe demo: resumed from step {step} of {self.directory}{more}")
        return state, step + 1

    def maybe_save(
        self, step: int, last_step: int, state, rng: np.random.Generator, record, metrics
    ) -> None:
        """Saves after ``step`` when it is a multiple of ``save_every`` or the last step."""
        if step % self.save_every and step != last_step:
            return
        host_record = jax.device_get(record)
        meta = {
            "rng": rng.bit_generator.state,
            # Exact: float32 -> Python float -> JSON repr round-trips bit for bit.
            "record": {k: [np.asarray(v).tolist() for v in vs] for k, vs in host_record.items()},
            "metrics": {k: metrics[k] for k in METRIC_KEYS},
            "config": self.config,
        }
        checkpoint.save(
            self.directory, step, {"state": nnx.to_pure_dict(state)}, metadata=meta, max_to_keep=2
        )
