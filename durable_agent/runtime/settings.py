"""Names shared by the worker and the client."""

from __future__ import annotations

import os
from datetime import timedelta

TASK_QUEUE = os.environ.get("AGENT_TASK_QUEUE", "agent-turns")
"""The task queue turns run on; workers and clients must agree on it."""

DEFAULT_MODEL = os.environ.get("AGENT_MODEL", "offline")
"""The worker's model spec for turns that name none."""

WORKER_HEARTBEAT = timedelta(seconds=5)
"""How often `worker.py`'s workers tell the server they are alive (ListWorkers): once a
client has seen two beats, a killed worker stops counting as live within seconds, not
after its last long poll (`runtime.turns.workers`)."""
