"""The processes a test started, as Linux's /proc lists them."""

from __future__ import annotations

from pathlib import Path


def children(parent: int, name: str) -> list[int]:
    """The pids of `parent`'s children whose command line has `name`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        if f"\nPPid:\t{parent}\n" in status and name in cmdline:
            found.append(int(entry.name))
    return found
