"""What every benchmark shares: the results header, the error metric, the ratio rule, the table,
the result writer and torch memory release.

A benchmark returns rows (flat dicts, one per measured case); a row that did not run has
``"ms": None`` and says why under ``"skipped"`` (the platform cannot run it) or ``"error"`` (it
failed). Results are ``{"header": results_header(...), "rows": [...]}`` as JSON, the same for
``jaxmoe bench gemm``, ``layer`` and ``ep``::

    header = results_header("jaxmoe bench layer", flops="...")
    write_results("out/layer.json", header, rows)
    print(format_table(rows, [("impl", "impl", ""), ("ms", "ms", "{:.3f}")]))
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

# (row key, column heading, format such as "{:.3f}"; "" = str(value)). None shows as "-".
Column = tuple[str, str, str]
RATIO_RULE = "ratio = baseline ms / ms (> 1 is faster), baseline = the first peer that ran"


def package_version(name: str) -> str | None:
    """An installed distribution's version, read from its metadata (importing can be slow)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_version() -> str | None:
    """torch's version if it is installed (read from its metadata: importing torch is slow)."""
    return package_version("torch")


def source_commit() -> str | None:
    """The short git commit of the jaxmoe source being run (None outside a git checkout, e.g. a
    copied working tree on a device machine: then the table builder's ``--commit`` names it)."""
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None if found.returncode == 0 else None


def results_header(command: str, **extra: Any) -> dict[str, Any]:
    """Where and how the numbers were taken: device, platform, versions, date, the command and
    the commit of the source that ran."""
    return {
        "device": jax.devices()[0].device_kind,
        "platform": jax.default_backend(),
        "num_devices": jax.device_count(),
        "jax": jax.__version__,
        "torch": torch_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "commit": source_commit(),
        **extra,
    }


def relative_error(got, want) -> float:
    """``||got - want|| / ||want||`` in float64 (any arrays); ``inf`` if ``got`` is not finite."""
    got = np.asarray(jax.device_get(got), np.float64)
    want = np.asarray(jax.device_get(want), np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def differing_elements(got, want) -> int:
    """How many elements differ in their bits (shape or dtype mismatch: all of them)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return int(max(got.size, want.size))
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    return int(np.count_nonzero(got.view(width) != want.view(width)))


def weight_gradient_errors(got, want, group_sizes):
    """Checks of a ``[G, K, N]`` weight gradient against a float32 reference (device scalars):
    relative Frobenius error, the worst group's, the non-finite count of ``got``, and the
    largest magnitude in an empty group (must be 0)."""
    got = got.astype(jax.numpy.float32)
    diff = got - want
    norm = jax.numpy.linalg.norm
    group_ref = norm(want, axis=(1, 2))
    group_err = norm(diff, axis=(1, 2)) / jax.numpy.maximum(group_ref, 1e-30)
    empty = (group_sizes == 0)[:, None, None]
    return (
        norm(diff) / jax.numpy.maximum(norm(want), 1e-30),
        jax.numpy.max(jax.numpy.where(group_ref > 0, group_err, 0.0)),
        jax.numpy.sum(~jax.numpy.isfinite(got)),
        jax.numpy.max(jax.numpy.where(empty, jax.numpy.abs(got), 0.0)),
    )


def fill_ratios(rows: list[dict[str, Any]], group_by: Sequence[str], order: Sequence[str]) -> None:
    """The ratio rule, in place: per case (rows equal on ``group_by``), ``baseline`` is the first
    impl in ``order`` that has a time, ``ratio`` its ms over the row's ms (> 1: faster than the
    baseline) and ``ratio_vs_torch`` torch's ms over the row's ms (None where either is missing);
    rows timed one call at a time too (``ms_per_call``) also get ``ratio_vs_torch_per_call``.
    """
    cases: dict[tuple, dict[str, dict[str, Any]]] = {}
    for row in rows:
        cases.setdefault(tuple(row[k] for k in group_by), {})[row["impl"]] = row
    for case in cases.values():
        timed = [impl for impl in order if (case.get(impl) or {}).get("ms")]
        base_ms = case[timed[0]]["ms"] if timed else None
        torch_ms = (case.get("torch") or {}).get("ms")
        for row in case.values():
            ms = row.get("ms")
            row["baseline"] = timed[0] if timed else None
            row["ratio"] = base_ms / ms if base_ms and ms else None
            row["ratio_vs_torch"] = torch_ms / ms if torch_ms and ms else None
            torch_single = (case.get("torch") or {}).get("ms_per_call")
            if row.get("ms_per_call") and torch_single:
                row["ratio_vs_torch_per_call"] = torch_single / row["ms_per_call"]


def release_torch_memory() -> None:
    """Frees torch's CUDA cache (if torch was imported) so that JAX can use the memory."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def row_note(row: dict[str, Any]) -> str:
    """Why a row has no time (skipped, unsupported, error), or what its ratio is against."""
    for key in ("skipped", "unsupported", "error", "reason"):
        if row.get(key):
            return f"{key}: {row[key]}" if key != "skipped" else str(row[key])
    return f"vs {row['baseline']}" if row.get("baseline") and row.get("ratio") else ""


