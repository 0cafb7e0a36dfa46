"""Builds the session-11 tables from the raw H100 run 12 files (``raw/h100-run12/README.md``)
with :func:`assemble_gemm_run.assemble`:

* grouped matmul, bf16 (``grouped_matmul-h100.json``): every row of calls 2, 3 and 4. Call 4
  measured again the cases call 2 left below the bar (chosen by their outcome, so the table
  shows both).
* layer (``layer-h100.json``): call 3's rows (torch, torchtitan, jaxmoe bf16) join the earlier
  runs' rows.

Usage: python benchmarks/assemble_run12_results.py (prints the grouped-matmul markdown table)
"""

from __future__ import annotations

from assemble_gemm_run import assemble

# In the order they ran: a later file's case supersedes an earlier one's.
GEMM_FILES = [
    "call2/gemm-balanced.json",
    "call2/gemm-skewed-qwen3.json",
    "call3/gemm-skewed.json",
    "call4/gemm-balanced.json",
    "call4/gemm-skewed-qwen3.json",
]

if __name__ == "__main__":
    assemble("h100-run12", GEMM_FILES, "call3", header_key="session11_run")
