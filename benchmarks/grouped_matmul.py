"""Grouped-matmul benchmark on the GPU: jaxmoe's kernels vs jax.lax.ragged_dot vs jax's Mosaic GPU
kernels vs torch._grouped_mm, every shape of the big presets by default.

The same as ``jaxmoe bench gemm --preset all`` (flags: ``jaxmoe bench gemm --help``), writing
``{stem}.json`` and ``{stem}.md`` under ``--out-dir`` (``{stem}-tune.json`` with ``--tune``)::

    python benchmarks/grouped_matmul.py --out-dir /tmp/gemm
    python benchmarks/grouped_matmul.py --shapes mixtral-up,qwen3-down --impls jaxmoe,torch
    python benchmarks/grouped_matmul.py --tune 1 --shapes dsv3-up   # tile sweep of the kernels
"""

from __future__ import annotations

import os
import sys

from jaxmoe.cli.main import main


def _out_file(argv: list[str]) -> list[str]:
    """``--out-dir DIR --stem STEM`` -> ``--out DIR/STEM.json`` (the other flags pass through)."""
    rest, where = [], {"--out-dir": ".", "--stem": "grouped_matmul"}
    args = iter(argv)
    for arg in args:
        if arg in where:
            where[arg] = next(args, where[arg])
        else:
            rest.append(arg)
    stem = where["--stem"] + ("-tune" if "--tune" in rest else "")
    return [*rest, "--out", os.path.join(where["--out-dir"], f"{stem}.json")]


if __name__ == "__main__":
    sys.exit(main(["bench", "gemm", "--preset", "all", *_out_file(sys.argv[1:])]))
