"""The MoE families of transformers checkpoints: their ``config.json`` as a ``MoEConfig``, which
decoder layers are MoE, and the checkpoint key of every tensor of the block.

Each family is one :class:`Family` entry in ``FAMILIES`` (keyed by ``config.json``'s
``model_type``): a function that turns the config into ``MoEConfig`` fields (refusing what jaxmoe
cannot express exactly), a function that says whether layer ``i`` is MoE, and the key names.

Routing of each supported family, as transformers computes it (all in float32):

* Mixtral, Qwen3-MoE, OLMoE: ``p = softmax(logits)``; ``experts = top_k(p)``;
  ``weights = p[experts]``, divided by their sum (Mixtral always; Qwen3-MoE / OLMoE when
  ``norm_topk_prob``). jaxmoe: ``score="softmax", pre_softmax=True``.
* DeepSeek-V3, GLM-4.5-MoE: ``s = sigmoid(logits)``; selection ``s + e_score_correction_bias``;
  a group's score is the sum of its top-2 selection scores, the ``topk_group`` best of ``n_group``
  groups are eligible (the others masked to -inf); ``weights = s[experts]`` divided by
  ``sum + 1e-20`` when ``norm_topk_prob``, then times ``routed_scaling_factor``; plus the shared
  experts (width ``moe_intermediate_size * n_shared_experts``). jaxmoe: ``score="sigmoid"``,
  ``use_expert_bias``, ``num_groups``/``group_top_k`` (its group score sums the top
  ``top_k // group_top_k``, so the family's top-2 needs ``top_k == 2 * topk_group``).
* Qwen2-MoE: Qwen3-MoE's routing, plus one shared expert (width
  ``shared_expert_intermediate_size``) whose output is scaled per token by
  ``sigmoid(x @ shared_expert_gate)``. jaxmoe: ``shared_expert_gate``.
* gpt-oss: ``logits = x @ W + b``; ``experts = top_k(logits)``; ``weights = softmax`` over the
  K chosen logits. Its experts carry biases and compute the clamped SwiGLU
  ``(clip(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``, ``g = min(gate, limit)``. jaxmoe:
  ``pre_softmax=False``, ``router_bias``, ``expert_ffn_bias``, ``activation="swiglu_clamped"``.
* DeepSeek-V2 (``topk_method="greedy"``): ``p = softmax(logits)``; ``experts = top_k(p)``;
  ``weights = p[experts] * routed_scaling_factor``, never normalised; plus the shared experts.
  Its ``group_limited_greedy`` scores a group by its single best expert (not the top-2 sum) and is
  refused unless every group is kept.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from jaxmoe.config import SWIGLU_ALPHA, SWIGLU_LIMIT, MoEConfig
from jaxmoe.hf.fused import gpt_oss_experts

# Every routed-expert and shared-expert weight of the families below is an ``nn.Linear`` weight,
# stored ``[out, in]``; jaxmoe keeps ``[in, out]`` (``x @ w``).
_GATE_UP_DOWN = {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}
_MIXTRAL_NAMES = {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}


@dataclasses.dataclass(frozen=True)
class Family:
    """How one transformers ``model_type`` stores and routes its MoE block.

    Attributes:
      name: the family's name in messages and docs.
      config_fields: ``hf_config -> dict`` of ``MoEConfig`` fields; raises ValueError for an
        option jaxmoe cannot express exactly.
      is_moe_layer: ``(hf_config, layer) -> bool``.
      block: the block's key prefix, with ``{layer}``.
      expert_names: jaxmoe expert weight name -> the checkpoint's projection name.
      router: the router weight's key under ``block`` (``[E, H]``).
      router_bias: the router bias's key under ``block`` (``[E]``), or None.
      expert_bias: the selection bias's key under ``block`` (``[E]``), or None.
      shared: the shared experts' module under ``block``, or None.
      shared_gate: the shared expert's output gate's key under ``block`` (``[1, H]``), or None.
      fused_experts: the experts are gpt-oss's stacked tensors (:mod:`jaxmoe.hf.fused`), not
        one tensor per expert (``expert_names`` is then unused).
      quantizations: the ``quantization_config.quant_method`` values the family loads.
    """

    name: str
    config_fields: Callable[[Mapping], dict]
    is_moe_layer: Callable[[Mapping, int], bool]
    block: str = "model.layers.{layer}.mlp"
    expert_names: Mapping[str, str] = dataclasses.field(default_factory=lambda: _GATE_UP_DOWN)
    router: str = "gate.weight"
    router_bias: str | None = None
    expert_bias: str | None = None
    shared: str | None = None
    shared_gate: str | None = None
    fused_experts: bool = False
    quantizations: tuple[str, ...] = ()

    def prefix(self, layer: int) -> str:
        return self.block.format(layer=layer)

    def mxfp4_key(self, layer: int) -> str | None:
        """A key present only when the layer's experts are stored in MXFP4 (None: never)."""
        return f"{self.prefix(layer)}.experts.gate_up_proj_blocks" if self.fused_experts else None

    def keys(self, cfg: MoEConfig, layer: int, mxfp4: bool = False) -> dict:
        """The checkpoint key of every jaxmoe parameter, in the tree of ``param_shapes(cfg)``:
        ``experts`` leaves are lists of ``E`` keys (one tensor per expert), or
        :class:`jaxmoe.hf.fused.FusedExpertTensor` for stacked experts (``mxfp4``: their
        weights stored in MXFP4)."""
        prefix = self.prefix(layer)
        names = {k: v for k, v in self.expert_names.items() if k != "w_gate" or cfg.gated}
        if self.fused_experts:
            experts = gpt_oss_experts(prefix, mxfp4)
        else:
            experts = {
                param: [f"{prefix}.experts.{e}.{name}.weight" for e in range(cfg.num_experts)]
                for param, name in names.items()
            }
        keys = {"router": {"kernel": f"{prefix}.{self.router}"}, "experts": experts}
        if cfg.router_bias:
            keys["router"]["bias"] = f"{prefix}.{self.router_bias}"
        if cfg.use_expert_bias:
            keys["expert_bias"] = f"{prefix}.{self.expert_bias}"
        if cfg.num_shared_experts:
            keys["shared"] = {
                param: f"{prefix}.{self.shared}.{name}.weight" for param, name in names.items()
            }
            if cfg.shared_expert_gate:
                keys["shared"]["output_gate"] = f"{prefix}.{self.shared_gate}"
        return keys


