"""Command lines that answer a mistake in one line.

`client.py`, `worker.py` and the codec server parse their arguments with
`OneLineParser`: a flag that is missing, unknown or not of its kind is one line on
standard error and exit code 1, as every other input mistake is:

    error: --port: give a port from 0 to 65535, not '99999' (see client.py web --help)

The types below check a number before anything is built from it (argparse's own
`int` takes `1_000` and digits of any script, and `float` takes `inf` and `nan`).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import NoReturn

from durable_agent import fallback

EXIT_USAGE = 1
"""Exit code of a command line it cannot use (argparse's own is 2)."""
_WHOLE = re.compile(r"[+-]?[0-9]{1,18}")


class OneLineParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose mistakes are one line, `error: FLAG: what to give`,
    and exit code 1 (its subcommands' parsers too)."""

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"^argument ([^:]+): ", r"\1: ", message)
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")


def whole_number(
    low: int | None = None, high: int | None = None, what: str = "a whole number"
) -> Callable[[str], int]:
    """An argparse type: a whole number in plain ASCII digits, from `low` to `high`
    when given (else the command checks its range)."""
    span = f" from {low} to {high}" if low is not None and high is not None else ""

    def parse(text: str) -> int:
        value = text.strip()
        if (
            not _WHOLE.fullmatch(value)
            or (low is not None and int(value) < low)
            or (high is not None and int(value) > high)
        ):
            raise argparse.ArgumentTypeError(f"give {what}{span}, not {_shown(text)}")
        return int(value)

    return parse


port_number = whole_number(0, 65535, "a port")
"""An argparse type: a TCP port (0: any free one)."""


def number_of(unit: str) -> Callable[[str], float]:
    """An argparse type: a finite number of `unit` (`inf`, `nan` and `1e999` are not;
    the command checks its range)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"give a number of {unit}, not {_shown(text)}")
        return value

    return parse


MAX_NAME_CHARS = 1000
"""Temporal's limit on a task queue's name (and a workflow id's)."""


def task_queue_name(text: str) -> str:
    """An argparse type: a task queue's name, as Temporal takes it."""
    name = text.strip()
    if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise argparse.ArgumentTypeError(
            f"give a task queue's name (1 to {MAX_NAME_CHARS} printable characters), "
            f"not {_shown(text)}"
        )
    return name


MAX_MODEL_CHARS = 200


def model_spec(text: str) -> str:
    """An argparse type: a model spec (`provider:model`, or empty for the agent's), or
    several in order separated by commas (fallback: `a,b`), which the worker resolves;
    here only their shape is checked (it is also a search attribute, whose values
    Temporal caps)."""
    spec = text.strip()
    if len(spec) > MAX_MODEL_CHARS or any(c.isspace() or not c.isprintable() for c in spec):
        raise argparse.ArgumentTypeError(
            f"give a model spec like openai:gpt-4o, or several separated by commas (at most "
            f"{MAX_MODEL_CHARS} characters, no spaces), not {_shown(text)}"
        )
    try:
        return fallback.joined(fallback.check(spec))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")
