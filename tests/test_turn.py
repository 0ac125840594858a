"""Turns on a real Temporal dev server: the seed's cases, and a scripted model
driving each way a model or a tool can misbehave."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client

from durable_agent.answers import markdown_safe
from durable_agent.bench.models import EXPECTED_MODEL_CALLS, TASK_QUESTION, TaskModel
from durable_agent.conversation import AssistantMessage, ToolResult, latest_results
from durable_agent.errors import ModelUnavailable
from durable_agent.model import Reply
from durable_agent.render import MAX_OBSERVATION_CHARS
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.turns import start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import TOOLS
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits, Usage
from durable_agent.workflows import AgentTurn
from tests.conftest import SEED_CASES, Harness, kinds, story


def order_call(order_id: object = "123456", id: str = "c1") -> ToolCall:
    return ToolCall(id=id, name="order_status", arguments={"order_id": order_id})


ANSWER = Reply(text="done")
ANSWERS = [ANSWER]


@pytest.mark.parametrize(("question", "expected"), SEED_CASES)
async def test_seed_cases(harness: Harness, question: str, expected: str) -> None:
    result = await harness.ask(question)
    assert result.outcome is Outcome.ANSWERED
    assert expected in result.answer
    assert story(result)[-1].kind is StepKind.ANSWER


async def test_tool_turn_reads_as_a_story(harness: Harness) -> None:
    result = await harness.ask("Has order 123456 shipped?")
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
    plan = next(s for s in result.steps if s.kind is StepKind.PLAN)
    assert plan.text == "order_status(order_id='123456')"
    # Screened on the way in and out by the default (offline) shields.
    shields = [s.text for s in result.steps if s.kind is StepKind.SHIELD]
    assert shields == [
        "input: allowed by offline",
        "tool_input order_status(order_id='123456'): allowed by offline",
        "tool_output order_status(order_id='123456'): allowed by offline",
        "output: allowed by offline",
    ]
    assert result.usage.model_calls == 2


async def test_web_ui_details_tell_the_turn_step_by_step(harness: Harness) -> None:
    turn = TurnInput(question="Has order 123456 shipped?", model="offline")
    async with harness.worker(None, TOOLS) as task_queue:
        handle = await start_turn(harness.client, turn, task_queue)
        result = await handle.result()
        metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    lines = metadata.current_details.splitlines()
    # One line per step, as `show` prints them, Markdown-escaped, then the usage.
    assert lines[:-1] == [markdown_safe(s.render()) for s in result.steps]
    assert lines[1].startswith("\\[1\\] plan")
    assert lines[1].endswith("order\\_status(order\\_id='123456')")
    assert lines[-1].startswith("usage: 2 model call(s)")


async def test_another_customers_order_reads_like_an_unknown_one(harness: Harness) -> None:
    theirs = await harness.ask("Which item was ordered for 567890?")
    unknown = await harness.ask("Which item was ordered for 999999?")
    assert theirs.answer == unknown.answer == "Order not found. Please check your Order ID."
    own = await harness.ask("Which item was ordered for 567890?", customer_id="cust-002")
    assert "Cedar Beard Oil" in own.answer


async def test_several_calls_run_in_one_iteration(harness: Harness) -> None:
    result = await harness.ask("Has order 123456 shipped and is return rtn001 processed?")
    assert "order 123456 shipped on 2026-11-18" in result.answer and "processed" in result.answer
    assert kinds(result).count("tool_call") == 2
    assert {s.iteration for s in result.steps} == {1}


async def test_unknown_tool_is_replanned(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[
            Reply(calls=[ToolCall(id="c1", name="track_parcel", arguments={"id": "1"})]),
            Reply(calls=[order_call()]),
        ],
        decisions=[ANSWER],
    )
    result = await harness.ask("Has order 123456 shipped?", model=model)
    assert result.outcome is Outcome.ANSWERED
    assert kinds(result) == ["plan", "rejected", "plan", "tool_call", "observation", "answer"]
    assert "unknown tool 'track_parcel'" in story(result)[1].text
    assert "order_status" in story(result)[1].text  # the rejection lists the real tools
    # The re-plan saw its call answered with the error, as the call's result.
    *_, call, rejection = model.requests[1][1].messages
    assert isinstance(call, AssistantMessage) and call.calls[0].name == "track_parcel"
    assert isinstance(rejection, ToolResult) and rejection.call_id == "c1" and not rejection.ok
    assert rejection.text.startswith("unknown tool 'track_parcel'")
    assert result.usage.model_calls == 3


async def test_valid_calls_run_beside_a_rejected_one(harness: Harness) -> None:
    bad = ToolCall(id="c2", name="return_status", arguments={"return_id": "nope"})
    model = ScriptedModel(plans=[Reply(calls=[order_call(), bad])], decisions=[ANSWER])
    result = await harness.ask("Has order 123456 shipped and is return nope done?", model=model)
    # No re-plan: the valid call runs, and interpret reads both results at once.
    assert kinds(result) == ["plan", "rejected", "tool_call", "observation", "answer"]
    assert result.usage.model_calls == 2
    results = latest_results(model.requests[-1][1].messages)
    assert [(r.call_id, r.ok) for r in results] == [("c1", True), ("c2", False)]


@pytest.mark.parametrize(
    ("first", "then"),
    [
        pytest.param(
            [order_call("123456", "call_2"), order_call("234567", "")],
            [],
            id="an-id-less-call-beside-the-id-it-would-be-given",
        ),
        pytest.param(
            [order_call("123456", "call_2")],
            [order_call("234567", "")],
            id="an-id-less-call-after-a-round-that-used-its-id",
        ),
        pytest.param(
            [order_call("123456", "c1"), order_call("234567", "c1")],
            [order_call("345678", "c1")],
            id="one-id-in-both-rounds",
        ),
        pytest.param(
            [order_call("123456", ""), order_call("234567", "")],
            [order_call("345678", "call_1"), order_call("123456", "")],
            id="ids-left-out-then-one-given-that-was-made-up",
        ),
    ],
)
async def test_call_ids_are_unique_whatever_the_model_sends(
    harness: Harness, first: list[ToolCall], then: list[ToolCall]
) -> None:
    """Ids the model reuses, leaves out, or takes from an earlier round (its own or one
    made up for it): every call of the turn gets an id of its own, and the turn answers."""
    decisions = [Reply(text="One more.", calls=then), ANSWER] if then else [ANSWER]
    model = ScriptedModel(plans=[Reply(calls=first)], decisions=decisions)
    result = await harness.ask("Status of orders 123456, 234567 and 345678?", model=model)
    assert result.outcome is Outcome.ANSWERED, result.answer
    ids = [c.id for s in result.steps if s.kind is StepKind.TOOL_CALL for c in s.calls]
    assert len(ids) == len(first) + len(then) and len(set(ids)) == len(ids) and all(ids), ids


async def test_missing_argument_is_rejected_with_the_field_name(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="order_status")]), Reply(calls=[order_call()])],
        decisions=[ANSWER],
    )
    result = await harness.ask("Has my order shipped?", model=model)
    rejected = [s for s in result.steps if s.kind is StepKind.REJECTED]
    assert len(rejected) == 1
    assert "order_id: Field required" in rejected[0].text


async def test_wrong_id_format_gives_up_after_two_replans(harness: Harness) -> None:
    model = ScriptedModel(plans=[Reply(calls=[order_call("12ab")])], decisions=[ANSWER])
    result = await harness.ask("Has order 12ab shipped?", model=model)
    assert model.calls("plan") == 3  # first plan + 2 re-plans
    assert kinds(result) == ["plan", "rejected", "plan", "rejected", "plan", "rejected", "answer"]
    final_rejection = story(result)[-2].observation
    assert final_rejection is not None and not final_rejection.ok
    assert "should match pattern" in final_rejection.text
    assert model.calls("interpret") == 1  # the model still gets to answer, errors in hand


class Nothing(BaseModel):
    pass


async def test_a_tool_that_raises_is_an_observation(harness: Harness) -> None:
    attempts = []

    @tool(max_attempts=2, timeout=timedelta(seconds=5))
    def flaky(args: Nothing, ctx: ToolContext[object]) -> str:
        """Always breaks."""
        attempts.append(ctx.idempotency_key)
        raise RuntimeError("inventory service returned garbage")

    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="flaky")])], decisions=[ANSWER]
    )
    result = await harness.ask("anything", model=model, tools=ToolRegistry([flaky]))
    assert result.outcome is Outcome.ANSWERED
    observation = story(result)[-2].observation
    assert observation is not None and not observation.ok
    assert "inventory service returned garbage" in observation.text
    assert len(attempts) == 2 and len(set(attempts)) == 1  # retried, same idempotency key


async def test_a_tool_that_times_out_is_an_observation(harness: Harness) -> None:
    @tool(max_attempts=1, timeout=timedelta(milliseconds=300))
    async def slow(args: Nothing, ctx: ToolContext[object]) -> str:
        """Never answers in time."""
        await asyncio.sleep(30)
        return "too late"

    model = ScriptedModel(plans=[Reply(calls=[ToolCall(id="c1", name="slow")])], decisions=[ANSWER])
    result = await harness.ask("anything", model=model, tools=ToolRegistry([slow]))
    assert result.outcome is Outcome.ANSWERED
    observation = story(result)[-2].observation
    assert observation is not None
    assert observation.text.startswith("slow timed out after 0.3 s")


async def test_not_found_is_not_retried(harness: Harness) -> None:
    calls = []

    @tool
    def lookup(args: Nothing, ctx: ToolContext[object]) -> str:
        """Finds nothing."""
        from durable_agent.errors import NotFound

        calls.append(1)
        raise NotFound("Order not found. Please check your Order ID.")

    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="lookup")])], decisions=[ANSWER]
    )
    await harness.ask("anything", model=model, tools=ToolRegistry([lookup]))
    assert len(calls) == 1


async def test_model_failing_transiently_is_retried(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[
            ModelUnavailable("throttled"),
            ModelUnavailable("throttled"),
            Reply(calls=[order_call()]),
        ],
        decisions=[ANSWER],
    )
    result = await harness.ask("Has order 123456 shipped?", model=model)
    assert result.outcome is Outcome.ANSWERED
    assert model.calls("plan") == 3
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]


async def test_never_finishing_model_hits_the_step_cap(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[Reply(calls=[order_call()])], decisions=[Reply(calls=[order_call()])]
    )
    result = await harness.ask(
        "Has order 123456 shipped?", model=model, limits=TurnLimits(max_steps=3)
    )
    assert result.outcome is Outcome.STEP_LIMIT
    assert "could not finish within 3 steps" in result.answer
    assert "Herbal Handsoap" in result.answer  # what it found so far
    # 3 rounds of tools, N + 1 model calls; the 4th round's calls never run.
    assert model.calls("plan") == 1 and model.calls("interpret") == 3
    assert kinds(result).count("tool_call") == 3
    assert kinds(result).count("continue") == 3
    assert story(result)[-1].kind is StepKind.LIMIT


async def test_interpret_hands_over_the_next_calls(harness: Harness) -> None:
    second = order_call("234567", "c2")
    model = ScriptedModel(
        plans=[Reply(calls=[order_call()])],
        decisions=[Reply(text="Now the other order.", calls=[second]), ANSWER],
    )
    result = await harness.ask("Compare orders 123456 and 234567", model=model)
    assert result.outcome is Outcome.ANSWERED
    # Two sequential rounds, three model calls: plan is never asked again.
    assert [k for k, _ in model.requests] == ["plan", "interpret", "interpret"]
    assert result.usage.model_calls == 3
    assert [s.iteration for s in result.steps if s.kind is StepKind.TOOL_CALL] == [1, 2]
    (cont,) = [s for s in result.steps if s.kind is StepKind.CONTINUE]
    assert cont.text == "Now the other order. → order_status(order_id='234567')"
    # The last request holds exactly what happened, the model's own words included.
    messages = model.requests[-1][1].messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert messages[3] == AssistantMessage(text="Now the other order.", calls=[second])


async def test_results_follow_call_order_not_finish_order(harness: Harness) -> None:
    @tool
    async def slow_first(args: Nothing, ctx: ToolContext[object]) -> str:
        """Answers late."""
        await asyncio.sleep(0.5)
        return "first"

    @tool
    def fast_second(args: Nothing, ctx: ToolContext[object]) -> str:
        """Answers at once."""
        return "second"

    calls = [ToolCall(id="a", name="slow_first"), ToolCall(id="b", name="fast_second")]
    model = ScriptedModel(plans=[Reply(calls=calls)], decisions=[ANSWER])
    await harness.ask("anything", model=model, tools=ToolRegistry([slow_first, fast_second]))
    results = latest_results(model.requests[-1][1].messages)
    assert [(r.call_id, r.text) for r in results] == [("a", "first"), ("b", "second")]


async def test_progress_query_returns_the_steps(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        handle = await start_turn(
            harness.client, TurnInput(question="Has order 123456 shipped?"), task_queue
        )
        result = await handle.result()
        progress = await handle.query(AgentTurn.progress)
    assert progress.done
    assert progress.steps == result.steps


async def test_a_turn_started_beside_a_worker_starts_eagerly(harness: Harness) -> None:
    """`ask --embedded` and `web` start turns on the client their worker polls with:
    the first workflow task comes back in the start's reply, no queue round trip."""
    async with harness.worker() as task_queue:
        handle = await start_turn(
            harness.client, TurnInput(question="Has order 123456 shipped?"), task_queue
        )
        result = await handle.result()
    assert getattr(handle, "__temporal_eagerly_started") is True
    assert result.outcome is Outcome.ANSWERED


