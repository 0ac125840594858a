"""The SDK runtimes of this process, and their end before the interpreter's.

    runtimes.shared()         the runtime clients use when they are given none
    runtimes.track(runtime)   one made here for a purpose (a worker's, with its metrics)
    runtimes.end()            at exit: let go of them, so that their threads are joined

Why. The SDK's Core runs on a Tokio thread pool, and those native threads call into
Python: every RPC's result is handed to the event loop from one of them
(pyo3-async-runtimes calls `loop.call_soon_threadsafe`, which can let go of the GIL
midway: the write that wakes the loop, the interpreter's switch interval), and a
worker's runtime forwards Core's log lines to Python's logging from another. The last
result can wake the loop, the program finish and the interpreter start finalizing
before that thread has taken the GIL back. CPython (3.13 and before) then ends the
thread with `pthread_exit`; the unwinding runs pyo3's guard, whose `PyGILState_Release`
finds another thread state current: "Fatal Python error: PyGILState_Release: thread
state … must be current when releasing", SIGABRT. A busy machine widens the window:
the thread waits longer for a core.

The cure is to end a runtime while the interpreter is whole. The last reference to it
going shuts its Tokio pool down and joins the threads, and the SDK lets go of the GIL
while it waits, so a thread still inside Python finishes first. Clients and workers
each hold their runtime, and an SDK client sits in reference cycles, so `end()`
collects garbage once it has let go. It runs at exit (`atexit`: after the non-daemon
threads are joined, before the interpreter starts finalizing). A runtime still held
then (a client kept in a module global) keeps its threads, and the hazard: `end()`
says so in one logged warning.

What a collection cannot see. A Tokio thread that lets go of a Python object (every
call's asyncio future, once the call is done or cancelled) holds no GIL, so PyO3 only
notes the decrement, and applies it the next time any thread enters the SDK's native
module. A call that failed leaves its exception on that future, and the exception's
traceback keeps the frames that hold the client. When the call's Tokio task lets go of
the future only after the last entry into the native module (the result handed to the
loop, its done-callback run: a Tokio thread waiting for a core on a busy machine), and
the program makes no call after it (a command refused on the server's answer), the
runtime stays held however long one waits: `end()` enters the native module before
each look (`_apply_deferred_decrefs`).

The SDK's default runtime (`Runtime.default()`, used by a `Client.connect` given no
`runtime`) lives in the SDK's own module until the interpreter finalizes; this
module never uses it.
"""

from __future__ import annotations

import atexit
import gc
import logging
import sys
import time
import weakref

from temporalio.bridge import temporal_sdk_bridge
from temporalio.runtime import Runtime, TelemetryConfig

log = logging.getLogger(__name__)

_shared: Runtime | None = None
_made: weakref.WeakSet[Runtime] = weakref.WeakSet()
_at_exit = False


def shared() -> Runtime:
    """The runtime of the clients this process opens with none given (one thread pool
    for all of them), ended at exit."""
    global _shared
    if _shared is None:
        _shared = track(Runtime(telemetry=TelemetryConfig()))
    return _shared


def track(runtime: Runtime) -> Runtime:
    """`runtime`, which `end()` will expect to be gone."""
    global _at_exit
    if not _at_exit:
        atexit.register(_end_at_exit)
        _at_exit = True
    _made.add(runtime)
    return runtime


SETTLE_S = 15.0
"""How long `end()` waits, at most, for calls cancelled as the program ended to let go of
their clients (each does once a Tokio thread has handed its cancellation back, which on a
busy machine can take more than a second). A program that lets go at once, nearly every
one, never waits; only one that still holds a client (a module global) waits all of it
before the warning. (The refused commands that once printed the warning after 5 s, then
15 s, were held by decrements PyO3 had deferred: no wait would have ended them.)"""
SETTLE_PAUSE_S = 0.2
"""The longest pause between two looks while `end()` waits."""


def end() -> int:
    """Let go of the shared runtime and collect what held the runtimes made here: each
    that nothing else holds ends now, its threads joined. Returns how many are still
    held (0: no thread of theirs will meet the interpreter's end)."""
    global _shared
    _shared = None
    if not _made:
        return 0
    # The traceback of an exception that ended the program is kept for a post-mortem
    # (`pdb.pm()`) that can no longer come: its frames hold their clients.
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    _apply_deferred_decrefs()
    gc.collect()
    # A call cancelled as the program ended still holds its client from a Tokio task
    # until that task has handed the cancellation back (on one of the threads we are
    # waiting to end): a moment, with the GIL let go; then its decrement waits in
    # PyO3's pool for the next look's entry into the native module.
    # Each look is a full collection, which holds the GIL the thread handing the
    # cancellation back needs: the pauses between looks grow, so that on a busy
    # machine (or a large heap, where a collection is long) that thread gets it.
    deadline, pause = time.monotonic() + SETTLE_S, 0.01
    while _made and time.monotonic() < deadline:
        time.sleep(pause)
        _apply_deferred_decrefs()
        gc.collect()
        pause = min(pause * 2, SETTLE_PAUSE_S)
    return len(_made)


def _apply_deferred_decrefs() -> None:
    """Apply the reference decrements PyO3 deferred in the SDK's native module (objects
    its Tokio threads let go of without the GIL): PyO3 applies them on every entry into
    the module, and this one builds and drops an empty object, nothing more."""
    temporal_sdk_bridge.CustomSlotSupplier(None)


def _end_at_exit() -> None:
    if held := end():
        log.warning(
            "%d Temporal runtime(s) still in use at exit: a client or worker is still "
            "referenced (a module global, a call in flight), and its threads may meet the "
            "interpreter's end (a rare abort); let go of it before the program ends",
            held,
        )
