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
            raise argparse.ArgumentTypeError(f"give {what}{span}, not {text!r}")
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
            raise argparse.ArgumentTypeError(f"give a number of {unit}, not {text!r}")
        return value

    return parse
