"""Flax modules: thin shells over :func:`jaxmoe.moe` (NNX ``MoE``; Linen ``MoELinen``)."""

from jaxmoe.nn.linen import MoELinen
from jaxmoe.nn.nnx import ExpertBias, MoE

__all__ = ["ExpertBias", "MoE", "MoELinen"]
