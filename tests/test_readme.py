"""The README's Python examples run as written: in order, as a reader runs them, and each block
on its own (a reader who copies only the expert-parallel example)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _run(blocks):
    namespace = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    return namespace


def test_readme_python_blocks_run_in_order():
    assert BLOCKS, "README has no python example"
    _run(BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_each_readme_block_runs_on_its_own(index):
    _run([BLOCKS[index]])


def test_expert_parallel_example_shows_a_gradient():
    (block,) = [block for block in BLOCKS if "mesh=" in block]
    namespace = _run([block])
    assert "grad" in block and set(namespace["grads"]) == set(namespace["params"])
