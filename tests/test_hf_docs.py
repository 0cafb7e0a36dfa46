"""docs/hf.md's python blocks run, in order, in one namespace, from the repository root."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "hf.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_hf_doc_python_blocks_run_in_order(monkeypatch):
    assert len(BLOCKS) == 3, "docs/hf.md: load, train, write back"
    monkeypatch.chdir(ROOT)
    namespace = {"__name__": "__hf_doc__"}
    for number, block in enumerate(BLOCKS):
        exec(compile(block, f"docs/hf.md block {number}", "exec"), namespace)
    assert namespace["losses"][-1] < namespace["losses"][0]
    assert not os.path.exists(namespace["out"])
