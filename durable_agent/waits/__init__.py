"""Durable waits inside a turn: the built-in tools `wait` and `wait_for_event`, which
the turn's workflow runs itself on a durable timer, holding no worker while it waits.

    from durable_agent.waits import wait, wait_for_event

    agent = Agent(
        name="refunds",
        tools=[refund_status, wait, wait_for_event],
        limits=TurnLimits(max_wait=timedelta(days=14)),  # the longest one wait may be
    )

A person wakes a waiting turn early (`TurnHandle.wake()`, `durable-agent wake ID`); an
event ends a `wait_for_event` (`TurnHandle.send_event(name, data)`, `durable-agent
event ID NAME JSON`, the FastAPI example's `POST /turns/{id}/events/{name}`). What ends
a wait (the time, the event's data, a person) is the call's result: an observation the
tool-output shields screen, data and never instructions, that a write may take a value
from only with consent. docs/schedules-and-waits.md tells the whole of it.
"""

from durable_agent.waits._events import (
    EVENT_NAME_PATTERN,
    MAX_EVENT_BYTES,
    Wake,
    Woke,
    WorldEvent,
    checked_event,
    checked_name,
)
from durable_agent.waits._tools import (
    WaitArgs,
    WaitForEventArgs,
    Waiting,
    ended,
    planned,
    wait,
    wait_for_event,
)

__all__ = [
    "EVENT_NAME_PATTERN",
    "MAX_EVENT_BYTES",
    "WorldEvent",
    "Wake",
    "WaitArgs",
    "WaitForEventArgs",
    "Waiting",
    "Woke",
    "checked_event",
    "checked_name",
    "ended",
    "planned",
    "wait",
    "wait_for_event",
]
