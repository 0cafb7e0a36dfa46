"""A reference Qwen3-MoE decoder on jaxmoe: the model, transformers checkpoint loading, presets
and one training command (``python -m examples.qwen3_moe.train``). See this folder's README.md.
"""
