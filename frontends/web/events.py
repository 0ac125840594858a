"""A conversation as the page reads it: one sequence of server-sent events.

The conversation's stream says which turn answers which message (`TurnStarted`);
each turn's own stream carries its steps, its text as it is written and its
outcome (`durable_agent/stream.py`). Turns are answered one at a time, so reading each
turn's stream to its end before the next conversation event keeps the page's
order true. Every event carries its position as its id, `<chat offset>.<turn
offset>`: the conversation event it belongs to, and how many events of that
event's turn came before it and it. EventSource sends the last id back when it
reconnects (`Last-Event-ID`), and reading goes on from exactly there: no gap,
no event twice. A turn read by itself (`one_turn`) is positioned as a
conversation's first turn would be.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from temporalio.client import Client

from durable_agent.runtime.streams import chat_events, turn_events
from durable_agent.stream import ChatEnded, TurnStarted

T = TypeVar("T")


@dataclass(frozen=True)
class Position:
    """Conversation event `chat` is read, and the first `turn` events of the turn
    it started (0 for an event that starts no turn)."""

    chat: int
    turn: int = 0

    def __str__(self) -> str:
        return f"{self.chat}.{self.turn}"

    @classmethod
    def parse(cls, text: str | None) -> Position | None:
        """The position in an event id; None for no id or one this server never sent."""
        found = re.fullmatch(r"(\d{1,18})\.(\d{1,18})", (text or "").strip())
        return cls(int(found[1]), int(found[2])) if found else None


@dataclass(frozen=True)
class Event:
    """One server-sent event: `name` is the stream event's `type` (`turn`, `step`,
    `tokens`, `done`, `answered`, `ended`), `data` the event itself."""

    position: Position
    name: str
    data: dict[str, Any]

    def encode(self) -> str:
        return f"id: {self.position}\nevent: {self.name}\ndata: {json.dumps(self.data)}\n\n"


async def conversation(
    client: Client,
    chat_id: str,
    after: Position | None = None,
    history_url: Callable[[str], str | None] = lambda _: None,
) -> AsyncIterator[Event]:
    """The conversation's events and its turns' events, in order, from the start or
    from just after `after`; ends with the conversation. A `turn` event carries the
    link to that turn's history (`history_url`)."""
    async for offset, event in chat_events(client, chat_id, after.chat if after else 0):
        # Resuming, the conversation event at `after` was sent already; read again
        # only to know which turn it started.
        resumed = after is not None and offset == after.chat
        if not resumed:
            data = event.model_dump(mode="json")
            if isinstance(event, TurnStarted):
                data["url"] = history_url(event.turn_id)
            yield Event(Position(offset), event.type, data)
        if isinstance(event, TurnStarted):
            start = after.turn if resumed and after else 0
            async for n, turn_event in turn_events(client, event.turn_id, start):
                data = {"turn_id": event.turn_id, **turn_event.model_dump(mode="json")}
                yield Event(Position(offset, n + 1), turn_event.type, data)
        if isinstance(event, ChatEnded):
            return


async def one_turn(
    client: Client, turn_id: str, opening: dict[str, Any], after: Position | None = None
) -> AsyncIterator[Event]:
    """A turn by itself (a fork, say, which no conversation started): its `turn` event
    (`opening`), then its own events, positioned as a conversation's first turn's
    would be (`0.<n>`); ends with the turn."""
    if after is None:
        yield Event(Position(0), "turn", opening)
    async for n, turn_event in turn_events(client, turn_id, after.turn if after else 0):
        data = {"turn_id": turn_id, **turn_event.model_dump(mode="json")}
        yield Event(Position(0, n + 1), turn_event.type, data)


async def with_keepalive(
    items: AsyncIterator[T], every: float, stop: asyncio.Event
) -> AsyncIterator[T | None]:
    """`items` until `stop` is set, and None whenever `every` seconds pass without
    one: something to write, so proxies keep the connection and a closed one is
    noticed."""
    pending = asyncio.ensure_future(anext(items))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while True:
            done, _ = await asyncio.wait(
                {pending, stopping}, timeout=every, return_when=asyncio.FIRST_COMPLETED
            )
            if stopping in done:
                return
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            yield item
            pending = asyncio.ensure_future(anext(items))
    finally:
        for task in (pending, stopping):
            task.cancel()
        await asyncio.gather(pending, stopping, return_exceptions=True)
