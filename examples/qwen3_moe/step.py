"""The training step: the model and AdamW as one ``nnx.State``, laid out on a mesh, and one
jitted step that updates it in place.

``jaxmoe demo``'s step (:func:`jaxmoe.cli.demo.make_train_step`) computes the same loss but
does not donate its input state: the old and the new parameters and Adam moments would be
alive together at the end of every step, twice the 90 GB of the ``h200`` preset. This one
donates it, so XLA writes the update over the old buffers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxmoe.cli.demo import state_shardings

from .config import DecoderConfig
from .model import Qwen3MoE


def adamw(learning_rate: float, warmup_steps: int, steps: int) -> optax.GradientTransformation:
    """AdamW (b1 0.9, b2 0.95, weight decay 0.1) after global-norm clipping at 1.0, with a
    linear warmup to ``learning_rate`` then a cosine decay to a tenth of it at ``steps``."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        learning_rate,
        min(warmup_steps, steps),
        max(steps, warmup_steps + 1),
        end_value=0.1 * learning_rate,
    )
    return optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1)
    )


def init_state(cfg: DecoderConfig, tx, seed: int, mesh=None):
    """``(graphdef, state, shardings)``: a new model and its optimizer as one ``nnx.State``.

    With ``mesh``, ``shardings`` places every parameter and its Adam moments by their logical
    axes under jaxmoe's rules (:func:`jaxmoe.parallel.logical_axis_rules`: experts over
    ``ep_axis``, ``embed`` over ``data_axes`` with ``fsdp_expert_weights``, the rest
    replicated) and ``state`` is laid out so; without one, ``shardings`` is None.
    """
    model = Qwen3MoE(cfg, rngs=nnx.Rngs(seed), mesh=mesh)
    graphdef, state = nnx.split((model, nnx.Optimizer(model, tx, wrt=nnx.Param)))
    if mesh is None:
        return graphdef, state, None
    shardings = state_shardings(state, mesh, cfg.moe)
    return graphdef, jax.device_put(state, shardings), shardings


def next_token_loss(model: Qwen3MoE, tokens: jax.Array):
    """Mean next-token cross-entropy of ``tokens`` ``[B, S + 1]`` plus the MoE layers'
    ``aux_loss``: ``(total, (cross_entropy, aux_loss, stats))``."""
    logits, stats = model(tokens[:, :-1])
    with jax.named_scope("lm_head"):
        cross_entropy = optax.softmax_cross_entropy_with_integer_labels(
            logits, tokens[:, 1:]
        ).mean()
    aux = jnp.sum(stats.aux_loss)
    return cross_entropy + aux, (cross_entropy, aux, stats)


def make_train_step(graphdef, shardings=None):
    """A jitted ``(state, tokens) -> (state, cross_entropy, aux_loss, tokens_per_expert
    [MoE layers, E], dropped)`` that donates ``state`` (do not read the one passed in
    afterwards). ``shardings``: the state comes back laid out as it went in, so the step
    compiles once."""

    def train_step(state, tokens):
        model, optimizer = nnx.merge(graphdef, state)
        grads, (ce, aux, stats) = nnx.grad(next_token_loss, has_aux=True)(model, tokens)
        with jax.named_scope("optimizer"):
            optimizer.update(model, grads)
        new_state = nnx.state((model, optimizer))
        if shardings is not None:
            new_state = jax.lax.with_sharding_constraint(new_state, shardings)
        return new_state, ce, aux, stats.tokens_per_expert, jnp.sum(stats.dropped_tokens)

    return jax.jit(train_step, donate_argnums=0)
