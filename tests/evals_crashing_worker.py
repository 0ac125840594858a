"""A chaos run's worker (`python -m durable_agent.evals worker ...`) that SIGKILLs itself
right after its first write is applied to the episode store, before Temporal hears of its result.

    python tests/evals_crashing_worker.py MARKER --domain retail --tasks 0 --store S --task-queue Q

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

from durable_agent.evals import tau2  # noqa: E402
from durable_agent.evals.__main__ import main  # noqa: E402

marker = Path(sys.argv.pop(1))
applied = tau2.EpisodeStore.call


def call_then_die(
    self: Any, episode: str, key: str, tool: str, args: Any, write: bool, *rest: Any
) -> str:
    result = applied(self, episode, key, tool, args, write, *rest)
    if write and not marker.exists():
        marker.write_text(key)
        os.kill(os.getpid(), signal.SIGKILL)
    return result


tau2.EpisodeStore.call = call_then_die  # type: ignore[method-assign]
sys.exit(main(["worker", *sys.argv[1:]]))
