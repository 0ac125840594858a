"""Durable waits and events from the world (`durable_agent.waits`): a turn waits on a
durable timer for days, a person wakes it, an event ends it, and what ended it is an
observation with a tool result's provenance."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentClient
from durable_agent.errors import InvalidEvent, NotWaiting
from durable_agent.model import Reply
from durable_agent.runtime.turns import progress_of, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import TOOLS
from durable_agent.tools import ToolRegistry
from durable_agent.types import (
    Outcome,
    Step,
    StepKind,
    ToolCall,
    TurnInput,
    TurnLimits,
    TurnOutput,
    TurnProgress,
)
from durable_agent.waits import MAX_EVENT_BYTES, wait, wait_for_event
from tests.conftest import Harness, last_result

WAITING_TOOLS = ToolRegistry([*TOOLS.tools.values(), wait, wait_for_event])


def waits_for(**arguments: Any) -> ToolCall:
    return ToolCall(id="w1", name="wait", arguments=arguments)


def waits_for_event(name: str, timeout: str) -> ToolCall:
    return ToolCall(id="e1", name="wait_for_event", arguments={"name": name, "timeout": timeout})


def scripted(first: ToolCall, *then: Reply) -> ScriptedModel:
    return ScriptedModel(plans=[Reply(calls=[first])], decisions=[*then, Reply(text="Done.")])


async def until(
    handle: WorkflowHandle, ready: Callable[[TurnProgress], bool], timeout: float = 30
) -> TurnProgress:
    deadline = time.monotonic() + timeout
    while True:
        progress = await progress_of(handle)
        if ready(progress):
            return progress
        assert time.monotonic() < deadline, [s.render() for s in progress.steps]
        await asyncio.sleep(0.1)


def waiting(progress: TurnProgress) -> bool:
    return any(s.kind is StepKind.WAIT for s in progress.steps)


def of_kind(result: TurnOutput, kind: StepKind) -> list[Step]:
    return [s for s in result.steps if s.kind is kind]


async def start(harness: Harness, model: ScriptedModel, task_queue: str, **limits: Any):  # type: ignore[no-untyped-def]
    turn = TurnInput(
        question="Has the refund for order 123456 arrived?",
        customer_id="demo",
        model="scripted",
        limits=TurnLimits(**limits),
    )
    return await start_turn(harness.client, turn, task_queue)


async def test_a_turn_waits_three_days_and_goes_on(
    skipping_env: WorkflowEnvironment, skipping_harness: Harness
) -> None:
    """Three days on a durable timer (the time-skipping server skips them), longer than
    the turn's max_duration (2 min), which a wait does not count: then the model reads
    that the wait ended as planned, and answers."""
    model = scripted(waits_for(**{"for": "P3D", "reason": "the refund may have arrived by then"}))
    before = await skipping_env.get_current_time()
    result = await skipping_harness.ask("Has the refund arrived?", model=model, tools=WAITING_TOOLS)

    assert result.outcome is Outcome.ANSWERED, "\n".join(s.text for s in result.steps)
    assert await skipping_env.get_current_time() - before >= timedelta(days=3)
    (step,) = of_kind(result, StepKind.WAIT)
    assert "waits for the time until" in step.text and "(3 days)" in step.text
    assert "the refund may have arrived by then" in step.text
    assert "waited 3 days" in last_result(model.requests[-1][1])


async def test_wake_ends_the_wait_early(skipping_harness: Harness) -> None:
    model = scripted(waits_for(**{"for": "P3D", "reason": "refund"}))
    async with skipping_harness.worker(model, WAITING_TOOLS) as task_queue:
        handle = await start(skipping_harness, model, task_queue)
        await until(handle, waiting)
        woke = await AgentClient(skipping_harness.client).turn(handle.id).wake(by="alice")
        result = await handle.result()

    assert woke.calls == ["w1"]
    assert result.outcome is Outcome.ANSWERED
    read = last_result(model.requests[-1][1])
    assert "woken early by alice" in read and "before the wait's end" in read


async def test_max_wait_refuses_a_longer_wait(skipping_harness: Harness) -> None:
    """A wait over the agent's max_wait is refused before it starts: no timer, and the
    model reads why (it may wait less, or tell the customer)."""
    model = scripted(waits_for(**{"for": "P10D", "reason": "refund"}))
    limits = TurnLimits(max_wait=timedelta(days=7))
    result = await skipping_harness.ask(
        "Has the refund arrived?", model=model, tools=WAITING_TOOLS, limits=limits
    )

    assert result.outcome is Outcome.ANSWERED
    assert of_kind(result, StepKind.WAIT) == []
    read = last_result(model.requests[-1][1])
    assert "10 days is longer than this agent may wait at once (max_wait 7 days)" in read


async def test_an_event_through_the_client_resumes_the_turn(skipping_harness: Harness) -> None:
    model = scripted(waits_for_event("delivered", "P2D"))
    async with skipping_harness.worker(model, WAITING_TOOLS) as task_queue:
        handle = await start(skipping_harness, model, task_queue)
        await until(handle, waiting)
        turn = AgentClient(skipping_harness.client).turn(handle.id)
        with pytest.raises(NotWaiting, match="waits for no event 'returned' .*'delivered'"):
            await turn.send_event("returned", {})
        woke = await turn.send_event(
            "delivered", {"parcel": "JD014600", "at": "door"}, by="carrier"
        )
        result = await handle.result()

    assert woke.calls == ["e1"]
    assert result.outcome is Outcome.ANSWERED
    (step,) = of_kind(result, StepKind.WAIT)
    assert "waits for event 'delivered' until" in step.text and "(2 days)" in step.text
    read = last_result(model.requests[-1][1])
    assert "JD014600" in read and "carrier" in read


async def test_a_timeout_is_an_observation(skipping_harness: Harness) -> None:
    model = scripted(waits_for_event("delivered", "PT6H"))
    result = await skipping_harness.ask("Was it delivered?", model=model, tools=WAITING_TOOLS)

    assert result.outcome is Outcome.ANSWERED
    read = last_result(model.requests[-1][1])
    assert "no event 'delivered' arrived within 6 h" in read and "the timeout passed" in read


async def test_an_oversized_event_is_refused_in_one_line(skipping_harness: Harness) -> None:
    model = scripted(waits_for_event("delivered", "P2D"))
    async with skipping_harness.worker(model, WAITING_TOOLS) as task_queue:
        handle = await start(skipping_harness, model, task_queue)
        await until(handle, waiting)
        turn = AgentClient(skipping_harness.client).turn(handle.id)
        with pytest.raises(InvalidEvent) as refused:
            await turn.send_event("delivered", {"note": "x" * MAX_EVENT_BYTES})
        assert "over the 65,536 an event may carry" in str(refused.value)
        assert "\n" not in str(refused.value)
        await turn.send_event("delivered", {"note": "fits"})
        await handle.result()
    assert "fits" in last_result(model.requests[-1][1])
