"""Hugging Face transformers checkpoints: MoE blocks in and out (``pip install 'jaxmoe[hf]'``).

* :func:`moe_config`: a checkpoint's ``config.json`` as a :class:`jaxmoe.MoEConfig`.
* :func:`is_moe_layer`: whether a decoder layer has an MoE block.
* :func:`load_moe_layer`: one layer's MoE block as jaxmoe params (optionally onto a mesh).
* :func:`moe_layer_state_dict`: the params back in the checkpoint's key names and layouts.

Supported families, refused ones and why: ``docs/hf.md``. Not imported by ``jaxmoe`` itself, so
``safetensors`` stays optional.
"""

from jaxmoe.hf.families import FAMILIES, is_moe_layer, moe_config
from jaxmoe.hf.layer import load_moe_layer, moe_layer_state_dict

__all__ = [
    "FAMILIES",
    "is_moe_layer",
    "load_moe_layer",
    "moe_config",
    "moe_layer_state_dict",
]
