"""Caps that need time to pass, on the time-skipping test server: the turn's
max_duration (which bounds every activity) and a model that keeps failing through
every retry."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pydantic import BaseModel

from durable_agent.errors import InvalidModelOutput, ModelError, ModelUnavailable, ToolUnavailable
from durable_agent.model import Reply
from durable_agent.scripted import ScriptedModel
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnLimits
from tests.conftest import Harness


class Nothing(BaseModel):
    pass


async def test_time_cap_stops_a_call_still_running_and_ends_the_turn_gracefully(
    harness: Harness,
) -> None:
    """max_duration bounds every activity (no timer of the turn's own): a tool that never
    answers is stopped when the time is up, and the turn answers with what it has.
    (Real time: the test server skips no time while an activity runs.)"""

    @tool(timeout=timedelta(minutes=10))
    async def stuck(args: Nothing, ctx: ToolContext[object]) -> str:
        """A backend that accepts the request and never answers."""
        await asyncio.Event().wait()
        return "never"

    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="stuck")])],
        decisions=[Reply(text="unreachable")],
    )
    result = await harness.ask(
        "anything",
        model=model,
        tools=ToolRegistry([stuck]),
        limits=TurnLimits(max_duration=timedelta(seconds=2)),
    )
    assert result.outcome is Outcome.TIME_LIMIT
    assert result.answer.startswith("Sorry, I ran out of time (2 s)")
    assert result.steps[-1].kind is StepKind.LIMIT
    assert model.calls("interpret") == 0


async def test_a_tool_that_keeps_failing_is_retried_only_while_the_turn_has_time(
    skipping_harness: Harness,
) -> None:
    """Retries stop where the turn's time would run out (Temporal schedules no attempt
    past an activity's schedule-to-close timeout): the model reads the last failure in
    the time left, and the turn ends within max_duration."""
    attempts = []

    @tool(max_attempts=1000, timeout=timedelta(seconds=5))
    def down(args: Nothing, ctx: ToolContext[object]) -> str:
        """A backend that stays down; Temporal keeps retrying it with backoff."""
        attempts.append(1)
        raise ToolUnavailable("warehouse API is down")

    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="down")])],
        decisions=[Reply(text="The warehouse is down; try again later.")],
    )
    result, handle = await skipping_harness.ask_with_handle(
        "anything",
        model=model,
        tools=ToolRegistry([down]),
        limits=TurnLimits(max_duration=timedelta(minutes=2)),
    )
    assert result.outcome is Outcome.ANSWERED
    assert 5 <= len(attempts) < 30  # backoff capped at 10 s over 120 skipped seconds
    assert "down: warehouse API is down" in [s.text for s in result.steps]
    history = await handle.fetch_history()
    took = history.events[-1].event_time.ToDatetime() - history.events[0].event_time.ToDatetime()
    assert took <= timedelta(minutes=2)


async def test_model_that_always_fails_gets_a_graceful_answer(
    skipping_harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(plans=[ModelUnavailable("503 from the model endpoint")])
    result = await skipping_harness.ask("Has order 123456 shipped?", model=model)
    assert result.outcome is Outcome.MODEL_ERROR
    assert "the language model is unavailable" in result.answer
    assert model.calls("plan") == 5  # MODEL_RETRY.maximum_attempts
    # The step says the kind of failure; the error's own words are the operator's.
    assert "model unavailable: scripted failed (unavailable)" in [s.text for s in result.steps]
    assert "503 from the model endpoint" in caplog.text


class QuotaExhausted(ModelError):
    """An agent's own permanent error, defined after the worker's code was imported."""


@pytest.mark.parametrize(
    "error",
    [InvalidModelOutput("no calls and no text"), QuotaExhausted("monthly quota used up")],
)
async def test_permanent_model_errors_are_not_retried(
    harness: Harness, error: ModelError, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(plans=[error])
    result, handle = await harness.ask_with_handle("Has order 123456 shipped?", model=model)
    assert result.outcome is Outcome.MODEL_ERROR
    assert model.calls("plan") == 1
    assert "model reply unusable: scripted failed (reply unusable)" in [
        s.text for s in result.steps
    ]
    assert str(error) in caplog.text and str(error) not in result.answer
    # Said by the activity, not by a list of error types in each scheduled event.
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled and not any(a.retry_policy.non_retryable_error_types for a in scheduled)