def _refuse(family: str, option: str, value: Any, reason: str) -> None:
    raise ValueError(
        f"jaxmoe.hf: {family} with {option}={value!r} is not supported: {reason}. "
        "jaxmoe loads only what it computes exactly as transformers does."
    )


def _require(hf: Mapping, family: str, option: str, allowed: tuple, reason: str) -> None:
    if hf.get(option) not in allowed:
        _refuse(family, option, hf.get(option), reason)


def _field(hf: Mapping, family: str, *names: str) -> Any:
    """The first of ``names`` that ``config.json`` sets (families rename fields)."""
    for name in names:
        if hf.get(name) is not None:
            return hf[name]
    raise ValueError(
        f"jaxmoe.hf: the {family} config.json has none of {names}; it is not a complete "
        "config of this family. Pass the checkpoint's own config.json."
    )


def _swiglu(hf: Mapping, family: str) -> str:
    _require(
        hf,
        family,
        "hidden_act",
        ("silu", "swish"),
        "jaxmoe's gated experts are silu(x @ w_gate) * (x @ w_up) (swiglu) or geglu with the tanh "
        "GELU; other hidden_act values have no exact jaxmoe activation",
    )
    return "swiglu"


# Hub configs name the expert count ``num_experts``; transformers v5 writes ``num_local_experts``.
_NUM_EXPERTS = ("num_experts", "num_local_experts")


def _softmax_top_k(
    hf: Mapping, family: str, num_experts: tuple[str, ...], ffn: str, normalize
) -> dict:
    """Softmax over all experts, top-k of the probabilities, optionally renormalised."""
    return {
        "num_experts": _field(hf, family, *num_experts),
        "top_k": _field(hf, family, "num_experts_per_tok"),
        "hidden_size": _field(hf, family, "hidden_size"),
        "ffn_size": _field(hf, family, ffn),
        "activation": _swiglu(hf, family),
        "score": "softmax",
        "pre_softmax": True,
        "normalize_weights": bool(normalize),
    }


