"""Every ```python block of README.md and docs/*.md runs as written, as a reader runs them: each
file's blocks in order in one namespace; the README's blocks also each on its own (a reader who
copies only the expert-parallel example).

A block that cannot run here (a multi-host launch) opens with the line
``# not run: <why>; its runnable twin: "<name>"`` and is skipped; the same file must then hold a
runnable block that opens with ``# runnable twin "<name>"`` and does the same on this machine.

docs/cli.md must name every flag the ``jaxmoe`` parser accepts.
"""

import argparse
import os
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
    # A block that writes files writes them here; one that reads the tests' fixtures (as from
    # the repository root: `tests/hf_golden/...`) finds them through a link.
    (tmp_path / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
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


# Every link and repository path a reader may follow from the markdown: relative links
# `[text](path#anchor)` against the linking file's folder (the anchor a heading of the target,
# slugged as GitHub does), and backticked paths under the repository's top folders against its
# root (below the root also paths under the file's own subfolders, `results/x.md` in
# benchmarks/README.md). A path read from history (`git show <commit>:path`) is not a file of
# the tree; a results table may be named by its stem (`benchmarks/results/layer-h200`: the .json
# and the .md beside it).
LINKED_DOCS = sorted(
    {README, *DOCS, ROOT / "benchmarks" / "README.md", *(ROOT / "examples").glob("**/README.md")}
)
MARKDOWN_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`]+)`")  # may wrap onto the next line, as in markdown
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
REPO_FOLDERS = ("benchmarks", "docs", "examples", "src", "tests")


def path_pattern(folders) -> re.Pattern:
    """A path that starts with one of ``folders``, not preceded by ``:`` (``commit:path``)."""
    alternatives = "|".join(map(re.escape, folders))
    return re.compile(rf"(?<![\w.:/-])((?:{alternatives})/[\w./-]*[\w/])")


def heading_slugs(path: pathlib.Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path``: the heading's text, lower case, without
    punctuation but ``-`` and ``_``, spaces as hyphens; a repeated slug gets ``-1``, ``-2``, ..."""
    slugs: set[str] = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        repeated, count = slug, 0
        while repeated in slugs:
            count += 1
            repeated = f"{slug}-{count}"
        slugs.add(repeated)
    return slugs


def _shown(path: pathlib.Path) -> str:
    return os.path.relpath(path, ROOT)


def broken_links(path: pathlib.Path) -> list[str]:
    """What in ``path`` points to no file or heading: one line each."""
    text = path.read_text()
    broken = []
    for target in MARKDOWN_LINK.findall(CODE_SPAN.sub("", FENCE.sub("", text))):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"[..]({target}): no file {_shown(linked)}")
        elif anchor and linked.suffix == ".md" and anchor not in heading_slugs(linked):
            broken.append(f"[..]({target}): no heading #{anchor} in {_shown(linked)}")
    bases = [(ROOT, path_pattern(REPO_FOLDERS))]
    subfolders = [d.name for d in path.parent.iterdir() if d.is_dir() and d.name[0] not in "._"]
    if path.parent != ROOT and subfolders:
        bases.append((path.parent, path_pattern(subfolders)))
    for snippet in CODE_SPAN.findall(FENCE.sub("", text)) + FENCE.findall(text):
        for base, pattern in bases:
            for named in pattern.findall(snippet):
                if any(mark in named for mark in ("<", "*", "...")):
                    continue  # a placeholder
                if not any((base / f"{named}{ext}").exists() for ext in ("", ".json", ".md")):
                    broken.append(f"`{named}`: no such file or folder ({_shown(base / named)})")
    return broken


@pytest.mark.parametrize(
    "path",
    LINKED_DOCS,
    ids=[_shown(p) for p in LINKED_DOCS],
)
def test_every_link_and_repository_path_exists(path):
    broken = broken_links(path)
    assert not broken, f"{_shown(path)}: " + "; ".join(broken)


def test_the_link_check_catches_a_missing_file_anchor_and_path(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.json").write_text("{}")
    page.write_text(
        "## Overlapping the `exchange`, again\n\n"
        "[ok](#overlapping-the-exchange-again) [gone](missing.md) [bad](#no-such-heading)\n"
        "`src/jaxmoe/no_such_module.py` and `git show abc123:benchmarks/raw/x.md` (history)\n"
        "`results/table` (a stem), `src/jaxmoe/layer.py`, `results/gone.md`\n"
        "[ok](results/table.json) [ok](../page.md#overlapping-the-exchange-again)\n".replace(
            "../page.md", f"../{tmp_path.name}/page.md"
        )
    )
    broken = broken_links(page)
    assert len(broken) == 4, broken
    assert "missing.md" in broken[0] and "#no-such-heading" in broken[1]
    assert "no_such_module" in broken[2] and "results/gone.md" in broken[3]
