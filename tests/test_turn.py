"""Turns on a real Temporal dev server: the seed's cases, and a scripted model
driving each way a model or a tool can misbehave."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pydantic import BaseModel

from agent.errors import ModelUnavailable
from agent.model import Decision, Plan
from agent.scripted import ScriptedModel
from agent.tools import ToolContext, ToolRegistry, tool
from agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits, Usage
from client import start_turn
from tests.conftest import SEED_CASES, Harness, kinds
from workflows import AgentTurn


def order_call(order_id: object = "123456", id: str = "c1") -> ToolCall:
    return ToolCall(id=id, name="order_status", arguments={"order_id": order_id})


ANSWER = Decision(final=True, text="done")


@pytest.mark.parametrize(("question", "expected"), SEED_CASES)
async def test_seed_cases(harness: Harness, question: str, expected: str) -> None:
    result = await harness.ask(question)
    assert result.outcome is Outcome.ANSWERED
    assert expected in result.answer
    assert result.steps[-1].kind is StepKind.ANSWER


async def test_tool_turn_reads_as_a_story(harness: Harness) -> None:
    result = await harness.ask("Has order 123456 shipped?")
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
    assert result.steps[0].text == "order_status(order_id='123456')"
    assert result.usage.model_calls == 2


async def test_another_customers_order_reads_like_an_unknown_one(harness: Harness) -> None:
    theirs = await harness.ask("Which item was ordered for 567890?")
    unknown = await harness.ask("Which item was ordered for 999999?")
    assert theirs.answer == unknown.answer == "Order not found. Please check your Order ID."
    own = await harness.ask("Which item was ordered for 567890?", customer_id="cust-002")
    assert "Cedar Beard Oil" in own.answer


async def test_several_calls_run_in_one_iteration(harness: Harness) -> None:
    result = await harness.ask("Has order 123456 shipped and is return rtn001 processed?")
    assert "Herbal Handsoap" in result.answer and "processed" in result.answer
    assert kinds(result).count("tool_call") == 2
    assert {s.iteration for s in result.steps} == {1}


async def test_unknown_tool_is_replanned(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[
            Plan(calls=[ToolCall(id="c1", name="track_parcel", arguments={"id": "1"})]),
            Plan(calls=[order_call()]),
        ],
        decisions=[ANSWER],
    )
    result = await harness.ask("Has order 123456 shipped?", model=model)
    assert result.outcome is Outcome.ANSWERED
    assert kinds(result) == ["plan", "rejected", "plan", "tool_call", "observation", "answer"]
    assert "unknown tool 'track_parcel'" in result.steps[1].text
    assert "order_status" in result.steps[1].text  # the rejection lists the real tools
    # The re-plan saw the rejection.
    replan_request = model.requests[1][1]
    assert replan_request.steps[-1].kind is StepKind.REJECTED


async def test_missing_argument_is_rejected_with_the_field_name(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[Plan(calls=[ToolCall(id="c1", name="order_status")]), Plan(calls=[order_call()])],
        decisions=[ANSWER],
    )
    result = await harness.ask("Has my order shipped?", model=model)
    rejected = [s for s in result.steps if s.kind is StepKind.REJECTED]
    assert len(rejected) == 1
    assert "order_id: Field required" in rejected[0].text


async def test_wrong_id_format_gives_up_after_two_replans(harness: Harness) -> None:
    model = ScriptedModel(plans=[Plan(calls=[order_call("12ab")])], decisions=[ANSWER])
    result = await harness.ask("Has order 12ab shipped?", model=model)
    assert model.calls("plan") == 3  # first plan + 2 re-plans
    assert kinds(result) == [
        "plan",
        "rejected",
        "plan",
        "rejected",
        "plan",
        "observation",
        "answer",
    ]
    final_observation = result.steps[-2].observation
    assert final_observation is not None and not final_observation.ok
    assert "should match pattern" in final_observation.text
    assert model.calls("interpret") == 1  # the model still gets to answer


class Nothing(BaseModel):
    pass


async def test_a_tool_that_raises_is_an_observation(harness: Harness) -> None:
    attempts = []

    @tool(max_attempts=2, timeout=timedelta(seconds=5))
    def flaky(args: Nothing, ctx: ToolContext[object]) -> str:
        """Always breaks."""
        attempts.append(ctx.idempotency_key)
        raise RuntimeError("inventory service returned garbage")

    model = ScriptedModel(plans=[Plan(calls=[ToolCall(id="c1", name="flaky")])], decisions=[ANSWER])
    result = await harness.ask("anything", model=model, tools=ToolRegistry([flaky]))
    assert result.outcome is Outcome.ANSWERED
    observation = result.steps[-2].observation
    assert observation is not None and not observation.ok
    assert "inventory service returned garbage" in observation.text
    assert len(attempts) == 2 and len(set(attempts)) == 1  # retried, same idempotency key


async def test_a_tool_that_times_out_is_an_observation(harness: Harness) -> None:
    @tool(max_attempts=1, timeout=timedelta(milliseconds=300))
    async def slow(args: Nothing, ctx: ToolContext[object]) -> str:
        """Never answers in time."""
        await asyncio.sleep(30)
        return "too late"

    model = ScriptedModel(plans=[Plan(calls=[ToolCall(id="c1", name="slow")])], decisions=[ANSWER])
    result = await harness.ask("anything", model=model, tools=ToolRegistry([slow]))
    assert result.outcome is Outcome.ANSWERED
    observation = result.steps[-2].observation
    assert observation is not None
    assert observation.text.startswith("slow timed out after 0.3 s")


async def test_not_found_is_not_retried(harness: Harness) -> None:
    calls = []

    @tool
    def lookup(args: Nothing, ctx: ToolContext[object]) -> str:
        """Finds nothing."""
        from agent.errors import NotFound

        calls.append(1)
        raise NotFound("Order not found. Please check your Order ID.")

    model = ScriptedModel(
        plans=[Plan(calls=[ToolCall(id="c1", name="lookup")])], decisions=[ANSWER]
    )
    await harness.ask("anything", model=model, tools=ToolRegistry([lookup]))
    assert len(calls) == 1


async def test_model_failing_transiently_is_retried(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[
            ModelUnavailable("throttled"),
            ModelUnavailable("throttled"),
            Plan(calls=[order_call()]),
        ],
        decisions=[ANSWER],
    )
    result = await harness.ask("Has order 123456 shipped?", model=model)
    assert result.outcome is Outcome.ANSWERED
    assert model.calls("plan") == 3
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]


async def test_never_finishing_model_hits_the_step_cap(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[Plan(calls=[order_call()])],
        decisions=[Decision(final=False, text="check again")],
    )
    result = await harness.ask(
        "Has order 123456 shipped?", model=model, limits=TurnLimits(max_steps=3)
    )
    assert result.outcome is Outcome.STEP_LIMIT
    assert "could not finish within 3 steps" in result.answer
    assert "Herbal Handsoap" in result.answer  # what it found so far
    assert model.calls("plan") == 3 and model.calls("interpret") == 3
    assert kinds(result).count("continue") == 3
    assert result.steps[-1].kind is StepKind.LIMIT


async def test_continue_carries_the_next_question(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[Plan(calls=[order_call()]), Plan(calls=[order_call("234567", "c2")])],
        decisions=[Decision(final=False, text="And order 234567?"), ANSWER],
    )
    result = await harness.ask("Compare orders 123456 and 234567", model=model)
    assert result.outcome is Outcome.ANSWERED
    assert [s.iteration for s in result.steps if s.kind is StepKind.TOOL_CALL] == [1, 2]
    assert any(s.kind is StepKind.CONTINUE and s.text == "And order 234567?" for s in result.steps)


async def test_progress_query_returns_the_steps(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        handle = await start_turn(
            harness.client, TurnInput(question="Has order 123456 shipped?"), task_queue
        )
        result = await handle.result()
        progress = await handle.query(AgentTurn.progress)
    assert progress.done
    assert progress.steps == result.steps


async def test_huge_tool_output_never_enters_history_whole(harness: Harness) -> None:
    @tool
    def dump(args: Nothing, ctx: ToolContext[object]) -> dict[str, str]:
        """Returns far too much."""
        return {"log": "x" * 300_000}

    model = ScriptedModel(plans=[Plan(calls=[ToolCall(id="c1", name="dump")])], decisions=[ANSWER])
    result, handle = await harness.ask_with_handle(
        "anything", model=model, tools=ToolRegistry([dump])
    )
    observation = result.steps[-2].observation
    assert observation is not None and "[truncated" in observation.text
    assert len(observation.text) < 2100
    history = await handle.fetch_history()
    assert history.events and max(e.ByteSize() for e in history.events) < 64 * 1024


async def test_token_budget_ends_the_turn_gracefully(harness: Harness) -> None:
    usage = Usage(model_calls=1, input_tokens=80, output_tokens=20)
    model = ScriptedModel(
        plans=[Plan(calls=[order_call()], usage=usage)],
        decisions=[Decision(final=False, text="check again", usage=usage)],
    )
    result = await harness.ask(
        "Has order 123456 shipped?", model=model, limits=TurnLimits(max_tokens=250)
    )
    assert result.outcome is Outcome.TOKEN_LIMIT
    assert result.answer.startswith("Sorry, I used up this question's budget of 250 tokens.")
    assert "Herbal Handsoap" in result.answer
    assert len(model.requests) == 3  # 100, 200, 300 tokens: no fourth call
    assert result.usage.input_tokens + result.usage.output_tokens == 300
