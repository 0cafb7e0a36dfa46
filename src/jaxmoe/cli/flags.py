"""Flag types of the ``jaxmoe`` command: each turns the text of a flag into a checked value, or
says in one line what is wrong, so that a bad flag stops the command before any work starts.

A bad flag prints ``jaxmoe: error: argument --seed: must be an integer >= 0; got '-1'`` and
exits with status 2 (:class:`Parser`).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from jaxmoe.bench.harness import check_writable


class UsageError(SystemExit):
    """A bad command line: exit status 2; ``str()`` is the message (already printed)."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def usage_error(message: str) -> UsageError:
    """Prints ``jaxmoe: error: message`` (one line) and returns the exception to raise."""
    print(f"jaxmoe: error: {message}", file=sys.stderr)
    return UsageError(message)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``jaxmoe: error: ...``, status 2."""

    def error(self, message: str):
        raise usage_error(message.replace("\n", " "))


def integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An integer ``>= minimum`` (and ``< maximum`` when given)."""
    rule = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum})"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value >= maximum):
            raise argparse.ArgumentTypeError(f"must be an integer {rule}; got {text!r}")
        return value

    return parse


def number(minimum: float, *, above: bool = False, none: bool = False) -> Callable[[str], float]:
    """A finite number ``>= minimum`` (``> minimum`` with ``above``); ``none`` also takes the word
    ``none`` (returned as None)."""
    rule = f"a finite number {'>' if above else '>='} {minimum:g}" + (" or 'none'" if none else "")

    def parse(text: str) -> float | None:
        if none and text.strip().lower() == "none":
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum or (above and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {rule}; got {text!r}")
        return value

    return parse


def names(choices: Sequence[str], *, aliases: dict[str, list[str]] | None = None):
    """A comma list of names from ``choices`` (an alias such as ``all`` stands for its list)."""
    aliases = aliases or {}

    def parse(text: str) -> list[str]:
        parsed = []
        for name in (part.strip() for part in text.split(",")):
            if name in aliases:
                parsed += aliases[name]
            elif name in choices:
                parsed.append(name)
            else:
                known = ", ".join([*choices, *aliases])
                raise argparse.ArgumentTypeError(f"unknown {name!r}; choose from {known}")
        return parsed

    return parse


def integers(minimum: int) -> Callable[[str], list[int]]:
    """A comma list of integers ``>= minimum``."""
    one = integer(minimum)

    def parse(text: str) -> list[int]:
        try:
            return [one(part.strip()) for part in text.split(",")]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"must be a comma list of integers >= {minimum}; got {text!r}"
            ) from None

    return parse


# The most devices one ``jaxmoe`` process may ask for (``--ep``, ``--exchange-ep``, ``--devices``):
# a GPU host has 8 (16 at most), and on a CPU each is a simulated device of one process, where 64
# compile in seconds and 1000 were still compiling after five minutes.
MAX_DEVICES = 64


def _check_device_count(value: int, text: str) -> int:
    if value > MAX_DEVICES:
        raise argparse.ArgumentTypeError(
            f"{value} devices is more than one jaxmoe process drives (at most {MAX_DEVICES}: a "
            "GPU host has 8, and on a CPU each is a simulated device of this process, which "
            f"past {MAX_DEVICES} take minutes to compile); got {text!r}"
        )
    return value


def device_count(minimum: int) -> Callable[[str], int]:
    """A number of devices: an integer ``>= minimum`` and at most :data:`MAX_DEVICES`."""
    one = integer(minimum)
    return lambda text: _check_device_count(one(text), text)


def device_counts(minimum: int) -> Callable[[str], list[int]]:
    """A comma list of integers ``>= minimum``, each at most :data:`MAX_DEVICES`."""
    many = integers(minimum)
    return lambda text: [_check_device_count(value, text) for value in many(text)]


def config_error(error: ValueError, flag_of_field: Mapping[str, str]) -> str:
    """A ``MoEConfig`` rule's message (``MoEConfig.field: rule; got value. fix``) as a flag error:
    ``argument --flag: `` before it when a flag sets that field, and after it the flags that set
    the other fields it names (its fix speaks of fields)."""
    message = str(error)
    match = re.match(r"MoEConfig\.(\w+):", message)
    field = match.group(1) if match else None
    others = [
        f"{name} is {flag}"
        for name, flag in flag_of_field.items()
        if name != field and re.search(rf"\b{name}\b", message)
    ]
    head = f"argument {flag_of_field[field]}: " if field in flag_of_field else ""
    return head + message + (f" (here {'; '.join(others)})" if others else "")


def preset_names(choices: Sequence[str], all_presets: Sequence[str]) -> Callable[[str], list[str]]:
    """``--preset``: a comma list of ``choices``, or ``all`` for ``all_presets``."""

    def parse(text: str) -> list[str]:
        if text == "all":
            return list(all_presets)
        for name in (part.strip() for part in text.split(",")):
            if name not in choices:
                raise argparse.ArgumentTypeError(
                    f"unknown --preset {name!r}; choose from {', '.join(choices)} "
                    "(comma-separated) or 'all'"
                )
        return [part.strip() for part in text.split(",")]

    return parse


def writable_file(text: str) -> str:
    """A file that can be written (its folder is created); nothing is left there yet."""
    try:
        check_writable(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def writable_folder(text: str) -> str:
    """A folder that exists or can be created, and can be written into. Nothing is created
    while parsing (the command makes it once every flag is accepted); an empty name, which
    would mean the current directory, is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a folder; got an empty name")
    folder = Path(text).expanduser()
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p == Path(p.anchor))
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write into {text!r}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write into {text!r}: {existing} is read-only")
    return text
