"""The two source trees of ``jaxmoe bench ab``: a folder holding a jaxmoe ``src/``, or a commit
of a git checkout exported into one (``git archive``), and what the results header says of each
(the path, the commit, whether its ``src/`` has changes not committed)."""

from __future__ import annotations

import dataclasses
import subprocess
import tarfile
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class SourceTree:
    """A jaxmoe source tree: ``path / "src" / "jaxmoe"`` is the package a worker imports.

    Attributes:
      label: ``"before"`` or ``"after"``.
      path: the folder holding ``src/``.
      commit: the full commit hash (``git rev-parse HEAD`` of a checkout; the exported commit),
        ``None`` for a folder outside git.
      dirty: whether ``src/`` differs from ``commit`` (``None``: not a checkout).
      origin: ``"folder"`` or ``"git archive REV"``.
    """

    label: str
    path: Path
    commit: str | None
    dirty: bool | None
    origin: str

    @property
    def src(self) -> Path:
        return self.path / "src"

    def as_header(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "commit": self.commit,
            "dirty": self.dirty,
            "origin": self.origin,
        }


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as error:
        return subprocess.CompletedProcess(args, 1, "", str(error))


def check_tree(path: str | Path) -> Path:
    """``path`` resolved, or ValueError unless it holds ``src/jaxmoe/__init__.py``."""
    folder = Path(path).expanduser().resolve()
    if not (folder / "src" / "jaxmoe" / "__init__.py").is_file():
        raise ValueError(
            f"{str(path)!r} holds no src/jaxmoe/__init__.py; give the folder of a jaxmoe source "
            "tree (e.g. made by `git worktree add /tmp/before REV`), not its src/"
        )
    return folder


def tree_at(path: str | Path, label: str) -> SourceTree:
    """The tree in folder ``path``; its commit when the folder is a git checkout's top."""
    folder = check_tree(path)
    top = _git(folder, "rev-parse", "--show-toplevel")
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != folder:
        return SourceTree(label, folder, None, None, "folder")
    commit = _git(folder, "rev-parse", "HEAD").stdout.strip() or None
    status = _git(folder, "status", "--porcelain", "--", "src")
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return SourceTree(label, folder, commit, dirty, "folder")


def resolve_commit(repo: str | Path, rev: str) -> str:
    """``rev``'s full commit hash in the checkout ``repo``, or ValueError saying why not."""
    found = _git(Path(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if found.returncode != 0 or not found.stdout.strip():
        why = found.stderr.strip() or "no such commit"
        raise ValueError(f"{rev!r} is not a commit of the git checkout {str(repo)!r} ({why})")
    return found.stdout.strip()


def tree_from_commit(repo: str | Path, rev: str, dest: str | Path, label: str) -> SourceTree:
    """Exports ``src/`` of commit ``rev`` of ``repo`` into the new folder ``dest``."""
    commit = resolve_commit(repo, rev)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=False)
    archive = subprocess.Popen(
        ["git", "-C", str(repo), "archive", "--format=tar", commit, "src"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    if archive.wait() != 0:
        raise ValueError(f"git archive {commit} failed: {archive.stderr.read().decode().strip()}")
    check_tree(dest)
    return SourceTree(label, dest.resolve(), commit, False, f"git archive {rev}")
