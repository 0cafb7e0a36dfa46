"""The names each name option of :class:`~jaxmoe.MoEConfig` accepts.

One home below ``config.py``, ``ops`` and ``parallel``: the config checks names against these
tuples on construction without importing the registries (``jaxmoe.parallel`` imports the config,
so the config importing it back would be a loop), and each registry checks on import that it
implements exactly the names listed here (:func:`check_registry`).
"""

from __future__ import annotations

from collections.abc import Iterable

SCORES = ("softmax", "sigmoid", "sqrtsoftplus")
ACTIVATIONS = ("swiglu", "geglu", "swiglu_clamped", "gelu", "relu")
# "swiglu_clamped": gpt-oss's gated activation (``MoEConfig.swiglu_alpha``, ``swiglu_limit``).
GATED_ACTIVATIONS = ("swiglu", "geglu", "swiglu_clamped")
# ``jaxmoe.ops.grouped_matmul.api``: "auto" (the platform's best) and one name per backend.
GROUPED_MATMUL_BACKENDS = ("auto", "reference", "xla", "pallas", "pallas_triton")
# ``jaxmoe.ops.fp8.recipe``: the FP8 scaling recipes of the expert matmuls.
FP8_RECIPES = ("rowwise", "blockwise")
# ``jaxmoe.ops.fp8.recipe``: the precisions of an FP8 recipe's weight gradient.
FP8_WGRAD_PRECISIONS = ("auto", "high", "fp8")
# ``jaxmoe.parallel.exchange``: one name per exchange implementation.
EP_EXCHANGES = ("all_to_all", "all_to_all_chunked", "all_gather", "ragged_all_to_all")
# ``jaxmoe.parallel.dispatch``: what an expert-parallel exchange row holds (one per (token,
# expert) copy, or one per (token, destination rank) pair: ``jaxmoe.parallel.token_dispatch``).
EP_DISPATCHES = ("auto", "copies", "tokens")
# ``jaxmoe.capacity``: which copies a capacity drops first.
CAPACITY_DROP_POLICIES = ("position", "probs")


def check_registry(listed_as: str, listed: tuple[str, ...], implemented: Iterable[str]) -> None:
    """Raises RuntimeError on import when a registry and the names listed here drift apart."""
    implemented = tuple(implemented)
    if implemented != listed:
        raise RuntimeError(
            f"jaxmoe.option_names.{listed_as} is {listed} but the registry implements "
            f"{implemented}; "
            "MoEConfig validates names against jaxmoe.option_names, so update both together."
        )
