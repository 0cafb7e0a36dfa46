"""Correctness of the sharded layer: every exchange against the one-device layer, in float32
(output, every gradient and the stats)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe.bench.harness import first_devices_mesh, relative_error

# Largest relative error that counts as a match (float32, highest matmul precision).
TOLERANCE = 1e-4
DEFAULT_FAST_SLOT_FACTOR = jaxmoe.MoEConfig.ep_fast_slot_factor  # the field's default


def correctness_label(impl: str, ep_dispatch: str, fast_slot_factor: float) -> str:
    """A correctness row's ``impl``: the exchange, and each setting that is not the layer's
    default (two rows that differ only in a setting would otherwise read the same)."""
    settings = [f"dispatch={ep_dispatch}"] if ep_dispatch != "copies" else []
    if fast_slot_factor != DEFAULT_FAST_SLOT_FACTOR:
        settings.append(f"fast_slot_factor={fast_slot_factor:g}")
    return f"{impl} ({', '.join(settings)})" if settings else impl


def check_correctness(
    ep: int,
    impl: str,
    *,
    tiny: bool = False,
    seed: int = 0,
    fast_slot_factor: float = DEFAULT_FAST_SLOT_FACTOR,
    ep_dispatch: str = "copies",
) -> dict[str, Any]:
    """Relative errors of the sharded layer against one device (float32, highest precision).

    ``fast_slot_factor`` sizes the dropless slots (the library default; 1.0 makes random
    routing overflow into later windows, which this check then covers too); ``ep_dispatch``
    is the layer's (``"tokens"``: one row per token and destination rank)."""

    hidden, ffn, tokens = (32, 64, 32) if tiny else (256, 512, 256)
    base = jaxmoe.MoEConfig(
        num_experts=2 * ep,
        top_k=2,
        hidden_size=hidden,
        ffn_size=ffn,
        aux_loss_coef=0.01,
        z_loss_coef=0.001,
        seq_aux_loss_coef=0.01,
    )
    cfg = dataclasses.replace(
        base,
        ep_axis="ep",
        ep_exchange=impl,
        ep_fast_slot_factor=fast_slot_factor,
        ep_dispatch=ep_dispatch,
    )
    mesh = first_devices_mesh(ep)
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    params = jaxmoe.init_params(k1, base)
    x = jax.random.normal(k2, (ep * 2, tokens // 2, hidden), jnp.float32)
    cotangent = jax.random.normal(k3, x.shape, jnp.float32)

    def loss(params, x, sharded):
        y, stats = jaxmoe.moe(params, x, cfg if sharded else base, mesh=mesh if sharded else None)
        return jnp.sum(y * cotangent) + stats.aux_loss, (y, stats)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
    with jax.default_matmul_precision("highest"):
        (g_ref, (y_ref, s_ref)) = grad(params, x, False)
        (g_ep, (y_ep, s_ep)) = grad(params, x, True)
    grad_errs = jax.tree.leaves(jax.tree.map(relative_error, g_ep, g_ref))
    # overflow_tokens describes the sharded path's transport (0 on one device), not the result.
    stat_errs = [
        relative_error(getattr(s_ep, name), getattr(s_ref, name))
        for name in s_ref._fields
        if name != "overflow_tokens"
    ]
    row = {
        "case": "correctness",
        "ep": ep,
        "impl": correctness_label(impl, ep_dispatch, fast_slot_factor),
        "fast_slot_factor": fast_slot_factor,
        "rel_err_y": relative_error(y_ep, y_ref),
        "max_rel_err_grad": max(grad_errs),
        "max_rel_err_stats": max(stat_errs),
        "overflow_tokens": int(s_ep.overflow_tokens),
    }
    row["max_rel_err"] = max(row["rel_err_y"], row["max_rel_err_grad"], row["max_rel_err_stats"])
    row["ok"] = row["max_rel_err"] < TOLERANCE
    return row
