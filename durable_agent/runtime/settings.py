"""Names shared by the worker and the client."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

TASK_QUEUE = os.environ.get("AGENT_TASK_QUEUE", "agent-turns")
"""The task queue turns run on; workers and clients must agree on it."""

DEFAULT_MODEL = os.environ.get("AGENT_MODEL", "offline")
"""The worker's model spec for turns that name none."""

WORKER_HEARTBEAT = timedelta(seconds=5)
"""How often `worker.py`'s workers tell the server they are alive (ListWorkers): once a
client has seen two beats, a killed worker stops counting as live within seconds, not
after its last long poll (`runtime.turns.workers`)."""


INSTALLED = ("durable-agent", "durable-agent-worker")
"""The installed commands (pyproject.toml's scripts): `client.py` and `worker.py`."""


def client_command() -> str:
    """How a person runs the client, said the way this process was run: `durable-agent`
    when an installed command started it, else `python client.py`."""
    return "durable-agent" if _installed() else "python client.py"


def worker_command() -> str:
    """How a person runs a worker: `durable-agent-worker`, else `python worker.py`."""
    return "durable-agent-worker" if _installed() else "python worker.py"


def _installed() -> bool:
    return Path(sys.argv[0]).name in INSTALLED if sys.argv and sys.argv[0] else False