def _mixtral(hf: Mapping) -> dict:
    _require(
        hf,
        "Mixtral",
        "router_jitter_noise",
        (None, 0, 0.0),
        "jaxmoe's router has no multiplicative input jitter (transformers applies it in training)",
    )
    return _softmax_top_k(hf, "Mixtral", ("num_local_experts",), "intermediate_size", True)


def _qwen3_moe(hf: Mapping) -> dict:
    return _softmax_top_k(
        hf, "Qwen3-MoE", _NUM_EXPERTS, "moe_intermediate_size", hf.get("norm_topk_prob", False)
    )


def _olmoe(hf: Mapping) -> dict:
    return _softmax_top_k(
        hf, "OLMoE", _NUM_EXPERTS, "intermediate_size", hf.get("norm_topk_prob", False)
    )


def _qwen2_moe(hf: Mapping) -> dict:
    family = "Qwen2-MoE"
    shared = _field(hf, family, "shared_expert_intermediate_size")
    if not isinstance(shared, int) or shared <= 0:
        _refuse(
            family,
            "shared_expert_intermediate_size",
            shared,
            "the family always has its gated shared expert; jaxmoe's shared expert needs a "
            "width >= 1",
        )
    fields = _softmax_top_k(
        hf, family, _NUM_EXPERTS, "moe_intermediate_size", hf.get("norm_topk_prob", False)
    )
    return {
        **fields,
        "num_shared_experts": 1,
        "shared_ffn_size": shared,
        "shared_expert_gate": True,
    }


def _gpt_oss(hf: Mapping) -> dict:
    """gpt-oss's block (module docstring). Its ``hidden_act`` is not read: transformers' gpt-oss
    experts always compute the clamped SwiGLU. Its sliding-window attention is not the MoE
    block's concern."""
    family = "gpt-oss"
    return {
        "num_experts": _field(hf, family, "num_local_experts", "num_experts"),
        "top_k": _field(hf, family, "num_experts_per_tok", "experts_per_token"),
        "hidden_size": _field(hf, family, "hidden_size"),
        "ffn_size": _field(hf, family, "intermediate_size"),
        "activation": "swiglu_clamped",
        "swiglu_alpha": float(hf.get("swiglu_alpha", SWIGLU_ALPHA)),
        "swiglu_limit": float(hf.get("swiglu_limit", SWIGLU_LIMIT)),
        "score": "softmax",
        "pre_softmax": False,
        "normalize_weights": False,
        "router_bias": True,
        "expert_ffn_bias": True,
    }


def _shared_experts(hf: Mapping, family: str) -> dict:
    count = hf.get("n_shared_experts") or 0
    ffn = _field(hf, family, "moe_intermediate_size")
    return {"num_shared_experts": count, "shared_ffn_size": ffn * count if count else None}


def _sigmoid_grouped(hf: Mapping, family: str) -> dict:
    """DeepSeek-V3 / GLM-4.5-MoE routing (module docstring)."""
    _require(
        hf,
        family,
        "scoring_func",
        (None, "sigmoid"),
        "transformers' DeepSeek-V3 router always uses sigmoid scores",
    )
    _require(
        hf,
        family,
        "topk_method",
        (None, "noaux_tc"),
        "transformers' DeepSeek-V3 router always uses the bias-corrected group-limited top-k",
    )
    _require(
        hf,
        family,
        "moe_layer_freq",
        (None, 1),
        "transformers makes every layer from first_k_dense_replace on an MoE layer, the original "
        "model only every moe_layer_freq-th: the two disagree",
    )
    num_experts = _field(hf, family, "n_routed_experts")
    top_k = _field(hf, family, "num_experts_per_tok")
    num_groups = hf.get("n_group") or 1
    group_top_k = hf.get("topk_group") or num_groups
    if group_top_k < num_groups and top_k != 2 * group_top_k:
        _refuse(
            family,
            "num_experts_per_tok / topk_group",
            f"{top_k} / {group_top_k}",
            "the family scores a group by the sum of its top-2 experts; jaxmoe sums the top "
            "top_k // group_top_k, which is 2 only when num_experts_per_tok == 2 * topk_group",
        )
    return {
        "num_experts": num_experts,
        "top_k": top_k,
        "hidden_size": _field(hf, family, "hidden_size"),
        "ffn_size": _field(hf, family, "moe_intermediate_size"),
        "activation": _swiglu(hf, family),
        "score": "sigmoid",
        "normalize_weights": bool(hf.get("norm_topk_prob", False)),
        "num_groups": num_groups,
        "group_top_k": group_top_k if group_top_k < num_groups else None,
        "routed_scaling": float(hf.get("routed_scaling_factor", 1.0)),
        "use_expert_bias": True,
        **_shared_experts(hf, family),
    }