@pytest.mark.parametrize("store", [False, True])
async def test_huge_tool_output_never_enters_history_whole(
    harness: Harness, store: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    @tool
    def dump(args: Nothing, ctx: ToolContext[object]) -> dict[str, str]:
        """Returns far too much."""
        return {"log": "x" * 300_000}

    # The worker and the client, both: each reads what the other stored (or, off, every
    # payload inline, as the store is on by default).
    monkeypatch.setenv("AGENT_PAYLOAD_STORE", f"local:{tmp_path}" if store else "off")
    config = harness.client.config()
    config["data_converter"] = data_converter()
    harness = Harness(Client(**config), harness.store)
    model = ScriptedModel(plans=[Reply(calls=[ToolCall(id="c1", name="dump")])], decisions=[ANSWER])
    result, handle = await harness.ask_with_handle(
        "anything", model=model, tools=ToolRegistry([dump])
    )
    observation = story(result)[-2].observation
    assert observation is not None and "[truncated" in observation.text
    assert len(observation.text) < 2100  # the story's preview
    history = await handle.fetch_history()
    largest = max(e.ByteSize() for e in history.events)
    if not store:  # cut to the tool's limit: what the model read, and no more
        assert MAX_OBSERVATION_CHARS < largest < 2 * MAX_OBSERVATION_CHARS
        return
    # The model read 100,000 characters of it; the history holds references only.
    assert largest < 16 * 1024
    stored = [p for e in history.events for p in _payloads(e) if p.external_payloads]
    assert sum(p.external_payloads[0].size_bytes for p in stored) > MAX_OBSERVATION_CHARS


def _payloads(message: Any) -> list[Payload]:
    """Every payload in a history event, wherever it sits."""
    if isinstance(message, Payload):
        return [message]
    found = []
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = list(value.values())
        elif field.is_repeated:
            items = list(value)
        else:
            items = [value]
        for item in items:
            if hasattr(item, "ListFields"):
                found += _payloads(item)
    return found


async def test_token_budget_ends_the_turn_gracefully(harness: Harness) -> None:
    usage = Usage(model_calls=1, input_tokens=80, output_tokens=20)
    model = ScriptedModel(
        plans=[Reply(calls=[order_call()], usage=usage)],
        decisions=[Reply(calls=[order_call()], usage=usage)],
    )
    result = await harness.ask(
        "Has order 123456 shipped?", model=model, limits=TurnLimits(max_tokens=250)
    )
    assert result.outcome is Outcome.TOKEN_LIMIT
    assert result.answer.startswith("Sorry, I used up this question's budget of 250 tokens.")
    assert "Herbal Handsoap" in result.answer
    assert len(model.requests) == 3  # 100, 200, 300 tokens: no fourth call
    assert result.usage.input_tokens + result.usage.output_tokens == 300


@pytest.mark.parametrize(("task", "calls"), EXPECTED_MODEL_CALLS.items())
async def test_model_calls_per_task(harness: Harness, task: str, calls: int) -> None:
    """The benchmark's three tasks: N sequential rounds cost N + 1 calls; parallel, none extra."""
    result = await harness.ask(TASK_QUESTION, model=TaskModel(task))
    assert result.outcome is Outcome.ANSWERED
    observations = [s.observation for s in result.steps if s.observation]
    assert observations and all(o.ok for o in observations)
    assert "rtn001" in result.answer or task == "one tool"
    assert result.usage.model_calls == calls
