"""`runtime.runtimes.end()`, in this process: what it lets go of, and what it reports held.

The processes that end with it are tested in `tests/test_clean_exits.py`.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
from temporalio.bridge import temporal_sdk_bridge
from temporalio.runtime import Runtime, TelemetryConfig

from durable_agent.runtime import runtimes


class DeferringBridge:
    """The SDK's native module, with what PyO3 does to an object a Tokio thread let go of
    without the GIL: the decrement waits in a pool until a thread next enters the module
    (a failed call's future, whose traceback holds its client, held so past the program's
    last call: the refused commands that printed the still-in-use warning)."""

    def __init__(self, *held: object) -> None:
        self.pool: list[object] = list(held)

    def __getattr__(self, name: str) -> Any:
        self.pool.clear()
        return getattr(temporal_sdk_bridge, name)


@pytest.fixture
def alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """`end()` sees only the runtimes this test makes (not the session's), and waits
    0.5 s for them, not 15."""
    monkeypatch.setattr(runtimes, "_made", weakref.WeakSet())
    monkeypatch.setattr(runtimes, "_shared", None)
    monkeypatch.setattr(runtimes, "SETTLE_S", 0.5)


@pytest.mark.usefixtures("alone")
def test_end_applies_the_decrements_the_sdk_deferred(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = runtimes.shared()
    gone = weakref.ref(runtime)
    monkeypatch.setattr(runtimes, "temporal_sdk_bridge", DeferringBridge(runtime))
    del runtime
    gc.collect()
    assert gone() is not None  # what the program's own collection cannot free
    assert runtimes.end() == 0
    assert gone() is None


@pytest.mark.usefixtures("alone")
def test_end_reports_a_runtime_still_referenced() -> None:
    kept = runtimes.track(Runtime(telemetry=TelemetryConfig()))
    assert runtimes.end() == 1
    del kept
    assert runtimes.end() == 0
