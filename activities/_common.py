"""What remote activities do around their work: heartbeats, and a backend's Retry-After."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agent.errors import ModelUnavailable


@contextmanager
def server_suggested_delay() -> Iterator[None]:
    """A backend that said when to come back (HTTP Retry-After) gets its way:
    the next attempt waits that long instead of the policy's backoff."""
    try:
        yield
    except ModelUnavailable as e:
        if e.retry_after is None:
            raise
        raise ApplicationError(
            str(e), type=type(e).__name__, next_retry_delay=timedelta(seconds=e.retry_after)
        ) from e


@asynccontextmanager
async def heartbeating() -> AsyncIterator[None]:
    """Heartbeat while the body runs, if the activity has a heartbeat timeout.

    A worker that dies mid-call stops heartbeating, so Temporal re-runs the
    call on another worker after the heartbeat timeout instead of waiting for
    the (much longer) start-to-close timeout. The SDK throttles the RPCs.
    """
    timeout = activity.info().heartbeat_timeout
    if not timeout:
        yield
        return

    async def beat() -> None:
        # Sleep first: most calls end well within the interval and then cost no
        # heartbeat RPC (and no history write on the server) at all.
        while True:
            await asyncio.sleep(timeout.total_seconds() / 4)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
