"""What ends a wait from outside: an event (`WorldEvent`) or a person (`Wake`), as the
turn's `event` and `wake` updates take them, and the checks both the client and the
turn's update validator make (so a refused event leaves no trace in the history)."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field

from durable_agent.errors import InvalidEvent

EVENT_NAME_PATTERN = r"[A-Za-z0-9_.:-]{1,64}"
"""An event's name: what `wait_for_event` waits for, and a URL's path segment."""

MAX_EVENT_BYTES = 64 * 1024
"""The most an event's data may be, as compact JSON (UTF-8). Above the payload store's
threshold it travels by reference, as a large tool result does; the model reads at
most `wait_for_event`'s result limit of it."""

MAX_BY_CHARS = 200


class WorldEvent(BaseModel):
    """An event from the world for a turn that waits for one of its name."""

    name: str
    data: Any = None
    """Any JSON value (at most `MAX_EVENT_BYTES`)."""
    by: str = Field(default="", max_length=MAX_BY_CHARS)
    """Who sent it, for the record (a person, `webhook`)."""


class Wake(BaseModel):
    """A person ends the turn's waits early."""

    by: str = Field(default="", max_length=MAX_BY_CHARS)


class Woke(BaseModel):
    """What an event or a wake-up ended: the waiting calls, by id, and their tools."""

    calls: list[str]
    tools: list[str]
    later: bool = False
    """Sent while no worker ran the turn: recorded in its history, it applies when one
    runs the turn again, if the turn still waits for it (`calls` is empty then)."""


def checked_name(name: str) -> str:
    """`name`, or `InvalidEvent` saying what a name may be."""
    if not isinstance(name, str) or not re.fullmatch(EVENT_NAME_PATTERN, name):
        shown = repr(name)[:70]
        raise InvalidEvent(
            f"event name {shown}: give 1-64 letters, digits, '_', '-', '.' or ':' "
            "(the name the turn's wait_for_event waits for)"
        )
    return name


def checked_event(event: WorldEvent) -> WorldEvent:
    """`event`, or `InvalidEvent` in one line: a bad name, data that is not JSON (NaN,
    infinities, values JSON has no word for), or data over `MAX_EVENT_BYTES`."""
    checked_name(event.name)
    try:
        text = json.dumps(event.data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        size = len(text.encode())
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidEvent(f"event {event.name}: its data is not JSON ({e}); send JSON") from None
    if size > MAX_EVENT_BYTES:
        raise InvalidEvent(
            f"event {event.name}: its data is {size:,} bytes of JSON, over the "
            f"{MAX_EVENT_BYTES:,} an event may carry; send less, or a reference (a URL, an id) "
            "the agent's tools can look up"
        )
    return event
