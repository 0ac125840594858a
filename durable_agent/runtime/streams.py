"""Turn and conversation streams over Temporal: writing tokens, reading events.

    model_text(enabled)                  in a model-call activity: a `TextSink` that
                                         publishes the model's text to the turn's
                                         stream in bounded batches (None: off)
    turn_events(client, turn_id, n)      a turn's events from offset n, until its last
    chat_events(client, chat_id, n)      a conversation's events from offset n

The streams are Temporal's Workflow Streams (`temporalio.contrib.workflow_streams`,
experimental): publishing is a signal, reading a query (`read`), so readers hold
nothing on the workflow and add nothing to its history. What the events mean is in
`durable_agent/stream.py`.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.workflow_streams import PollInput, PollResult, WorkflowStreamClient
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.stream import (
    CHAT_EVENT,
    CHAT_TOPIC,
    TURN_EVENT,
    TURN_TOPIC,
    ChatEnded,
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
"""A caught-up reader asks again after this long..."""
POLL_IDLE = timedelta(seconds=1)
"""...backing off to this while nothing comes (a turn waiting for a person)."""
ENDED_CHECK = timedelta(seconds=2)
"""How long a reader reads nothing before it asks whether the workflow has ended."""
POLL_QUERY = "__temporal_workflow_stream_poll"
"""The stream's read-now query (`temporalio.contrib.workflow_streams`)."""
QUERY_WAIT = timedelta(seconds=10)
"""How long one read waits for a worker to answer before it is asked again: a turn
whose worker has not started yet (or is busy) waits for one, and so do its readers."""


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
    """A turn's events with their offsets, from `from_offset` to its `DoneEvent`
    (or to the end of a turn that ended without one: terminated, say).

    The next offset to read after an event is its offset + 1."""
    async for offset, data in read(client, turn_id, TURN_TOPIC, from_offset):
        event = TURN_EVENT.validate_python(data)
        yield offset, event
        if isinstance(event, DoneEvent):
            return


async def chat_events(
    client: Client, chat_id: str, from_offset: int = 0
) -> AsyncIterator[tuple[int, ChatEvent]]:
    """A conversation's events with their offsets, from `from_offset` to its
    `ChatEnded` (across its continue-as-new runs)."""
    async for offset, data in read(client, chat_id, CHAT_TOPIC, from_offset):
        event = CHAT_EVENT.validate_python(data)
        yield offset, event
        if isinstance(event, ChatEnded):
            return


async def read(
    client: Client, workflow_id: str, topic: str, from_offset: int = 0
) -> AsyncIterator[tuple[int, Any]]:
    """Items of the workflow's stream on `topic`, from `from_offset`, for as long as
    it runs (its latest run: a conversation that continued as new goes on).

    Reading is a query: it holds nothing on the workflow and writes nothing to its
    history, so any number of readers may come, go or crash without delaying a
    decision or a message (Temporal allows a workflow only a few updates in flight).
    The readers of one workflow's topic in a process share one `_Feed`: fifty open
    tabs of one conversation cost the worker what one does. An offset past the end
    reads nothing until items get there; one before what a long conversation kept
    reads from the oldest kept."""
    key = (id(asyncio.get_running_loop()), id(client), workflow_id, topic)
    feed = _feeds.get(key)
    if feed is None or feed.closed:
        feed = _feeds[key] = _Feed(client, workflow_id, topic)
    feed.readers += 1
    offset = max(0, from_offset)
    try:
        while True:
            seen = feed.version
            index = bisect.bisect_left(feed.offsets, offset)
            while index < len(feed.offsets):
                offset = feed.offsets[index]
                yield offset, feed.items[index]
                offset, index = offset + 1, index + 1
            if feed.error is not None:
                raise feed.error
            if feed.closed:
                return
            await feed.changed(seen)
    finally:
        feed.readers -= 1
        if feed.readers == 0:
            feed.close()
            if _feeds.get(key) is feed:
                del _feeds[key]


class _Feed:
    """One poller of a workflow's stream topic, keeping what it read for all its
    readers in this process. Caught up, it asks again after `POLL_COOLDOWN`, backing
    off to `POLL_IDLE` while nothing comes (a turn waiting for a person). It closes
    when its last reader leaves, when the workflow has ended and all it published
    is read, or on an error, which its readers raise."""

    def __init__(self, client: Client, workflow_id: str, topic: str) -> None:
        self.handle = client.get_workflow_handle(workflow_id)
        self.topic = topic
        self.converter = client.data_converter.payload_converter
        self.offsets: list[int] = []
        self.items: list[Any] = []
        self.next_offset = 0
        self.closed = False
        self.error: BaseException | None = None
        self.readers = 0
        self.version = 0
        self._event = asyncio.Event()
        self._task = asyncio.create_task(self._poll())

    async def changed(self, seen: int) -> None:
        """Returns once something changed since `version` was `seen`."""
        while self.version == seen:
            self._event.clear()
            await self._event.wait()

    def close(self) -> None:
        self.closed = True
        self._task.cancel()

    def _notify(self) -> None:
        self.version += 1
        self._event.set()

    async def _poll(self) -> None:
        wait = POLL_COOLDOWN.total_seconds()
        quiet_since = time.monotonic()
        try:
            while True:
                try:
                    got, more = await self._read()
                except RPCError as e:
                    if e.status not in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
                        raise
                    got, more = False, False  # no worker answered in time: ask again
                if more:
                    continue
                now = time.monotonic()
                if got:
                    wait, quiet_since = POLL_COOLDOWN.total_seconds(), now
                else:
                    wait = min(wait * 1.5, POLL_IDLE.total_seconds())
                    if now - quiet_since > ENDED_CHECK.total_seconds():
                        quiet_since = now
                        if await _ended(self.handle):
                            # Whatever it published before it ended, then stop.
                            while (await self._read())[0]:
                                pass
                            return
                await asyncio.sleep(wait)
        except Exception as e:
            self.error = e
        finally:
            self.closed = True
            self._notify()

    async def _read(self) -> tuple[bool, bool]:
        """What the workflow has from `next_offset` on: whether there was anything,
        and whether more is ready at once."""
        result = await self.handle.query(
            POLL_QUERY,
            PollInput(topics=[self.topic], from_offset=self.next_offset),
            result_type=PollResult,
            rpc_timeout=QUERY_WAIT,
        )
        for item in result.items:
            payload = Payload()
            payload.ParseFromString(base64.b64decode(item.data))
            self.offsets.append(item.offset)
            self.items.append(self.converter.from_payload(payload))
        self.next_offset = max(self.next_offset, result.next_offset)
        if result.items:
            self._notify()
        return bool(result.items), bool(result.more_ready)


_feeds: dict[tuple[int, int, str, str], _Feed] = {}
"""The open feeds of this process, by event loop, client, workflow and topic."""


async def _ended(handle: WorkflowHandle) -> bool:
    status = (await handle.describe()).status
    return status not in (None, WorkflowExecutionStatus.RUNNING)
