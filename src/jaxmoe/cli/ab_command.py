"""``jaxmoe bench ab``: its flags (:func:`add_flags`, registered by
:mod:`jaxmoe.cli.bench_commands`) and :func:`run`, which makes the two trees, starts their
workers and writes the rows (:mod:`jaxmoe.bench.ab`).

Everything a flag can get wrong (a folder holding no jaxmoe, a commit the checkout lacks, a
``--cases`` pattern that selects nothing) is one ``jaxmoe: error:`` line and status 2, before a
worker starts. The parent makes no JAX device of its own: the workers hold the device(s).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from jaxmoe.bench import ab, harness
from jaxmoe.bench.ab_pipe import WorkerDied
from jaxmoe.bench.ab_trees import check_tree, resolve_commit, tree_at, tree_from_commit
from jaxmoe.bench.timing import SETTLE_MS, settle_ms_for
from jaxmoe.cli import flags

DESCRIPTION = (
    "two jaxmoe source trees, before and after a change, on one machine: each case's outputs "
    "and gradients compared bit for bit, then timed in interleaved rounds (after/before)"
)


def _tree_folder(text: str) -> str:
    try:
        check_tree(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _patterns(text: str) -> list[str]:
    """``--cases``: a comma list of case names or ``fnmatch`` patterns; each must match a case."""
    patterns = ["*" if part.strip() == "all" else part.strip() for part in text.split(",")]
    patterns = [pattern for pattern in patterns if pattern]
    if not patterns:
        raise argparse.ArgumentTypeError(f"must name at least one case; got {text!r}")
    names = ab.all_case_names()
    for pattern in patterns:
        if not any(ab.matches(name, pattern) for name in names):
            raise argparse.ArgumentTypeError(
                f"{pattern!r} matches no case; cases are FAMILY/SHAPE/ROUTING/PASS/BACKEND, "
                f"e.g. {names[0]} (families: {', '.join(ab.FAMILIES)}; patterns as in fnmatch)"
            )
    return patterns


def add_flags(sub) -> None:
    for label in ("before", "after"):
        default = " (neither: the current folder)" if label == "after" else ""
        sub.add_argument(
            f"--{label}",
            type=_tree_folder,
            default=None,
            help=f"folder of the '{label}' source tree (holds src/){default}",
        )
        sub.add_argument(
            f"--{label}-commit",
            metavar="REV",
            default=None,
            help=f"alone: the '{label}' tree is REV of --repo, git archived; with --{label}: "
            "the folder's commit (recorded where the folder is no git checkout, checked where "
            "it is)",
        )
    sub.add_argument("--repo", default=".", help="the git checkout --*-commit are read from")
    sub.add_argument(
        "--cases",
        type=_patterns,
        default="all",
        help="comma list of case names or patterns (FAMILY/SHAPE/ROUTING/PASS/BACKEND; a "
        f"family alone: {', '.join(ab.FAMILIES)}; 'all')",
    )
    sub.add_argument(
        "--backends",
        type=flags.names(ab.BACKENDS),
        default="auto",
        help=f"comma list of {', '.join(ab.BACKENDS)}; each family takes those it has "
        "(pallas_fused: the gated FFN's fused Mosaic kernel)",
    )
    sub.add_argument(
        "--tiny",
        action="store_true",
        help=f"one small shape ({ab.TINY_SHAPE.m}x{ab.TINY_SHAPE.k}x{ab.TINY_SHAPE.n}, "
        f"{ab.TINY_SHAPE.groups} groups) per family; on a CPU the Mosaic and Triton kernels run "
        "interpreted",
    )
    sub.add_argument(
        "--rounds",
        type=flags.integer(0),
        default=ab.ROUNDS,
        help="interleaved rounds (0: compare the bits only)",
    )
    sub.add_argument(
        "--tolerance",
        type=flags.number(0),
        default=ab.TOLERANCE,
        help="largest |after/before - 1| that passes",
    )
    sub.add_argument(
        "--settle-ms",
        type=flags.number(0),
        default=None,
        help="ms each tree runs untimed before each of its samples (None: "
        f"{SETTLE_MS:g} on a GPU, 0 elsewhere)",
    )
    sub.add_argument(
        "--sample-ms",
        type=flags.number(0, above=True),
        default=ab.SAMPLE_MS,
        help="back-to-back calls per sample fill about this long",
    )
    sub.add_argument(
        "--mem-fraction",
        type=_fraction,
        default=ab.MEM_FRACTION,
        help="each worker's share of GPU memory (XLA_PYTHON_CLIENT_MEM_FRACTION)",
    )
    sub.add_argument("--seed", type=flags.integer(0), default=0, help="inputs and routings")
    sub.add_argument(
        "--timeout-s",
        type=flags.number(0, above=True),
        default=1800.0,
        help="a worker silent this long on one command is ended (the row says so)",
    )
    sub.add_argument(
        "--arrays-dir",
        type=flags.writable_folder,
        default=None,
        help="keep each case's .npy outputs and the workers' logs here (None: a temporary "
        "folder, removed)",
    )
    sub.add_argument(
        "--out",
        type=flags.writable_file,
        default=None,
        help="JSON file for the results (a .md table beside it), rewritten after every row "
        "(None: not written)",
    )


def _fraction(text: str) -> float:
    value = flags.number(0, above=True)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1]; got {text!r}")
    return value


def _tree(args, label: str, scratch: Path):
    folder, rev = getattr(args, label), getattr(args, f"{label}_commit")
    if folder is None and rev is None:
        if label == "before":
            raise ValueError("argument --before: give --before PATH or --before-commit REV")
        folder = "."
    if folder is None:
        resolve_commit(args.repo, rev)  # the flag's error before any export
        return tree_from_commit(args.repo, rev, scratch / label, label)
    tree = tree_at(folder, label)
    if rev is None:
        return tree
    if tree.commit is None:  # e.g. an exported tree copied to another machine: REV names it
        return dataclasses.replace(tree, commit=rev, origin="folder (commit as given)")
    try:
        commit = resolve_commit(tree.path, rev)
    except ValueError as error:
        raise ValueError(f"argument --{label}-commit: {error}") from None
    if commit != tree.commit:
        raise ValueError(
            f"argument --{label}-commit: {rev!r} is not the HEAD ({tree.commit[:12]}) of the "
            f"checkout {folder!r}; leave it out (the checkout's commit is recorded)"
        )
    return tree


def _trees(args, scratch: Path):
    """The before and after :class:`~jaxmoe.bench.ab_trees.SourceTree`; ValueError naming the
    flag when one cannot be made."""
    made = []
    for label in ("before", "after"):
        try:
            made.append(_tree(args, label, scratch))
        except ValueError as error:
            message = str(error)
            if not message.startswith("argument "):
                flag = f"--{label}" if getattr(args, label) else f"--{label}-commit"
                message = f"argument {flag}: {message}"
            raise ValueError(message) from None
    return made


def run(args, command: str) -> int:
    """Runs ``jaxmoe bench ab``; returns the exit status (0: every case that ran is ``ok``)."""
    cases = ab.select_cases(ab.case_list(args.tiny, args.backends), args.cases)
    if not cases:
        flags.usage_error(
            f"argument --cases: {','.join(args.cases)} selects none of the cases of "
            f"--backends {','.join(args.backends)}" + (" with --tiny" if args.tiny else "")
            + " (the tiny cases' shape is tiny-ab; the others need no --tiny)"
        )  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory(prefix="jaxmoe-ab-") as scratch:
        try:
            before, after = _trees(args, Path(scratch))
        except ValueError as error:
            flags.usage_error(str(error))
            return 2
        log_dir = Path(args.arrays_dir or scratch)
        log_dir.mkdir(parents=True, exist_ok=True)
        session = ab.AbSession(
            before, after, log_dir, mem_fraction=args.mem_fraction, timeout_s=args.timeout_s
        )
        try:
            session.start()
        except WorkerDied as error:
            flags.usage_error(f"a tree's worker did not start: {error}")
            return 2
        try:
            return _measure(args, command, session, cases)
        finally:
            session.close()


def _measure(args, command: str, session: ab.AbSession, cases) -> int:
    settle_ms = settle_ms_for(session.info["platform"], args.settle_ms)
    header = ab.ab_header(
        command,
        session,
        rounds=args.rounds,
        tolerance=args.tolerance,
        settle_ms=settle_ms,
        sample_ms=args.sample_ms,
        seed=args.seed,
        tiny=args.tiny,
        backends=args.backends,
        mem_fraction=args.mem_fraction,
    )
    rows = ab.run_ab(
        session,
        cases,
        tiny=args.tiny,
        rounds=args.rounds,
        tolerance=args.tolerance,
        settle_ms=settle_ms,
        sample_ms=args.sample_ms,
        seed=args.seed,
        arrays_dir=args.arrays_dir,
        on_row=harness.row_emitter(args.out, header, ab.render),
    )
    trees = ", ".join(
        f"{label} {header[label]['commit'] or header[label]['path']}"
        + (" (dirty)" if header[label]["dirty"] else "")
        for label in ("before", "after")
    )
    print(f"\n{header['device']} x{header['num_devices']} ({header['platform']}); {trees}\n")
    print(harness.format_table(rows, ab.COLUMNS))
    if args.out:
        print(f"wrote {args.out}")
    ran = [row for row in rows if "ok" in row]
    return 0 if ran and all(row["ok"] for row in ran) else 1
