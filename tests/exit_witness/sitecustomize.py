"""Imported at start-up by each process the clean-exit tests start (this folder is
first on their PYTHONPATH). Its exit handler is the first registered, so it runs last,
just before the interpreter finalizes: a native thread still alive then (the SDK's
Tokio threads) could call into Python as it finalizes, the cause of the rare
"PyGILState_Release" abort. It names them on standard error, which the tests want
empty: so a run fails on the hazard itself, not only on the abort it sometimes becomes.
"""

import atexit
import os
import sys
import threading


def _native_threads() -> list[str]:
    python = {t.native_id for t in threading.enumerate()}
    names = []
    for tid in os.listdir("/proc/self/task"):
        if int(tid) not in python:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                pass  # ended meanwhile
    return sorted(names)


def _witness() -> None:
    if left := _native_threads():
        print(f"native threads alive as the interpreter finalizes: {left}", file=sys.stderr)


if sys.platform.startswith("linux"):
    atexit.register(_witness)
