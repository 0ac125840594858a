"""Turn and conversation streams over Temporal: writing tokens, reading events.

    model_text(enabled)                  in a model-call activity: a `TextSink` that
                                         publishes the model's text to the turn's
                                         stream in bounded batches (None: off)
    turn_events(client, turn_id, n)      a turn's events from offset n, until its last
    chat_events(client, chat_id, n)      a conversation's events from offset n

The streams are Temporal's Workflow Streams (`temporalio.contrib.workflow_streams`,
experimental): publishing is a signal, reading a long-polling update, and a
finished workflow's items are read by query. What the events mean is in
`durable_agent/stream.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from durable_agent.stream import (
    CHAT_EVENT,
    CHAT_TOPIC,
    TURN_EVENT,
    TURN_TOPIC,
    ChatEvent,
    DoneEvent,
    TextSink,
    TokenBatcher,
    TokensEvent,
    TurnEvent,
)

BATCH_INTERVAL = timedelta(milliseconds=100)
"""How often a model's text is published while it writes: about ten batches a second."""
BATCH_MAX_CHARS = 2000
POLL_COOLDOWN = timedelta(milliseconds=100)
"""A caught-up reader asks again after this long (each ask is an update in history)."""


@asynccontextmanager
async def model_text(enabled: bool) -> AsyncIterator[TextSink | None]:
    """In a model-call activity: where the model writes its text as it comes.

    Batches go to the turn's stream, tagged with this call's activity id and
    attempt, at most every `BATCH_INTERVAL` (or `BATCH_MAX_CHARS`); the rest goes
    when the call ends, however it ends. Yields None when streaming is off."""
    if not enabled:
        yield None
        return
    info = activity.info()
    # Sent by our own ticker rather than the client's background flusher: that one
    # can miss its cancellation on Python 3.11 (asyncio.wait_for) and never stop.
    stream = WorkflowStreamClient.from_within_activity()
    topic = stream.topic(TURN_TOPIC)
    batcher = TokenBatcher(BATCH_INTERVAL.total_seconds(), BATCH_MAX_CHARS)

    def publish(batches: list[str]) -> None:
        for text in batches:
            event = TokensEvent(call=info.activity_id, attempt=info.attempt, text=text)
            topic.publish(event.model_dump(mode="json"))

    async def send() -> None:
        # Text that stops coming (the model thinking, a call being written) still
        # goes out within an interval.
        while True:
            await asyncio.sleep(BATCH_INTERVAL.total_seconds() / 2)
            publish(batcher.tick(time.monotonic()))
            await stream.flush()

    ticker = asyncio.create_task(send())
    try:
        yield lambda text: publish(batcher.add(text, time.monotonic()))
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        if rest := batcher.flush():
            publish([rest])
        await stream.flush()


async def turn_events(
    client: Client, turn_id: str, from_offset: int = 0
) -> AsyncIterator[tuple[int, TurnEvent]]:
    """A turn's events with their offsets, from `from_offset` to its `DoneEvent`.

    On a finished turn this reads what the stream kept and stops; the next
    offset to read after an event is its offset + 1."""
    stream = WorkflowStreamClient.create(client, turn_id)
    async for item in stream.subscribe(TURN_TOPIC, from_offset, poll_cooldown=POLL_COOLDOWN):
        event = TURN_EVENT.validate_python(item.data)
        yield item.offset, event
        if isinstance(event, DoneEvent):
            return


async def chat_events(
    client: Client, chat_id: str, from_offset: int = 0
) -> AsyncIterator[tuple[int, ChatEvent]]:
    """A conversation's events with their offsets, from `from_offset` on, for as
    long as it runs (across its continue-as-new runs)."""
    stream = WorkflowStreamClient.create(client, chat_id)
    async for item in stream.subscribe(CHAT_TOPIC, from_offset, poll_cooldown=POLL_COOLDOWN):
        yield item.offset, CHAT_EVENT.validate_python(item.data)
