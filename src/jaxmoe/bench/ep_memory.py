"""``jaxmoe bench ep-memory``: the temporaries XLA plans for the dropless expert-parallel layer
(``memory_analysis`` of the compiled forward and training step, nothing executed), against the
layer with fast slots alone (``ep_receive_factor=1.125``) and with worst-case slots
(``ep_fast_slot_factor=None``). ``tests/test_memory.py`` bounds the same case.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe.bench.harness import first_devices_mesh

PASSES = ("fwd", "fwd+bwd")
# A small layer whose temporaries the exchange's receive space dominates.
SHAPE = {"tokens_per_rank": 64, "H": 64, "F": 64, "E": 32, "K": 8}
COLUMNS = (("variant", "variant", ""), ("pass", "pass", ""), ("temp_mb", "temp MB", "{:.2f}"))
HEADER_FACTS = {"measure": "XLA memory_analysis().temp_size_in_bytes of the compiled function"}


def variants(cfg: jaxmoe.MoEConfig) -> dict[str, jaxmoe.MoEConfig]:
    return {
        "dropless (default)": cfg,
        "fast slots alone (ep_receive_factor=1.125)": dataclasses.replace(
            cfg, ep_receive_factor=1.125
        ),
        "worst-case slots (ep_fast_slot_factor=None)": dataclasses.replace(
            cfg, ep_fast_slot_factor=None
        ),
    }


def run_ep_memory(
    ep: int,
    passes: Sequence[str] = PASSES,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """One row per (variant, pass) on a mesh of the first ``ep`` devices: ``temp_mb``, the
    temporaries of ``jit(moe)`` (``fwd``) or of ``jit(grad)`` over params and input
    (``fwd+bwd``)."""
    mesh = first_devices_mesh(ep)
    cfg = jaxmoe.MoEConfig(
        SHAPE["E"], SHAPE["K"], SHAPE["H"], SHAPE["F"], ep_axis="ep", alignment=1
    )
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jnp.ones((ep * SHAPE["tokens_per_rank"], SHAPE["H"]), jnp.float32)
    rows = []
    for name, variant in variants(cfg).items():
        for pass_ in passes:

            def loss(p, x, c=variant):
                return jnp.sum(jaxmoe.moe(p, x, c, mesh=mesh)[0])

            fn = jax.grad(loss, argnums=(0, 1)) if pass_ == "fwd+bwd" else loss
            memory = jax.jit(fn).lower(params, x).compile().memory_analysis()
            rows.append({"variant": name, "pass": pass_, "ep": ep,
                         "temp_mb": memory.temp_size_in_bytes / 1e6})  # fmt: skip
            on_row(rows[-1])
    return rows
