"""Names shared by the worker and the client."""

from __future__ import annotations

import os

TASK_QUEUE = os.environ.get("AGENT_TASK_QUEUE", "agent-turns")
"""The task queue turns run on; workers and clients must agree on it."""

DEFAULT_MODEL = os.environ.get("AGENT_MODEL", "offline")
"""The worker's model spec for turns that name none."""
