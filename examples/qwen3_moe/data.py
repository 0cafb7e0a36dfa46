"""Training batches: random windows of the bundled tiny-Shakespeare corpus as character ids
(``jaxmoe demo``'s corpus and codec), or uniformly random token ids (for throughput: nothing
to learn, the loss settles at ``log V``)."""

from __future__ import annotations

import numpy as np

from jaxmoe.cli.demo import CharCodec, load_corpus

DATA_SOURCES = ("corpus", "synthetic")


class Batches:
    """``next()`` gives ``[batch, seq_len + 1]`` int32 ids: inputs and their next-token targets.

    Draws from ``rng`` (a NumPy generator), whose state a checkpoint saves, so a resumed run
    draws the batches the uninterrupted one would have.
    """

    def __init__(self, source: str, vocab_size: int, batch: int, seq_len: int, rng):
        if source not in DATA_SOURCES:
            raise ValueError(f"--data must be one of {DATA_SOURCES}; got {source!r}.")
        self.source, self.vocab_size = source, vocab_size
        self.shape = (batch, seq_len + 1)
        self.rng = rng
        if source == "corpus":
            text = load_corpus()
            codec = CharCodec(text)
            if len(codec.chars) > vocab_size:
                raise ValueError(
                    f"--data corpus has {len(codec.chars)} distinct characters but the model's "
                    f"vocabulary is {vocab_size}; pick a preset with a larger vocab_size or "
                    "--data synthetic."
                )
            self.ids = codec.encode(text)
            if len(self.ids) <= self.shape[1]:
                raise ValueError(
                    f"--seq-len {seq_len} is longer than the corpus ({len(self.ids)} characters)."
                )

    def next(self) -> np.ndarray:
        if self.source == "synthetic":
            return self.rng.integers(0, self.vocab_size, self.shape, dtype=np.int32)
        batch, window = self.shape
        starts = self.rng.integers(0, len(self.ids) - window, batch)
        return np.stack([self.ids[s : s + window] for s in starts]).astype(np.int32)
