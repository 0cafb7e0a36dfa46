"""Every ```python block of README.md and docs/*.md runs as written, as a reader runs them: each
file's blocks in order in one namespace; the README's blocks also each on its own (a reader who
copies only the expert-parallel example).

A block that cannot run here (a multi-host launch) opens with the line
``# not run: <why>; its runnable twin: "<name>"`` and is skipped; the same file must then hold a
runnable block that opens with ``# runnable twin "<name>"`` and does the same on this machine.

docs/cli.md must name every flag the ``jaxmoe`` parser accepts.
"""

import argparse
import pathlib
import re

import pytest

from jaxmoe.cli import main as cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
NOT_RUN = "# not run:"
NAMES_TWIN = re.compile(r'its runnable twin: "([^"]+)"')
IS_TWIN = re.compile(r'# runnable twin "([^"]+)"')


def python_blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)


def runnable(blocks: list[str]) -> list[str]:
    return [block for block in blocks if not block.startswith(NOT_RUN)]


def _run(blocks: list[str], path: pathlib.Path) -> dict:
    namespace = {"__name__": "docs"}
    for index, block in enumerate(blocks):
        exec(compile(block, f"{path.relative_to(ROOT)} (python block {index})", "exec"), namespace)
    return namespace


BLOCKS = python_blocks(README)


def test_readme_python_blocks_run_in_order(tmp_path, monkeypatch):
    assert BLOCKS, "README has no python example"
    monkeypatch.chdir(tmp_path)
    _run(runnable(BLOCKS), README)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_each_readme_block_runs_on_its_own(index, tmp_path, monkeypatch):
    if BLOCKS[index].startswith(NOT_RUN):
        pytest.skip(BLOCKS[index].splitlines()[0])
    monkeypatch.chdir(tmp_path)
    _run([BLOCKS[index]], README)


def test_expert_parallel_example_shows_a_gradient():
    (block,) = [block for block in BLOCKS if "mesh=" in block]
    namespace = _run([block], README)
    assert "grad" in block and set(namespace["grads"]) == set(namespace["params"])


@pytest.mark.parametrize("path", DOCS, ids=[path.name for path in DOCS])
def test_doc_python_blocks_run_in_order(path, tmp_path, monkeypatch):
    blocks = runnable(python_blocks(path))
    if not blocks:
        pytest.skip(f"{path.name} has no runnable python block")
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    _run(blocks, path)


@pytest.mark.parametrize("path", [README, *DOCS], ids=[p.name for p in [README, *DOCS]])
def test_every_skipped_block_names_a_runnable_twin(path):
    blocks = python_blocks(path)
    twins = {m.group(1) for b in runnable(blocks) if (m := IS_TWIN.match(b.splitlines()[0]))}
    for block in blocks:
        first = block.splitlines()[0]
        if first.startswith(NOT_RUN):
            named = NAMES_TWIN.search(first)
            assert named, f"{path.name}: a skipped block must name its runnable twin: {first!r}"
            assert named.group(1) in twins, (
                f"{path.name}: no block opens with '# runnable twin \"{named.group(1)}\"'"
            )


def test_the_skip_marker_is_recognised():
    blocks = ['# not run: needs 2 hosts; its runnable twin: "x"\nraise SystemExit\n', "y = 1\n"]
    assert runnable(blocks) == ["y = 1\n"]
    assert NAMES_TWIN.search(blocks[0].splitlines()[0]).group(1) == "x"


def _flags(parser: argparse.ArgumentParser, command: str = "jaxmoe"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, f"{command} {name}")
        else:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    yield command, option


def test_cli_doc_names_every_flag():
    text = (ROOT / "docs" / "cli.md").read_text()
    flags = list(_flags(cli.build_parser()))
    assert len(flags) > 20
    missing = sorted({f"{command} {flag}" for command, flag in flags if f"`{flag}" not in text})
    assert not missing, f"docs/cli.md does not mention: {missing}"
