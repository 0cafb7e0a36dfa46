"""``jaxmoe demo --checkpoint-dir DIR --save-every N``: save the run every N steps, resume it.

A demo checkpoint (:mod:`jaxmoe.checkpoint`, one orbax step directory) holds the model and
optimizer state (item ``"state"``, the pure dict of ``nnx.state((model, optimizer))``) and, as
JSON metadata, what the rest of the loop needs to continue exactly where it stopped: the data
sampler's NumPy bit-generator state and the per-step record and metrics so far. A resumed run
therefore draws the same batches and reports the same losses, bitwise, as one that never stopped
(with the same flags: ``--steps`` also sets the learning-rate schedule).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from jaxmoe import checkpoint

METRIC_KEYS = ("step", "val_step", "val_loss")


class DemoCheckpoints:
    """Saves every ``save_every`` steps (and the last) to ``directory``; resumes from the latest."""

    def __init__(self, directory: str, save_every: int):
        if save_every < 1:
            raise ValueError(f"--save-every must be >= 1; got {save_every}.")
        self.directory = directory
        self.save_every = save_every

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
        print(f"jaxmoe demo: resumed from step {step} of {self.directory}")
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
        }
        checkpoint.save(
            self.directory, step, {"state": nnx.to_pure_dict(state)}, metadata=meta, max_to_keep=2
        )
