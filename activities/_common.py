"""What activities do around their work: heartbeats, a backend's Retry-After, which of
their errors Temporal must not retry, and what those errors may say."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from durable_agent import redact
from durable_agent.errors import AgentError, ModelUnavailable


class PermanentErrors(Interceptor):
    """An `AgentError` that is not `retryable` (an unknown model, a reply that cannot be
    used, a tool's "not found", and any such class an agent's own code defines) leaves
    any activity as a non-retryable ApplicationError of the class's name, so Temporal
    never retries it. Said where the error is raised, not in every retry policy: the
    policies list no error types, and no activity's scheduled event carries them.

    And no error leaves an activity with a credential in its text: its text goes into
    the turn's history, the worker's log ("Completing activity as failed") and the
    activity's span, and a provider's error may repeat the key it was sent ("Incorrect
    API key provided: sk-…"). Such an error leaves as an ApplicationError of the same
    type, retryability and delay, its text masked (`durable_agent.redact`), with the
    frames of where it was raised and without the errors it was raised from (they
    would carry the text unmasked)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Permanent(next)


class _Permanent(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except Exception as e:
            if _holds_a_credential(e):
                raise _masked(e).with_traceback(e.__traceback__) from None
            if isinstance(e, AgentError) and not e.retryable:
                details = getattr(e, "details", ())  # what the workflow reads (`BudgetSoftLimit`)
                raise ApplicationError(
                    str(e), *details, type=type(e).__name__, non_retryable=True
                ) from e
            raise


def _chain(e: BaseException) -> Iterator[BaseException]:
    """The error and those it was raised from (or during), as a traceback shows them."""
    seen: set[int] = set()
    at: BaseException | None = e
    while at is not None and id(at) not in seen and len(seen) < 16:
        seen.add(id(at))
        yield at
        at = at.__cause__ or (None if at.__suppress_context__ else at.__context__)


def _holds_a_credential(e: BaseException) -> bool:
    return any(redact.mask(str(x)) != str(x) for x in _chain(e))


def _masked(e: Exception) -> ApplicationError:
    """`e` as the ApplicationError Temporal would make of it, its text masked."""
    if isinstance(e, ApplicationError):
        return ApplicationError(
            redact.mask(e.message),
            *e.details,
            type=e.type,
            non_retryable=e.non_retryable,
            next_retry_delay=e.next_retry_delay,
            category=e.category,
        )
    permanent = isinstance(e, AgentError) and not e.retryable
    return ApplicationError(redact.mask(str(e)), type=type(e).__name__, non_retryable=permanent)


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


T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """`asyncio.wait_for`, in the activity's own task where Python has `asyncio.timeout`
    (3.11 on): no task of its own to wait for, one hop less through the worker's event
    loop, where every other turn's work waits in line."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


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