def format_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[Column], *, markdown: bool = False
) -> str:
    """The rows as a table: one line per row, the ``columns`` then a note (see :func:`row_note`).

    Plain text with aligned columns, or a markdown table with ``markdown=True``.
    """
    header = [label for _, label, _ in columns] + ["note"]
    body = [
        [
            "-" if row.get(key) is None else spec.format(row[key]) if spec else str(row[key])
            for key, _, spec in columns
        ]
        + [row_note(row)[:100]]
        for row in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body])
    widths = [max(len(h), *(len(cells[i]) for cells in body)) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


def check_writable(path: str | Path) -> None:
    """Raises ValueError unless ``path`` can be written (creating its folder), without leaving a
    file behind: results are checked for a home before any benchmark runs."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a folder; give a file name, e.g. {path / 'out.json'}")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as error:
        raise ValueError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    if not existed:
        path.unlink()


def write_results(
    path: str | Path,
    header: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    render: Callable[[dict[str, Any], Sequence[dict[str, Any]]], str] | None = None,
) -> list[Path]:
    """Writes ``{"header", "rows"}`` as JSON to ``path`` and, given ``render``, its text
    ``render(header, rows)`` beside it as ``.md``. Returns the paths written.

    Call it after every row so that a run cut short keeps what it measured.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"header": header, "rows": list(rows)}, indent=1, default=str))
    written = [path]
    if render is not None:
        written.append(path.with_suffix(".md"))
        written[-1].write_text(render(header, rows) + "\n")
    return written


def row_emitter(
    path: str | Path | None,
    header: dict[str, Any],
    render: Callable[[dict[str, Any], Sequence[dict[str, Any]]], str] | None = None,
) -> Callable[[dict[str, Any]], None]:
    """A bench's row sink: ``emit(row)`` rounds the row's floats to 6 digits, prints it as one
    JSON line and rewrites ``path`` (:func:`write_results`, with ``render``'s markdown beside
    it; ``None``: nothing written) with every row so far."""
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        row = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        if path is not None:
            write_results(path, header, rows, render)

    return emit


def markdown_report(title: str, columns: Sequence[Column]):
    """A ``render`` for :func:`write_results`: a title, the header's facts, the markdown table."""

    def render(header: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
        facts = [
            f"# {title} ({header['device']} x{header['num_devices']})",
            "",
            f"jax {header['jax']}; torch {header['torch']}; {header['date']}; "
            f"`{header['command']}`.",
            "",
        ]
        return "\n".join(facts) + format_table(rows, columns, markdown=True)

    return render


def first_devices_mesh(count: int, axis_name: str = "ep") -> jax.sharding.Mesh:
    """A 1-D mesh over the first ``count`` devices."""
    devices = jax.devices()
    if count > len(devices):
        raise ValueError(f"EP={count} needs {count} devices; {len(devices)} available.")
    return jax.sharding.Mesh(np.array(devices[:count]), (axis_name,))
