r"""The layer's expert weights in FP8 once per optimizer step: ``quantize_expert_weights``.

With ``MoEConfig.fp8_recipe`` set, every expert matmul of :func:`jaxmoe.moe` quantizes its
weight (``w_gate``, ``w_up``, ``w_down``) on each call, forward and backward. Under gradient
accumulation the weights are the same for every micro-batch of a step, so the casts can be made
once and reused (TransformerEngine's ``is_first_microbatch``)::

    fp8 = jaxmoe.quantize_expert_weights(params, cfg)   # once, after the update
    for x in micro_batches:                             # or a lax.scan
        grads += jax.grad(loss)(params, x, fp8)         # loss: moe(..., fp8_weights=fp8)

Each entry is :func:`jaxmoe.ops.fp8.quantize_fp8_weights` of ``params["experts"][name]`` cast
to ``cfg.dtype`` (the matmuls' dtype: the layer casts the master weights to it before
quantizing), so the layer with the cache is bit for bit the layer without it. The master
weights still take the gradient; the cache takes none.

Expert parallelism: every quantization block lies inside one expert (see
:mod:`jaxmoe.ops.fp8.weights`), so the cache of all experts, split over ``cfg.ep_axis`` like the
weights, holds on each rank what that rank would quantize from its own experts;
``moe(..., mesh=mesh)`` takes it with ``E`` over ``ep_axis`` and everything else replicated
(with ``fsdp_expert_weights`` the FP8 copy is not FSDP-sharded: the rowwise scales span ``H``).
"""

from __future__ import annotations

from jaxmoe.config import MoEConfig
from jaxmoe.experts import PROJECTION_BIASES
from jaxmoe.ops.fp8 import Fp8Weights, quantize_fp8_weights, resolve_fp8_backend, resolve_recipe
from jaxmoe.ops.fp8.weights import check_fp8_weights

_NEEDS_RECIPE = (
    "{caller}: `{name}` needs MoEConfig.fp8_recipe ('rowwise' or 'blockwise'); got "
    "fp8_recipe=None. Set it, or drop `{name}` (a bf16 layer has no FP8 weights)."
)


def quantize_expert_weights(params, cfg: MoEConfig) -> dict[str, Fp8Weights]:
    """The routed experts' weights of ``params`` in FP8, for ``moe(..., fp8_weights=...)``.

    Args:
      params: the layer's parameters (:func:`jaxmoe.init_params`): ``params["experts"]``
        holds ``w_up``, ``w_down`` and, gated, ``w_gate``, each ``[E, K, N]``.
      cfg: the layer's config; ``cfg.fp8_recipe`` must be set (its recipe, its
        ``grouped_matmul_backend``'s weight layout and ``cfg.dtype`` make the cache).

    Returns:
      ``{name: Fp8Weights}``, one per expert weight matrix (not the biases of
      ``expert_ffn_bias``: they are added in ``cfg.dtype``). Make it after each optimizer update: a
      cache from before it holds the previous step's weights, and the layer cannot tell.

    Raises:
      ValueError: ``cfg.fp8_recipe`` is None.
    """
    if cfg.fp8_recipe is None:
        raise ValueError(_NEEDS_RECIPE.format(caller="quantize_expert_weights", name="cfg"))
    return {
        name: quantize_fp8_weights(
            weight.astype(cfg.dtype), cfg.fp8_recipe, cfg.grouped_matmul_backend
        )
        for name, weight in params["experts"].items()
        if name
        in PROJECTION_BIASES  # the matrices; their biases (expert_ffn_bias) stay as they are
    }


def check_expert_fp8_weights(fp8_weights, params, cfg: MoEConfig) -> None:
    """Raises ValueError, naming the entry of ``fp8_weights``, unless it is what
    :func:`quantize_expert_weights` makes from ``params`` and ``cfg`` (shapes, recipe and layout;
    the values are the caller's promise)."""
    if cfg.fp8_recipe is None:
        raise ValueError(_NEEDS_RECIPE.format(caller="moe", name="fp8_weights"))
    expected = sorted(name for name in params["experts"] if name in PROJECTION_BIASES)
    if not isinstance(fp8_weights, dict) or sorted(fp8_weights) != expected:
        got = sorted(fp8_weights) if isinstance(fp8_weights, dict) else type(fp8_weights).__name__
        raise ValueError(
            f"moe: `fp8_weights` must be a dict with one Fp8Weights per expert weight "
            f"{expected}; got {got}. Make it with jaxmoe.quantize_expert_weights(params, cfg)."
        )
    recipe = resolve_recipe(cfg.fp8_recipe, "moe")
    k_major = resolve_fp8_backend(cfg.grouped_matmul_backend).k_major_weights
    for name in expected:
        check_fp8_weights(
            fp8_weights[name],
            params["experts"][name].shape,
            recipe,
            k_major,
            name=f"fp8_weights[{name!r}]",
            caller="moe",
            fix="Make it with jaxmoe.quantize_expert_weights(params, cfg) from these params.",
        )
