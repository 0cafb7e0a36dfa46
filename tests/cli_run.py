"""Running ``jaxmoe`` in-process for the bench subcommands' tests: the exit status, the one
error line, the results a run wrote."""

import json

from jaxmoe.cli.main import build_parser, main


def exit_code(argv) -> int:
    """``main(argv)``'s exit status, whether returned or raised (argparse raises SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def one_error_line(capsys) -> str:
    """The run's stderr, which must be one ``jaxmoe: error:`` line (and nothing on stdout)."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("jaxmoe: error: "), lines[0]
    assert captured.out == ""
    return lines[0]


def bench_help(kind: str) -> str:
    """``jaxmoe bench KIND --help``'s text, whitespace collapsed."""
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    return " ".join(bench._subparsers._group_actions[0].choices[kind].format_help().split())


def results(path):
    """``(header, rows)`` of a results JSON."""
    data = json.loads(path.read_text())
    return data["header"], data["rows"]
