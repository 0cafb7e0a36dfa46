"""The README's Python examples run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    namespace = {"__name__": "readme"}  # later blocks continue the first, as a reader would
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