def _deepseek_v3(hf: Mapping) -> dict:
    return _sigmoid_grouped(hf, "DeepSeek-V3")


def _glm4_moe(hf: Mapping) -> dict:
    return _sigmoid_grouped(hf, "GLM-4.5-MoE")


def _deepseek_v2(hf: Mapping) -> dict:
    family = "DeepSeek-V2"
    _require(
        hf, family, "scoring_func", (None, "softmax"), "transformers' router is always softmax"
    )
    num_groups = hf.get("n_group") or 1
    group_top_k = hf.get("topk_group") or num_groups
    if hf.get("topk_method", "greedy") != "greedy" and group_top_k < num_groups:
        _refuse(
            family,
            "topk_method",
            hf.get("topk_method"),
            "group_limited_greedy scores a group by its best expert's probability; jaxmoe's "
            "group score is the sum of the top top_k // group_top_k (DeepSeek-V3's rule)",
        )
    _require(
        hf,
        family,
        "norm_topk_prob",
        (None, False),
        "transformers' DeepSeek-V2 router never normalises the top-k weights while the original "
        "model does when norm_topk_prob is set: the two disagree",
    )
    fields = _softmax_top_k(hf, family, ("n_routed_experts",), "moe_intermediate_size", False)
    fields["routed_scaling"] = float(hf.get("routed_scaling_factor", 1.0))
    return {**fields, **_shared_experts(hf, family)}


def _every_layer(hf: Mapping, layer: int) -> bool:
    return True


def _qwen_moe_layer(hf: Mapping, layer: int) -> bool:
    step = hf.get("decoder_sparse_step", 1)
    return (
        layer not in (hf.get("mlp_only_layers") or [])
        and max(hf.get(name) or 0 for name in _NUM_EXPERTS) > 0
        and (layer + 1) % step == 0
    )


def _after_first_dense(hf: Mapping, layer: int) -> bool:
    return layer >= (hf.get("first_k_dense_replace") or 0)


FAMILIES: dict[str, Family] = {
    "mixtral": Family(
        "Mixtral",
        _mixtral,
        _every_layer,
        block="model.layers.{layer}.block_sparse_moe",
        expert_names=_MIXTRAL_NAMES,
    ),
    "qwen3_moe": Family("Qwen3-MoE", _qwen3_moe, _qwen_moe_layer),
    "qwen2_moe": Family(
        "Qwen2-MoE",
        _qwen2_moe,
        _qwen_moe_layer,
        shared="shared_expert",
        shared_gate="shared_expert_gate.weight",
    ),
    "olmoe": Family("OLMoE", _olmoe, _every_layer),
    "deepseek_v3": Family(
        "DeepSeek-V3",
        _deepseek_v3,
        _after_first_dense,
        expert_bias="gate.e_score_correction_bias",
        shared="shared_experts",
    ),
    "glm4_moe": Family(
        "GLM-4.5-MoE",
        _glm4_moe,
        _after_first_dense,
        expert_bias="gate.e_score_correction_bias",
        shared="shared_experts",
    ),
    "deepseek_v2": Family("DeepSeek-V2", _deepseek_v2, _after_first_dense, shared="shared_experts"),
    "gpt_oss": Family(
        "gpt-oss",
        _gpt_oss,
        _every_layer,
        router="router.weight",
        router_bias="router.bias",
        fused_experts=True,
        quantizations=("mxfp4",),
    ),
}


