"""Caps that need time to pass, on the time-skipping test server: the turn's
durable timer (max_duration) and a model that keeps failing through every retry."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from durable_agent.errors import ModelUnavailable, ToolUnavailable
from durable_agent.model import Reply
from durable_agent.scripted import ScriptedModel
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnLimits
from tests.conftest import Harness


class Nothing(BaseModel):
    pass


async def test_time_cap_ends_the_turn_gracefully(skipping_harness: Harness) -> None:
    attempts = []

    @tool(max_attempts=1000, timeout=timedelta(seconds=5))
    def down(args: Nothing, ctx: ToolContext[object]) -> str:
        """A backend that stays down; Temporal keeps retrying it with backoff."""
        attempts.append(1)
        raise ToolUnavailable("warehouse API is down")

    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="down")])],
        decisions=[Reply(text="unreachable")],
    )
    result = await skipping_harness.ask(
        "anything",
        model=model,
        tools=ToolRegistry([down]),
        limits=TurnLimits(max_duration=timedelta(minutes=2)),
    )
    assert result.outcome is Outcome.TIME_LIMIT
    assert result.answer.startswith("Sorry, I ran out of time (120 s)")
    assert result.steps[-1].kind is StepKind.LIMIT
    assert 5 <= len(attempts) < 30  # backoff capped at 10 s over 120 skipped seconds
    assert model.calls("interpret") == 0


async def test_model_that_always_fails_gets_a_graceful_answer(skipping_harness: Harness) -> None:
    model = ScriptedModel(plans=[ModelUnavailable("503 from the model endpoint")])
    result = await skipping_harness.ask("Has order 123456 shipped?", model=model)
    assert result.outcome is Outcome.MODEL_ERROR
    assert "the language model is unavailable" in result.answer
    assert model.calls("plan") == 5  # MODEL_RETRY.maximum_attempts
    assert any("503 from the model endpoint" in s.text for s in result.steps)
