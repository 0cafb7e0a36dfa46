"""Benchmark shapes, declared once: the layer presets and the grouped-matmul shapes.

Tests and benchmark scripts import these rather than repeating numbers.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LayerPreset:
    """An MoE layer size: SwiGLU experts, softmax top-k routing, bf16 unless said."""

    name: str
    tokens: int
    hidden_size: int
    ffn_size: int
    num_experts: int
    top_k: int


LAYER_PRESETS = {
    "mixtral": LayerPreset("mixtral", 4096, 4096, 14336, 8, 2),
    "dsv3": LayerPreset("dsv3", 4096, 7168, 2048, 32, 8),
    "qwen3": LayerPreset("qwen3", 8192, 2048, 768, 128, 8),
    # Small enough to run on a 2-core CPU in seconds (CI smoke tests).
    "tiny": LayerPreset("tiny", 256, 64, 128, 8, 2),
}


@dataclasses.dataclass(frozen=True)
class GemmShape:
    """A grouped matmul ``x[M, K] @ w[G, K, N]``."""

    name: str
    m: int
    k: int
    n: int
    groups: int

    @property
    def flops(self) -> int:
        """Useful FLOPs of the forward product (2*M*K*N whatever the implementation does)."""
        return 2 * self.m * self.k * self.n


GEMM_SHAPES = {
    "mixtral-up": GemmShape("mixtral-up", 16384, 4096, 14336, 8),
    "mixtral-down": GemmShape("mixtral-down", 16384, 14336, 4096, 8),
    "dsv3-up": GemmShape("dsv3-up", 32768, 7168, 2048, 32),
    "dsv3-down": GemmShape("dsv3-down", 32768, 2048, 7168, 32),
    "qwen3-up": GemmShape("qwen3-up", 65536, 2048, 768, 128),
    "qwen3-down": GemmShape("qwen3-down", 65536, 768, 2048, 128),
    "tiny": GemmShape("tiny", 512, 64, 96, 4),
}
