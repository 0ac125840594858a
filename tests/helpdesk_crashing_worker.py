"""`worker.py` serving the help desk example (run from its folder) that SIGKILLs itself
right after its first ticket is written, before Temporal hears that the write is done.

    python tests/helpdesk_crashing_worker.py MARKER [worker.py's arguments]

MARKER is written just before the kill: a worker started again with the same marker
runs as a plain one.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, os.getcwd())  # the example's folder, as `--agent helpdesk:agent` finds it

import desk  # noqa: E402

from durable_agent.commands.worker import main  # noqa: E402

marker = Path(sys.argv.pop(1))
written = desk.Desk.open_ticket


def open_then_die(self: Any, requester: str, title: str, priority: str, key: str) -> Any:
    ticket = written(self, requester, title, priority, key)
    if not marker.exists():
        marker.write_text(key)
        os.kill(os.getpid(), signal.SIGKILL)
    return ticket


desk.Desk.open_ticket = open_then_die  # type: ignore[method-assign]
main()
