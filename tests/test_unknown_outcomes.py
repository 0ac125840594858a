"""A write whose outcome is unknown (it may have run, and the system it went to takes
no idempotency key: an MCP server's, say) is never sent again by itself: the turn
asks a person, and sends it again only if they say so."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from durable_agent import Agent
from durable_agent.errors import OutcomeUnknown
from durable_agent.model import Reply
from durable_agent.runtime.turns import decide, progress_of, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.tools import ToolContext, ToolRegistry, schema_tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput
from tests.conftest import Harness, last_result

BOOK = ToolCall(id="c1", name="book_slot", arguments={"slot": "Tuesday 10:00"})


def flaky_booking() -> tuple[ToolRegistry, list[str]]:
    """A booking whose first call loses its answer; the second goes through."""
    sent: list[str] = []

    def book(args: dict[str, Any], ctx: ToolContext[Any]) -> str:
        sent.append(args["slot"])
        if len(sent) == 1:
            raise OutcomeUnknown("the booking system did not answer after taking the call")
        return f"booked {args['slot']}"

    tool = schema_tool(
        "book_slot",
        "Book a slot.",
        {"type": "object", "properties": {"slot": {"type": "string"}}, "required": ["slot"]},
        book,
        side_effects=True,
    )
    return ToolRegistry([tool]), sent


async def decide_next(harness: Harness, handle: Any, approved: bool) -> str:
    """Wait for the next call awaiting approval, decide it, and return why it waited."""
    while not (pending := (await progress_of(handle)).pending):
        await asyncio.sleep(0.05)
    await decide(harness.client, handle.id, pending[0].call.id, approved=approved, by="test")
    return pending[0].why


@pytest.mark.parametrize("again", [True, False])
async def test_an_unknown_outcome_is_sent_again_only_with_consent(
    harness: Harness, again: bool
) -> None:
    tools, sent = flaky_booking()
    model = ScriptedModel(
        plans=[Reply(calls=[BOOK])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with harness.worker(model, tools) as task_queue:
        handle = await start_turn(
            harness.client, TurnInput(question="Book Tuesday 10:00", model="scripted"), task_queue
        )
        await decide_next(harness, handle, approved=True)  # the write's own consent
        why = await decide_next(harness, handle, approved=again)
        result = await handle.result()
    assert "it may have run already" in why and "did not answer" in why
    assert result.outcome is Outcome.ANSWERED
    approvals = [s for s in result.steps if s.kind is StepKind.APPROVAL]
    assert len(approvals) == 2
    if again:
        assert sent == ["Tuesday 10:00", "Tuesday 10:00"]
        assert result.answer == "booked Tuesday 10:00"
    else:
        assert sent == ["Tuesday 10:00"]  # never sent again
        assert "was not sent again" in result.answer


async def test_an_agent_can_leave_an_unknown_outcome_to_the_model(harness: Harness) -> None:
    """`Agent(unknown_outcomes="model")`: nobody is asked again; the model reads that
    the write may have run and was not sent again, and answers from that."""
    tools, sent = flaky_booking()
    model = ScriptedModel(
        plans=[Reply(calls=[BOOK])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    agent = replace(harness.agent(tools), unknown_outcomes="model")
    async with harness.worker(model, agents=[agent]) as task_queue:
        handle = await start_turn(
            harness.client, TurnInput(question="Book Tuesday 10:00", model="scripted"), task_queue
        )
        await decide_next(harness, handle, approved=True)  # the write's own consent
        result = await handle.result()
    assert sent == ["Tuesday 10:00"]  # never sent again
    assert [s.kind for s in result.steps].count(StepKind.APPROVAL) == 1
    told = last_result(model.requests[-1][1])
    assert "the outcome is unknown, it may have run already" in told
    assert "did not answer after taking the call" in told and "not sent again" in told
    assert result.outcome is Outcome.ANSWERED


def test_unknown_outcomes_takes_ask_or_model() -> None:
    with pytest.raises(ValueError, match="unknown_outcomes='retry': use 'ask'"):
        Agent(name="booker", unknown_outcomes="retry")  # type: ignore[arg-type]
