"""Parameter counts, training FLOPs per token and MFU of the decoder.

MFU is counted as torchtitan and PaLM (Chowdhery et al. 2022, appendix B) count it::

    flops_per_token = 6 * N_active + 12 * L * (num_heads * head_dim) * S
    MFU = tokens_per_second * flops_per_token / peak_flops

``N_active``: the parameters one token's forward multiplies by: attention, the router, the
``K`` of ``E`` routed experts a token visits (``K / E`` of the expert weights), the dense MLPs
and the LM head (the embedding matrix when tied), the norms; the input embedding is a lookup
and is left out. ``6 = 2`` (multiply-add) ``x 3`` (forward, and the backward's two matmuls).
The attention term is the ``QK^T`` and ``PV`` matmuls over the full ``S x S`` (the causal
half is not subtracted, as in torchtitan), ``L`` all layers, ``S`` the sequence length.
Recomputation (``remat``) is not counted: MFU, not hardware FLOPs utilisation.

The peak is a parameter: 989 TFLOP/s is the bf16 dense (no sparsity) peak of an H100 / H200
SXM, the figure torchtitan and Megatron divide by.
"""

from __future__ import annotations

from .config import DecoderConfig

H100_BF16_DENSE_TFLOPS = 989.0


def _attention_params(cfg: DecoderConfig) -> int:
    hidden, q_width = cfg.hidden_size, cfg.num_heads * cfg.head_dim
    kv_width = cfg.num_kv_heads * cfg.head_dim
    return 2 * hidden * q_width + 2 * hidden * kv_width + 2 * cfg.head_dim + 2 * hidden


def parameter_counts(cfg: DecoderConfig) -> dict[str, int]:
    """``{"total", "active", "embedding"}``: every parameter; those one token uses
    (``N_active`` above, the input embedding excluded); the input embedding ``V * H``."""
    moe = cfg.moe
    hidden = cfg.hidden_size
    per_expert = (3 if moe.gated else 2) * hidden * moe.ffn_size
    shared = (3 if moe.gated else 2) * hidden * moe.effective_shared_ffn_size
    dense = 3 * hidden * cfg.intermediate_size
    embedding = cfg.vocab_size * hidden
    total, active = embedding + hidden, embedding + hidden  # embedding (or tied head), norm
    if not cfg.tie_word_embeddings:
        total += embedding
        active += embedding
    for layer in range(cfg.num_layers):
        attention = _attention_params(cfg)
        if cfg.is_moe_layer(layer):
            router = hidden * moe.num_experts + (moe.num_experts if moe.use_expert_bias else 0)
            total += attention + router + shared + moe.num_experts * per_expert
            active += attention + router + shared + moe.top_k * per_expert
        else:
            total += attention + dense
            active += attention + dense
    # The input embedding is a lookup; a tied head's matmul still reads the same matrix.
    return {
        "total": total,
        "active": active - (0 if cfg.tie_word_embeddings else embedding),
        "embedding": embedding,
    }


def flops_per_token(cfg: DecoderConfig, seq_len: int) -> float:
    """Training FLOPs per token: ``6 * N_active + 12 * L * num_heads * head_dim * seq_len``."""
    attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
    return 6.0 * parameter_counts(cfg)["active"] + attention


def mfu(tokens_per_second: float, cfg: DecoderConfig, seq_len: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation, a fraction of ``peak_tflops`` (per device)."""
    return tokens_per_second * flops_per_token(cfg, seq_len) / (peak_tflops * 1e12)
