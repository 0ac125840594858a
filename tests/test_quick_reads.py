"""Quick reads run as local activities: no task-queue round trip, one marker in the
history; a quick read that runs long runs again as a regular activity."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType

from durable_agent.model import Reply
from durable_agent.scripted import ScriptedModel
from durable_agent.shop.tools import TOOLS
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, ToolCall
from durable_agent.workflows.policies import QUICK_TIMEOUT
from tests.conftest import Harness, last_result


class Lookup(BaseModel):
    key: str


@tool(quick=True, timeout=timedelta(seconds=10), max_attempts=1)
def slow_lookup(args: Lookup, ctx: ToolContext) -> str:
    """A lookup that takes longer than a quick read may."""
    time.sleep(QUICK_TIMEOUT.total_seconds() + 0.5)
    return f"found {args.key}"


def one_call(name: str, **arguments: str) -> ScriptedModel:
    return ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name=name, arguments=arguments)])],
        decisions=[lambda request: Reply(text=last_result(request))],
    )


async def dispatches(handle) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(regular dispatch activities, local activity markers) in the turn's history."""
    regular = markers = 0
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            regular += attrs.activity_type.name == "dispatch"
        markers += event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    return regular, markers


async def test_a_quick_read_is_a_local_activity(harness: Harness) -> None:
    model = one_call("order_status", order_id="123456")
    result, handle = await harness.ask_with_handle("Has 123456 shipped?", model=model)
    assert result.outcome is Outcome.ANSWERED and "Herbal Handsoap" in result.answer
    regular, _ = await dispatches(handle)
    assert regular == 0


async def test_a_write_is_never_a_local_activity(harness: Harness) -> None:
    with pytest.raises(TypeError, match="side effects cannot be quick"):

        @tool(quick=True, side_effects=True)
        def write(args: Lookup, ctx: ToolContext) -> str:
            """Writes."""
            return ""


async def test_a_quick_read_that_runs_long_runs_again_as_an_activity(harness: Harness) -> None:
    tools = ToolRegistry([*TOOLS.tools.values(), slow_lookup])
    model = one_call("slow_lookup", key="k1")
    result, handle = await harness.ask_with_handle("look k1 up", model=model, tools=tools)
    assert result.answer == "found k1"
    regular, _ = await dispatches(handle)
    assert regular == 1
