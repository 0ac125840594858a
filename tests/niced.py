"""What a scoring process runs in `tests/test_evals.py` (a spawned process imports it by
name): a job that never ends at the lowest priority until it is released."""

from __future__ import annotations

import os
import time
from pathlib import Path


def niceness_once_released(started: str, release: str) -> int:
    """The process's niceness; at a niceness above 0, only once `release` exists."""
    Path(started).write_text(str(os.getpid()))
    while os.nice(0) > 0 and not Path(release).exists():
        time.sleep(0.05)
    return os.nice(0)
