"""What a run prints: its progress while it runs, and a table of its episodes at the end.

    progress = Progress(total=114, out=sys.stdout)
    progress.turn_done("task 7", "2.2 s, 6 model calls")   # as each episode's turns end
    progress.scored(passed=True)                           # as each is scored, later
    progress.close()
    print(table(reports))

On a terminal the progress is one line, drawn again as it moves:

    [##########..........]  57/114 episodes' turns done; 50 scored, 50 passed; 31 s

Elsewhere (a log, a pipe) it is one line per episode as its turns end, with the same
counts. Scoring runs behind the turns (`evals.run.Scoring`), so the progress moves
with the turns, and each line says how far scoring has come.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TextIO

BAR = 20


class Progress:
    """Episodes done of `total`, as their turns end, and how many were scored."""

    def __init__(self, total: int, out: TextIO, *, live: bool | None = None) -> None:
        self.total = total
        self.out = out
        self.live = _is_terminal(out) if live is None else live
        self.done = 0
        self.scored_n = 0
        self.passed = 0
        self._started = time.monotonic()
        self._drawn = False

    def turn_done(self, label: str, facts: str) -> None:
        """An episode's turns have ended (`label`: which, `facts`: a few words)."""
        self.done += 1
        if self.live:
            self._draw()
        else:
            print(
                f"[{self.done:>3}/{self.total}] {label}  {facts}  ({self._counts()})",
                file=self.out,
                flush=True,
            )

    def scored(self, passed: bool) -> None:
        self.scored_n += 1
        self.passed += passed
        if self.live:
            self._draw()

    def close(self) -> None:
        if self.live and self._drawn:
            print(file=self.out, flush=True)

    def _counts(self) -> str:
        failed = self.scored_n - self.passed
        return f"{self.scored_n} scored, {self.passed} passed" + (
            f", {failed} FAILED" if failed else ""
        )

    def _draw(self) -> None:
        filled = BAR * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (BAR - filled)
        seconds = time.monotonic() - self._started
        line = (
            f"[{bar}] {self.done:>3}/{self.total} episodes' turns done; {self._counts()}; "
            f"{seconds:.0f} s"
        )
        self.out.write("\r" + line + "\x1b[K")
        self.out.flush()
        self._drawn = True


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


COLUMNS = (
    ("task", "task", "<"),
    ("pass", "passed", "<"),
    ("reward", "reward", ">"),
    ("model calls", "model_calls", ">"),
    ("tokens", "tokens", ">"),
    ("cost $", "cost_usd", ">"),
    ("wall s", "seconds", ">"),
    ("events", "history_events", ">"),
    ("kB", "history_kb", ">"),
    ("link", "link", "<"),
)


def table(reports: Sequence[Any]) -> str:
    """Per episode (in the run's order): pass, reward, model calls, tokens, cost, wall
    time of its turns, and its longest turn's history events and size; its link to
    the Web UI. A real model's trials show as `task/trial`, with the customer's model
    calls after a `+`."""
    trials = any(getattr(r, "trial", 0) for r in reports)
    rows: list[list[str]] = []
    for r in reports:
        customer = getattr(r, "customer_calls", 0)
        cost = r.cost_usd
        rows.append(
            [
                f"{r.task}/{r.trial}" if trials else str(r.task),
                "pass" if r.passed else "FAIL",
                f"{r.reward:.2f}",
                f"{r.model_calls}+{customer}" if customer else str(r.model_calls),
                str(r.input_tokens + r.output_tokens),
                "-" if cost is None else f"{cost:.4f}",
                f"{r.seconds:.1f}" + ("" if getattr(r, "timed_whole", True) else "*"),
                str(r.history_events),
                f"{r.history_bytes / 1000:.1f}",
                r.link or "-",
            ]
        )
    lines = [draw_table([(title, align) for title, _, align in COLUMNS], rows)]
    if any(not getattr(r, "timed_whole", True) for r in reports):
        lines.append(
            "* its turns were under way when the run was stopped: their time includes the "
            "stop (left out of the ratio over the plain loop)"
        )
    return "\n".join(lines)


def draw_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> str:
    """`rows` under `columns` (title, `<` for left or `>` for right), each column as
    wide as its widest cell, two spaces apart."""
    lines = [[title for title, _ in columns], *rows]
    widths = [max(len(row[i]) for row in lines) for i in range(len(columns))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if align == "<" else cell.rjust(width)
            for cell, width, (_, align) in zip(row, widths, columns, strict=True)
        ).rstrip()
        for row in lines
    )
