"""Worked examples that use jaxmoe; not part of the ``jaxmoe`` package API.

Run them from the repository root, e.g. ``python -m examples.qwen3_moe.train --preset tiny``.
"""