def read_hf_config(hf_config) -> dict:
    """``hf_config`` as a dict: a mapping, a ``config.json`` path or a checkpoint directory."""
    if isinstance(hf_config, Mapping):
        return dict(hf_config)
    if isinstance(hf_config, str | os.PathLike):
        path = os.fspath(hf_config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise ValueError(
                f"jaxmoe.hf: `hf_config` must be a config dict, a config.json or a checkpoint "
                f"directory holding one; {path!r} does not exist."
            )
        with open(path) as file:
            return json.load(file)
    raise TypeError(
        "jaxmoe.hf: `hf_config` must be a dict, a path to config.json or a checkpoint "
        f"directory; got {type(hf_config).__name__}."
    )


def family_of(hf: Mapping) -> Family:
    """The :class:`Family` of a config dict; ValueError for an unknown family."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(
            f"jaxmoe.hf: config.json's model_type must be one of {sorted(FAMILIES)}; got "
            f"{model_type!r}. Other families are not supported (see docs/hf.md)."
        )
    return FAMILIES[model_type]


def _check_quantization(hf: Mapping, family: Family) -> None:
    """A quantized checkpoint loads only in a format jaxmoe dequantizes exactly (gpt-oss's
    MXFP4); reading another's stored integers or FP8 codes without its scales would be wrong."""
    quantization = hf.get("quantization_config")
    if quantization is None:
        return
    method = quantization.get("quant_method") if isinstance(quantization, Mapping) else None
    if method not in family.quantizations:
        _refuse(
            family.name,
            "quantization_config.quant_method",
            method,
            f"jaxmoe dequantizes only {list(family.quantizations) or 'nothing'} for this family; "
            "load an unquantized (bf16 / float32) checkpoint of the model instead",
        )


def moe_config(hf_config, **overrides) -> MoEConfig:
    """The ``MoEConfig`` of a transformers checkpoint's MoE block.

    Args:
      hf_config: the checkpoint's ``config.json``: a dict, its path, or the checkpoint directory.
      **overrides: further ``MoEConfig`` fields that are not the model's (e.g. ``ep_axis``,
        ``grouped_matmul_backend``, ``capacity_factor``, loss coefficients, ``dtype``). The
        family's routing fields cannot be overridden: that would change the model.

    Returns:
      A :class:`jaxmoe.MoEConfig` that routes and computes as the transformers block does.

    Raises:
      ValueError: for a family or option jaxmoe cannot express exactly (naming it), or an
        override of a field the checkpoint sets.
    """
    hf = read_hf_config(hf_config)
    family = family_of(hf)
    _check_quantization(hf, family)
    fields = family.config_fields(hf)
    clash = sorted(set(fields) & set(overrides))
    if clash:
        raise ValueError(
            f"jaxmoe.hf.moe_config: {clash} come from the {family.name} config.json and cannot "
            f"be overridden (they define the model); got overrides {clash}. Drop them."
        )
    return MoEConfig(**fields, **overrides)


def num_layers(hf: Mapping) -> int:
    return int(_field(hf, "this", "num_hidden_layers"))


def is_moe_layer(hf_config, layer: int) -> bool:
    """Whether decoder layer ``layer`` of the checkpoint has an MoE block (else a dense MLP).

    DeepSeek-V2/V3 and GLM-4.5-MoE: dense before ``first_k_dense_replace``; Qwen2-MoE and
    Qwen3-MoE: dense in ``mlp_only_layers`` and where ``(layer + 1) % decoder_sparse_step != 0``;
    the others: all MoE.

    Raises:
      ValueError: ``layer`` is not in ``[0, num_hidden_layers)``, or the family is unsupported.
    """
    hf = read_hf_config(hf_config)
    family = family_of(hf)
    count = num_layers(hf)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < count:
        raise ValueError(
            f"jaxmoe.hf: `layer` must be an int in [0, {count}) (num_hidden_layers of this "
            f"{family.name} checkpoint); got {layer!r}."
        )
    return family.is_moe_layer(hf, layer)


__all__ = ["FAMILIES", "Family", "is_moe_layer", "moe_config", "read_hf_config"]
