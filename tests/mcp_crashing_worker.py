"""`worker.py` that SIGKILLs itself right after its first MCP write reached the server
and was answered, before Temporal hears of the answer: a worker dying mid-call.

    python tests/mcp_crashing_worker.py MARKER [worker.py's arguments]

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

from durable_agent import mcp  # noqa: E402
from durable_agent.commands.worker import main  # noqa: E402

marker = Path(sys.argv.pop(1))
answered = mcp.Connection.call


async def call_then_die(self: Any, name: str, arguments: dict[str, Any], *, write: bool) -> Any:
    result = await answered(self, name, arguments, write=write)
    if write and not marker.exists():
        marker.write_text(name)
        os.kill(os.getpid(), signal.SIGKILL)
    return result


mcp.Connection.call = call_then_die  # type: ignore[method-assign]
main()
