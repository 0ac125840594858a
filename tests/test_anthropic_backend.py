"""The Anthropic backend (`anthropic:<model>`) through real turn workflows, against a
Messages API server as strict as Anthropic's (`tests/fakes/anthropic_messages.py`),
which the real `anthropic` SDK talks to over HTTP: tools, parallel tools, streaming,
typed output, thinking kept across tool calls, prompt caching counted in usage and
cost over a long turn, compaction; 429 and 529 retried after their `retry-after`,
errors in one line. Then the fake itself: it refuses what the API refuses."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import anthropic
import genai_prices
import httpx
import pytest
from pydantic import BaseModel
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, AgentClient, Compaction
from durable_agent.backends import default_models
from durable_agent.backends.anthropic import AnthropicModel, classify
from durable_agent.bounds import bounded_reply
from durable_agent.conversation import AssistantMessage, Message, Opaque, ToolResult, UserMessage
from durable_agent.errors import ModelCannotAnswer, ModelRequestRejected, ModelUnavailable
from durable_agent.model import ModelRequest, Reply
from durable_agent.outputs import OUTPUT_TOOL
from durable_agent.runtime.streams import turn_events
from durable_agent.runtime.turns import start_turn
from durable_agent.stream import Drafts, TokensEvent
from durable_agent.tools import ToolContext, ToolRegistry, ToolSpec, tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits
from tests.conftest import SEED_CASES, Harness, kinds, request
from tests.fakes import anthropic_messages as fake
from tests.fakes.anthropic_messages import MessagesServer, Said, text, tool_use, violation
from tests.fakes.brain import offline_brain

ROOT = Path(__file__).resolve().parent.parent
MODEL = "claude-sonnet-4-6"
ORDER = ("toolu_a", "order_status", {"order_id": "123456"})
RETURN = ("toolu_b", "return_status", {"return_id": "rtn001"})
QUESTION = "Has order 123456 shipped? And my return rtn001?"
ANSWER = "Your order 123456 has shipped: 2 × Herbal Handsoap."


@pytest.fixture
def api() -> Iterator[MessagesServer]:
    server = MessagesServer()
    yield server
    server.close()


def roles(body: dict[str, Any]) -> list[str]:
    return [m["role"] for m in body["messages"]]


def types(message: dict[str, Any]) -> list[str]:
    return [b["type"] for b in message["content"]]


def breakpoints(body: dict[str, Any]) -> list[str]:
    """Where a request's `cache_control` marks are, in the API's order."""
    return [where for where, b in fake._in_order(body) if "cache_control" in b]


def payloads(node: Any) -> Iterator[str]:
    """The payloads of a history (as `to_json_dict` gives it), decoded."""
    if isinstance(node, dict):
        if isinstance(node.get("data"), str) and "metadata" in node:
            yield base64.b64decode(node["data"]).decode(errors="replace")
        for value in node.values():
            yield from payloads(value)
    elif isinstance(node, list):
        for value in node:
            yield from payloads(value)


def table_price(usage: dict[str, int]) -> float:
    """What genai-prices says one call of the fake's model costs, from the usage the
    fake reported: the cost the turn must have added up."""
    read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
    counted = genai_prices.Usage(
        input_tokens=usage["input_tokens"] + read + written,
        cache_read_tokens=read,
        cache_write_tokens=written,
        output_tokens=usage["output_tokens"],
    )
    return float(genai_prices.calc_price(counted, MODEL, provider_id="anthropic").total_price)


# --- turns ------------------------------------------------------------------------------


async def test_one_tool(harness: Harness, api: MessagesServer) -> None:
    api.replies = [tool_use(ORDER), text("It shipped: 2 × Herbal Handsoap.")]
    result = await harness.ask("Has order 123456 shipped?", model=api.model())

    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "It shipped: 2 × Herbal Handsoap."
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
    assert result.usage.model_calls == len(api.accepted) == len(api.requests) == 2
    plan, interpret = api.accepted
    assert roles(plan) == ["user"] and roles(interpret) == ["user", "assistant", "user"]
    assert interpret["system"][0]["text"] == plan["system"][0]["text"]  # unchanged
    assert interpret["messages"][1]["content"] == [
        {"type": "tool_use", "id": "toolu_a", "name": "order_status", "input": ORDER[2]}
    ]
    (result_block,) = interpret["messages"][2]["content"]
    assert result_block["tool_use_id"] == "toolu_a" and "is_error" not in result_block
    assert "Herbal Handsoap" in result_block["content"]
    tools = {t["name"]: t for t in plan["tools"]}
    assert tools["order_status"]["input_schema"]["properties"]["order_id"]["pattern"]
    assert plan["max_tokens"] == 4_096 and "thinking" not in plan


async def test_parallel_tools_and_a_failed_one(harness: Harness, api: MessagesServer) -> None:
    """Three calls in one reply: every result in the next user message, in call order,
    the unknown tool's as an error."""
    unknown = ("toolu_c", "track_parcel", {"id": "1Z"})
    api.replies = [tool_use(ORDER, RETURN, unknown, words="Let me look."), text(ANSWER)]
    result = await harness.ask(QUESTION, model=api.model())

    assert result.outcome is Outcome.ANSWERED and result.answer == ANSWER
    assert result.usage.model_calls == len(api.accepted) == 2
    last = api.accepted[-1]
    assert types(last["messages"][1]) == ["text", "tool_use", "tool_use", "tool_use"]
    results = last["messages"][2]["content"]
    assert [b["tool_use_id"] for b in results] == ["toolu_a", "toolu_b", "toolu_c"]
    assert [b.get("is_error", False) for b in results] == [False, False, True]
    assert results[2]["content"].startswith("unknown tool 'track_parcel'")  # is_error says it


async def _streamed_turn(harness: Harness, model: Any) -> tuple[Any, list[TokensEvent]]:
    async with harness.worker(model) as task_queue:
        turn = TurnInput(question=QUESTION, model="scripted", stream=True)
        handle = await start_turn(harness.client, turn, task_queue)

        async def read() -> list[TokensEvent]:
            return [
                e
                async for _, e in turn_events(harness.client, handle.id)
                if isinstance(e, TokensEvent)
            ]

        tokens = await asyncio.wait_for(read(), timeout=60)
        return await handle.result(), tokens


LONG = " ".join(f"Step {i}: the parcel with order 123456 moves on." for i in range(40))


async def test_a_turn_streams_the_text_and_never_the_thinking(harness: Harness) -> None:
    server = MessagesServer(event_delay=0.002)
    server.replies = [
        tool_use(ORDER, RETURN, thinking="Two lookups: the order, then the return."),
        text(LONG),
    ]
    try:
        result, tokens = await _streamed_turn(harness, server.model(thinking=2_048))
    finally:
        server.close()

    assert result.outcome is Outcome.ANSWERED and result.answer == LONG
    assert len(tokens) >= 2, "the answer is published in batches while it is written"
    assert "".join(t.text for t in tokens) == result.answer
    assert all("Two lookups" not in t.text for t in tokens)
    assert all(r.body["stream"] is True for r in server.requests)
    assert result.usage.model_calls == len(server.accepted) == 2


async def test_an_overloaded_stream_is_retried_without_doubled_text(harness: Harness) -> None:
    """529 as an `error` event in the middle of a stream the API had accepted."""
    server = MessagesServer(event_delay=0.01)
    server.replies = [fake.Cut("Your order 123456 has"), text(ANSWER)]
    try:
        result, tokens = await _streamed_turn(harness, server.model())
    finally:
        server.close()

    assert result.outcome is Outcome.ANSWERED and result.answer == ANSWER
    assert {t.attempt for t in tokens} == {1, 2}
    drafts = Drafts()
    for t in tokens:
        drafts.add(t)
    assert drafts.text(tokens[0].call) == ANSWER
    assert result.usage.model_calls == len(server.accepted) == 1


class OrderFacts(BaseModel):
    order_id: str
    item: str
    quantity: int


FACTS = {"order_id": "123456", "item": "Herbal Handsoap", "quantity": 2}


async def test_typed_output_through_the_forced_output_tool(
    env: WorkflowEnvironment, harness: Harness, api: MessagesServer
) -> None:
    api.replies = [tool_use(ORDER), tool_use(("toolu_out", OUTPUT_TOOL, FACTS))]
    async with harness.worker(api.model()) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        result = await agents.ask(
            "Which item was ordered for 123456?", model="scripted", output_type=OrderFacts
        )

    assert result.outcome is Outcome.ANSWERED and result.output == OrderFacts(**FACTS)
    assert len(api.accepted) == len(api.requests) == 2
    for body in api.accepted:
        assert body["tools"][-1]["name"] == OUTPUT_TOOL
        assert body["tool_choice"] == {"type": "any"}  # it may call other tools first


async def test_typed_output_while_thinking_is_offered_not_forced(
    env: WorkflowEnvironment, harness: Harness, api: MessagesServer
) -> None:
    """The API refuses a forced tool with thinking: the tool is offered (`auto`), and a
    reply in words goes back to the model, thinking and all, to be given again."""
    api.replies = [text("It is the soap."), tool_use(("toolu_out", OUTPUT_TOOL, FACTS))]
    async with harness.worker(api.model(thinking=2_048)) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        result = await agents.ask(
            "Which item was ordered for 123456?", model="scripted", output_type=OrderFacts
        )

    assert result.outcome is Outcome.ANSWERED and result.output == OrderFacts(**FACTS)
    assert len(api.accepted) == len(api.requests) == 2
    first, second = api.accepted
    assert first["tool_choice"] == second["tool_choice"] == {"type": "auto"}
    assert types(second["messages"][1]) == ["thinking", "text"]  # the repair keeps it
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2_048}
    assert first["max_tokens"] == 2_048 + 4_096


async def test_thinking_goes_back_unchanged_across_the_rounds_of_a_turn(
    harness: Harness, api: MessagesServer
) -> None:
    """Three rounds with thinking on: the model thinks once, as the round begins; every
    later request of the turn opens its round with that block, signature and all (the
    fake checks it), and the turn's record carries it from call to call."""
    thought = "The order first, then the return it mentions."
    api.replies = [
        tool_use(ORDER, thinking=thought, redacted=True),
        tool_use(RETURN),
        text(ANSWER),
    ]
    model = api.model(thinking=2_048)
    async with harness.worker(model) as task_queue:
        turn = TurnInput(question=QUESTION, model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        result = await handle.result()

    assert result.outcome is Outcome.ANSWERED and result.answer == ANSWER
    assert len(api.accepted) == len(api.requests) == 3
    opened = [body["messages"][1]["content"][:2] for body in api.accepted[1:]]
    assert opened[0] == opened[1]
    thinking, redacted = opened[0]
    assert thinking["type"] == "thinking" and thinking["thinking"] == thought
    assert thinking["signature"] == api.signer.sign(thought)
    assert redacted["type"] == "redacted_thinking"
    assert all(body["thinking"]["type"] == "enabled" for body in api.accepted)
    # The second reply thought nothing (a round thinks as it begins): its message has none.
    assert types(api.accepted[2]["messages"][3]) == ["tool_use"]
    # Never shown: not in the story, only in the record the next call reads.
    assert all(thought not in s.text for s in result.steps)
    history = (await handle.fetch_history()).to_json_dict()
    assert any("redacted_thinking" in p for p in payloads(history))


class Page(BaseModel):
    n: int


@tool
def read_note(args: Page, ctx: ToolContext[object]) -> str:
    """A 1,500-character note whose last word names it."""
    return "w" * 1_480 + f" end-of-note-{args.n}"


def notes_reader(rounds: int, per_round: int) -> Any:
    """A brain that reads `per_round` notes at once, `rounds` times, then answers with
    the last note's last word; asked with no tools (compaction's summary), it summarises."""

    def brain(messages: list[Message], tools: list[ToolSpec]) -> Reply:
        if not tools:
            return Reply(text="Notes read so far, in order; carry on with the next.")
        read = [
            c.arguments["n"] for m in messages if isinstance(m, AssistantMessage) for c in m.calls
        ]
        last = max(read, default=0)
        if last < rounds * per_round:
            calls = [
                ToolCall(id="", name="read_note", arguments={"n": last + k})
                for k in range(1, per_round + 1)
            ]
            return Reply(calls=calls)
        return Reply(text=messages[-1].text.split()[-1])

    return brain


def reader_agent(**options: Any) -> Agent:
    return Agent(name="reader", tools=ToolRegistry([read_note]), model="scripted", **options)


async def test_caching_over_a_long_turn_is_counted_in_usage_and_cost(harness: Harness) -> None:
    """Four rounds of 12 notes read at once (25 blocks a round, past the 20 the API looks
    back from a breakpoint): each call reads from the cache all the previous call sent,
    at the breakpoint on the previous request's end, and writes what is new; the turn's
    usage and cost are the sum of what the API reported and genai-prices' rates."""
    server = MessagesServer(brain=notes_reader(rounds=4, per_round=12))
    agent = reader_agent()
    try:
        async with harness.worker(server.model(), agents=[agent]) as task_queue:
            turn = TurnInput(
                question="Read the notes", model="scripted", agent="reader", stream=True
            )
            handle = await start_turn(harness.client, turn, task_queue)
            result = await handle.result()
    finally:
        server.close()

    assert result.outcome is Outcome.ANSWERED and result.answer == "end-of-note-48"
    calls = [r for r in server.requests if r.status == 200]
    assert len(calls) == result.usage.model_calls == 5
    assert breakpoints(calls[0].body) == ["tools.0", "system.0"]
    for r in calls[1:]:  # and the end of the previous request, and of this one
        sent = r.body["messages"]
        ends = [f"messages.{i}.content.{len(sent[i]['content']) - 1}" for i in (-3, -1)]
        ends = [e.replace("-3", str(len(sent) - 3)).replace("-1", str(len(sent) - 1)) for e in ends]
        assert breakpoints(r.body) == ["tools.0", "system.0", *ends]
    reads = [r.usage["cache_read_input_tokens"] for r in calls]
    writes = [r.usage["cache_creation_input_tokens"] for r in calls]
    totals = [sum(r.usage[k] for k in r.usage if k != "output_tokens") for r in calls]
    assert all(reads[i] >= totals[i - 1] for i in range(2, len(calls)))
    assert result.usage.cached_input_tokens == sum(reads) > 0
    assert result.usage.cache_write_tokens == sum(writes) > 0
    assert result.usage.input_tokens == sum(totals)
    assert result.usage.cost_usd == pytest.approx(sum(table_price(r.usage) for r in calls))
    uncached = sum(
        table_price({**r.usage, "input_tokens": t, "cache_read_input_tokens": 0,
                     "cache_creation_input_tokens": 0})
        for r, t in zip(calls, totals, strict=True)
    )  # fmt: skip
    assert result.usage.cost_usd < uncached * 0.7, "caching makes the long turn cheaper"


async def test_a_long_turn_with_thinking_compacts_and_passes_the_fake(harness: Harness) -> None:
    """Thinking, parallel calls and compaction in one turn: the conversation is
    summarised partway (the round's first message, with its thinking, is gone), so
    the calls after it are sent without thinking, as the API requires; nothing is
    refused on the way."""
    server = MessagesServer(brain=notes_reader(rounds=12, per_round=3))
    agent = reader_agent(compaction=Compaction(window=8_000, reply_tokens=1_000))
    limits = TurnLimits(max_steps=30, max_duration=timedelta(minutes=5))
    try:
        async with harness.worker(server.model(thinking=2_048), agents=[agent]) as task_queue:
            turn = TurnInput(
                question="Read the notes", model="scripted", agent="reader", limits=limits
            )
            handle = await start_turn(harness.client, turn, task_queue)
            result = await handle.result()
    finally:
        server.close()

    assert result.outcome is Outcome.ANSWERED, result.answer
    assert result.answer == "end-of-note-36"
    assert all(r.status == 200 for r in server.requests), "the fake refused nothing"
    compacted = [s for s in result.steps if s.kind is StepKind.COMPACT]
    assert compacted and "earlier messages summarised" in compacted[0].text
    turn_calls = [b for b in server.accepted if b.get("tools")]
    thinking = [("thinking" in b) for b in turn_calls]
    assert thinking[0] and thinking[1], "the round thinks, and keeps its thinking"
    assert not thinking[-1], "past the summary, the round's thinking is gone: none is asked"
    assert thinking == sorted(thinking, reverse=True)  # on, then off for good
    assert all(len(breakpoints(b)) <= 4 for b in server.accepted)


async def test_429_and_529_are_retried_after_their_retry_after(
    harness: Harness, api: MessagesServer
) -> None:
    api.replies = [
        fake.error(429, {"retry-after": "2"}, "Number of request tokens has exceeded your limit"),
        fake.error(529, {"retry-after": "1"}, "Overloaded"),
        text(ANSWER),
    ]
    result = await harness.ask(QUESTION, model=api.model())

    assert result.outcome is Outcome.ANSWERED and result.answer == ANSWER
    assert result.usage.model_calls == len(api.accepted) == 1
    at = [r.at for r in api.requests]
    assert at[1] - at[0] >= 1.9 and at[2] - at[1] >= 0.9  # the API's waits, not the policy's


async def test_a_rejected_key_is_one_line_and_not_retried(
    harness: Harness, api: MessagesServer, caplog: pytest.LogCaptureFixture
) -> None:
    model = api.model()
    api.api_key = "another-key"  # the server's, not the worker's
    result = await harness.ask(QUESTION, model=model)

    assert result.outcome is Outcome.MODEL_ERROR
    assert len(api.requests) == 1
    failure = next(s for s in result.steps if s.kind is StepKind.LIMIT)
    assert failure.text.startswith("model request rejected:") and "\n" not in failure.text
    # What the API said and what to check, for the operator.
    assert "(401: invalid x-api-key); check ANTHROPIC_API_KEY" in caplog.text


async def test_an_unknown_model_is_named(
    harness: Harness, api: MessagesServer, caplog: pytest.LogCaptureFixture
) -> None:
    result = await harness.ask(QUESTION, model=api.model("claude-nonesuch-9"))
    assert result.outcome is Outcome.MODEL_ERROR and len(api.requests) == 1
    assert "(404: model: claude-nonesuch-9); check the model name" in caplog.text


async def test_a_refusal_goes_to_the_next_model(
    harness: Harness, api: MessagesServer, caplog: pytest.LogCaptureFixture
) -> None:
    """`stop_reason: refusal` is this model declining: not retried (it would decline
    again), and the turn's next model answers."""
    api.replies = [fake.refusal("I can")]
    async with harness.worker(api.model()) as task_queue:
        turn = TurnInput(question="Which item was ordered for 123456?", model="scripted,offline")
        result = await (await start_turn(harness.client, turn, task_queue)).result()

    assert result.outcome is Outcome.ANSWERED and "Herbal Handsoap" in result.answer
    assert len(api.requests) == 1
    assert any(s.kind is StepKind.FALLBACK for s in result.steps)
    assert "the model declined to answer this request (cyber)" in caplog.text


async def test_a_reply_cut_at_max_tokens_says_so(harness: Harness, api: MessagesServer) -> None:
    api.replies = [text("Your order shipped on the", stop="max_tokens")]
    result = await harness.ask(QUESTION, model=api.model())
    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "Your order shipped on the …"


async def test_thinking_that_fills_max_tokens_is_one_line(api: MessagesServer) -> None:
    api.replies = [Said(stop="max_tokens")]
    with pytest.raises(ModelCannotAnswer, match=r"max_tokens 6144.*\+max_tokens=N"):
        await api.model(thinking=2_048).plan(request(QUESTION))


async def test_a_call_cut_at_max_tokens_is_not_run(api: MessagesServer) -> None:
    """Cut while it wrote its last call: that call's input may parse, and be wrong."""
    api.replies = [tool_use(ORDER, RETURN, stop="max_tokens")]
    reply = await api.model().plan(request(QUESTION))
    assert reply.calls[0].error is None and reply.calls[0].arguments == ORDER[2]
    assert reply.calls[1].error == "cut short: the reply reached max_tokens (4096) while writing it"


def test_thinking_over_its_bound_leaves_the_record_and_the_round_does_not_think() -> None:
    long = {"type": "thinking", "thinking": "x" * 200_001, "signature": "s"}
    reply = Reply(
        calls=[ToolCall(id="c1", name="order_status", arguments={"order_id": "123456"})],
        opaque=Opaque(provider="anthropic", model=MODEL, blocks=[long]),
    )
    kept = bounded_reply(reply)
    assert kept.opaque is None and kept.calls == reply.calls
    messages: list[Message] = [
        UserMessage(text=QUESTION),
        kept.message(),
        ToolResult(call_id="c1", tool="order_status", ok=True, text="shipped"),
    ]
    body = AnthropicModel(MODEL, client=object(), thinking=2_048).request(
        ModelRequest(messages=messages)
    )
    assert "thinking" not in body and violation(body) is None


# --- the backend's requests ---------------------------------------------------------------


def _long_conversation(rounds: int) -> list[Message]:
    messages: list[Message] = [UserMessage(text=QUESTION)]
    for n in range(rounds):
        calls = [ToolCall(id=f"c{n}_{k}", name="order_status", arguments={}) for k in range(3)]
        messages.append(AssistantMessage(text="", calls=calls))
        messages += [
            ToolResult(call_id=c.id, tool=c.name, ok=n % 2 == 0, text=f"r{n}") for c in calls
        ]
    return messages


@pytest.mark.parametrize("rounds", [0, 1, 2, 10])
def test_the_backend_sends_what_the_fake_accepts(rounds: int) -> None:
    """Whatever the length, with and without tools: at most four breakpoints, results
    first in their message, roles alternating."""
    model = AnthropicModel(MODEL, client=object())
    for tools in ([], request(QUESTION).tools):
        body = model.request(ModelRequest(messages=_long_conversation(rounds), tools=tools))
        assert violation(body) is None
        assert len(breakpoints(body)) == (1 if tools else 0) + 1 + (2 if rounds else 0)


def test_caching_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_ANTHROPIC_CACHE", "0")
    body = AnthropicModel(MODEL, client=object()).request(request(QUESTION))
    assert breakpoints(body) == []


def test_thinking_of_another_model_is_not_sent_and_the_round_does_not_think() -> None:
    signed = {"type": "thinking", "thinking": "t", "signature": "s"}
    mine = Opaque(provider="anthropic", model=MODEL, blocks=[signed])
    other = Opaque(provider="anthropic", model="claude-haiku-4-5", blocks=[signed])
    model = AnthropicModel(MODEL, client=object(), thinking=2_048)
    for opaque, thinks in ((mine, True), (other, False), (None, False)):
        call = ToolCall(id="c1", name="order_status", arguments={"order_id": "123456"})
        messages: list[Message] = [
            UserMessage(text=QUESTION),
            AssistantMessage(calls=[call], opaque=opaque),
            ToolResult(call_id="c1", tool="order_status", ok=True, text="shipped"),
        ]
        body = model.request(ModelRequest(messages=messages))
        assert ("thinking" in body) is thinks
        assert (body["messages"][1]["content"][0] == signed) is thinks


@pytest.mark.parametrize(
    ("spec", "thinking", "max_tokens"),
    [
        (MODEL, None, 4_096),
        (f"{MODEL}+thinking", 4_096, 4_096),
        (f"{MODEL}+thinking=16000+max_tokens=8192", 16_000, 8_192),
        (f"{MODEL}+thinking=adaptive", "adaptive", 4_096),
    ],
)
def test_a_spec_names_thinking_and_the_reply_limit(
    monkeypatch: pytest.MonkeyPatch, spec: str, thinking: Any, max_tokens: int
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    model = default_models().resolve(f"anthropic:{spec}")
    assert isinstance(model, AnthropicModel) and model.name == MODEL
    assert (model._thinking, model._max_tokens) == (thinking, max_tokens)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("", "name the model: --model anthropic:<model>"),
        (f"{MODEL}+thinking=500", "at least 1024"),
        (f"{MODEL}+temperature=1", "unknown option 'temperature=1'"),
    ],
)
def test_a_bad_spec_is_one_line(monkeypatch: pytest.MonkeyPatch, spec: str, said: str) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    with pytest.raises(ModelRequestRejected, match=said) as caught:
        default_models().resolve(f"anthropic:{spec}")
    assert "\n" not in str(caught.value)


def test_a_missing_key_or_package_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in [n for n in os.environ if n.startswith("ANTHROPIC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # no profile on disk either
    with pytest.raises(ModelRequestRejected) as caught:
        AnthropicModel(MODEL)
    assert str(caught.value) == (
        "the anthropic backend has no API key: set ANTHROPIC_API_KEY for the worker and restart it"
    )
    monkeypatch.setenv("ANTHROPIC_PROFILE", "nosuch")
    with pytest.raises(ModelRequestRejected, match="cannot start .*nosuch.*ANTHROPIC_API_KEY"):
        AnthropicModel(MODEL)
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(ModelRequestRejected, match=r"pip install -e '\.\[anthropic\]'"):
        AnthropicModel(MODEL)


# --- errors as the SDK raises them --------------------------------------------------------


def _status_error(api: MessagesServer, status: int, headers: dict[str, str] | None = None) -> Any:
    api.replies = [fake.error(status, headers, message=f"said {status}")]
    client = anthropic.Anthropic(base_url=api.url, api_key=api.api_key, max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    return caught.value


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, ModelRequestRejected), (401, ModelRequestRejected), (403, ModelRequestRejected),
     (404, ModelRequestRejected), (413, ModelCannotAnswer), (429, ModelUnavailable),
     (500, ModelUnavailable), (503, ModelUnavailable), (529, ModelUnavailable)],
)  # fmt: skip
def test_errors_are_classified_by_status(api: MessagesServer, status: int, kind: type) -> None:
    err = classify(_status_error(api, status, {"retry-after": "3"}))
    assert type(err) is kind and f"said {status}" in str(err)
    if kind is ModelUnavailable:
        assert err.retry_after == 3


def test_a_prompt_too_long_is_this_models_limit(api: MessagesServer) -> None:
    api.replies = [fake.error(400, message="prompt is too long: 210000 tokens > 200000 maximum")]
    client = anthropic.Anthropic(base_url=api.url, api_key=api.api_key, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}]
        )
    assert isinstance(classify(caught.value), ModelCannotAnswer)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("overloaded_error", ModelUnavailable), ("api_error", ModelUnavailable),
     ("rate_limit_error", ModelUnavailable), ("invalid_request_error", ModelRequestRejected)],
)  # fmt: skip
async def test_an_error_event_mid_stream_is_classified_by_its_type(
    kind: str, expected: type
) -> None:
    server = MessagesServer()
    server.replies = [fake.Cut("Your order", kind=kind)]
    pieces: list[str] = []
    try:
        with pytest.raises(expected):
            await server.model().plan(request(QUESTION), pieces.append)
    finally:
        server.close()
    assert "".join(pieces) == "Your order"


async def test_a_dropped_stream_is_transient() -> None:
    server = MessagesServer()
    server.replies = [fake.Cut("Your order", kind=None)]
    try:
        with pytest.raises(ModelUnavailable):
            await server.model().plan(request(QUESTION), [].append)
    finally:
        server.close()


@pytest.mark.parametrize(
    "said",
    [text(ANSWER), tool_use(ORDER, RETURN, words="Let me look.", thinking="Two lookups."),
     text(LONG, stop="max_tokens")],
)  # fmt: skip
async def test_a_streamed_reply_is_the_whole_reply(said: Said) -> None:
    replies = []
    for stream in (False, True):
        server = MessagesServer()  # a fresh cache each: usage is comparable
        server.replies = [said]
        pieces: list[str] = []
        try:
            sink = pieces.append if stream else None
            replies.append(await server.model(thinking=2_048).plan(request(QUESTION), sink))
        finally:
            server.close()
    whole, streamed = replies
    assert streamed.model_dump(exclude={"opaque"}) == whole.model_dump(exclude={"opaque"})
    assert (streamed.opaque is None) == (whole.opaque is None)
    assert streamed.finish_reason == whole.finish_reason
    assert "".join(pieces) == said.text


# --- a worker process, as a user runs it ---------------------------------------------------


async def test_a_worker_process_reads_the_anthropic_settings(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`python worker.py` with `AGENT_MODEL=anthropic:<model>`, `ANTHROPIC_BASE_URL` and
    `ANTHROPIC_API_KEY`, the seed questions answered by a model's reading of each
    request; then `client.py ask --follow`, which shows the text as it is written."""
    server = MessagesServer(brain=offline_brain, api_key="sk-ant-worker")
    task_queue = f"anthropic-{uuid.uuid4().hex[:6]}"
    environ = {
        **os.environ,
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "AGENT_MODEL": f"anthropic:{MODEL}",
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": server.api_key,
        "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
        "AGENT_TASK_QUEUE": task_queue,
        "PYTHONUNBUFFERED": "1",
    }
    worker = subprocess.Popen(
        [sys.executable, "worker.py"], cwd=ROOT, env=environ, stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None
        assert "worker ready" in worker.stdout.readline()
        results = []
        for question, _ in SEED_CASES:
            handle = await start_turn(env.client, TurnInput(question=question), task_queue)
            results.append(await handle.result())
        followed = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "client.py", "ask", "Which item was ordered for 123456?", "--follow"],
            cwd=ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        server.close()

    for (question, expected), result in zip(SEED_CASES, results, strict=True):
        assert result.outcome is Outcome.ANSWERED, (question, result.answer)
        assert expected in result.answer, (question, result.answer)
        assert result.usage.cost_usd is not None and result.usage.cost_usd > 0
    assert [r.usage.model_calls for r in results] == [2, 2, 1, 2, 2, 1]
    assert followed.returncode == 0, followed.stderr
    assert "[~] writing" in followed.stdout and "Herbal Handsoap" in followed.stdout
    assert all(r.status == 200 for r in server.requests)
    assert {r.body["model"] for r in server.requests} == {MODEL}


# --- the fake refuses what the API refuses ---------------------------------------------------


def _use(*ids: str) -> dict[str, Any]:
    blocks = [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ids]
    return {"role": "assistant", "content": blocks}


def _opened(first: dict[str, Any], *ids: str) -> dict[str, Any]:
    """An assistant message: `first`, then a `tool_use` for each id."""
    return {"role": "assistant", "content": [first, *_use(*ids)["content"]]}


def _marked(role: str, mark: dict[str, Any]) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": role, "cache_control": mark}]}


def _results(*ids: str, words: str | None = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in ids
    ]
    if words is not None:
        blocks.insert(0, {"type": "text", "text": words})
    return {"role": "user", "content": blocks}


HI = {"role": "user", "content": "hi"}
SIGNER = fake.Signer()
THOUGHT = {"type": "thinking", "thinking": "hm", "signature": SIGNER.sign("hm")}
TOOLS = [{"name": "f", "input_schema": {"type": "object"}}]
THINKING = {"type": "enabled", "budget_tokens": 1_024}
MARK = {"type": "ephemeral"}


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2_048, "messages": list(messages), **extra}


FAKE_REFUSES = {
    "first from the assistant": (
        body({"role": "assistant", "content": "hello"}, HI),
        'first message must use the "user" role',
    ),
    "two user messages": (body(HI, HI), 'found multiple "user" roles in a row'),
    "two assistant messages": (
        body(HI, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}),
        'found multiple "assistant" roles in a row',
    ),
    "a tool_use answered by words": (
        body(HI, _use("t1"), HI),
        "`tool_use` ids were found without `tool_result` blocks immediately after: t1",
    ),
    "one of two answered": (body(HI, _use("t1", "t2"), _results("t1")), "immediately after: t2"),
    "a tool_use answered two messages later": (
        body(HI, _use("t1"), HI, {"role": "assistant", "content": "x"}, _results("t1")),
        "immediately after: t1",
    ),
    "a result for no tool_use": (
        body(HI, _use("t1"), _results("t1", "t9")),
        "unexpected `tool_use_id` found in `tool_result` blocks: t9",
    ),
    "a result for an older round's tool_use": (
        body(
            HI, _use("t1"), _results("t1"), {"role": "assistant", "content": "x"}, _results("t1")
        ),
        "unexpected `tool_use_id` found in `tool_result` blocks: t1",
    ),
    "words before the results": (
        body(HI, _use("t1"), _results("t1", words="here")),
        "`tool_result` blocks must come first",
    ),
    "thinking changed": (
        body(
            HI,
            _opened({**THOUGHT, "thinking": "hm!"}, "t1"),
            _results("t1"),
            thinking=THINKING,
        ),
        "Invalid `signature` in `thinking` block",
    ),
    "thinking never given": (
        body(
            HI,
            _opened({**THOUGHT, "signature": "forged"}, "t1"),
            _results("t1"),
        ),
        "Invalid `signature` in `thinking` block",
    ),
    "a round of tool use without its thinking": (
        body(HI, _use("t1"), _results("t1"), thinking=THINKING),
        "Expected `thinking` or `redacted_thinking`, but found `tool_use`",
    ),
    "a later round's message opening the round instead": (
        body(
            HI,
            _opened({"type": "text", "text": "first"}, "t1"),
            _results("t1"),
            _opened(THOUGHT, "t2"),
            _results("t2"),
            thinking=THINKING,
        ),
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `text`",
    ),
    "a forced tool while thinking": (
        body(HI, tools=TOOLS, tool_choice={"type": "any"}, thinking=THINKING),
        "Thinking may not be enabled when tool_choice forces tool use.",
    ),
    "a budget not under max_tokens": (
        body(HI, thinking={"type": "enabled", "budget_tokens": 4_096}),
        "`max_tokens` must be greater than `thinking.budget_tokens`",
    ),
    "a budget under 1024": (
        body(HI, thinking={"type": "enabled", "budget_tokens": 512}),
        "greater than or equal to 1024",
    ),
    "five breakpoints": (
        body(
            *[_marked(r, MARK) for r in ("user", "assistant", "user")],
            system=[{"type": "text", "text": "s", "cache_control": MARK}],
            tools=[{**TOOLS[0], "cache_control": MARK}],
        ),
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),  # fmt: skip
    "an hour's cache after five minutes'": (
        body(
            _marked("user", {**MARK, "ttl": "1h"}),
            system=[{"type": "text", "text": "s", "cache_control": MARK}],
        ),
        "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block",
    ),
    "a system block that is not text": (
        body(HI, system=[{"type": "image", "source": {}}]),
        "system.0.type: Input should be 'text'",
    ),
    "an empty text block": (
        body({"role": "user", "content": [{"type": "text", "text": ""}]}),
        "text content blocks must be non-empty",
    ),
    "a blank text block": (
        body(HI, {"role": "assistant", "content": [{"type": "text", "text": "  "}]}, HI),
        "text content blocks must contain non-whitespace text",
    ),
    "a tool with a name no model takes": (
        body(HI, tools=[{"name": "book price", "input_schema": {"type": "object"}}]),
        "tools.0.custom.name: String should match pattern",
    ),
    "two tools of one name": (body(HI, tools=TOOLS * 2), "Tool names must be unique."),
}  # fmt: skip


@pytest.mark.parametrize("case", FAKE_REFUSES)
def test_the_fake_refuses_what_the_api_refuses(case: str) -> None:
    request_body, refusal = FAKE_REFUSES[case]
    problem = violation(request_body, SIGNER)
    assert problem is not None and refusal in problem


@pytest.mark.parametrize(
    "request_body",
    [
        body(HI, _use("t1", "t2"), _results("t2", "t1")),
        body(HI, _use("t1"), _results("t1", words=None)),
        body(HI, _opened(THOUGHT, "t1"),
             _results("t1"), {"role": "assistant", "content": "x"}, HI, thinking=THINKING),
        body(HI, _opened(THOUGHT, "t1"),
             _results("t1"), _use("t2"), _results("t2"), thinking=THINKING),
        body(HI, thinking=THINKING, tools=TOOLS, tool_choice={"type": "auto"}),
    ],
)  # fmt: skip
def test_the_fake_takes_what_the_api_takes(request_body: dict[str, Any]) -> None:
    assert violation(request_body, SIGNER) is None


def test_the_fake_refuses_over_http_in_the_apis_error_shape(api: MessagesServer) -> None:
    client = anthropic.Anthropic(base_url=api.url, api_key=api.api_key, max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="roles in a row") as caught:
        client.messages.create(model=MODEL, max_tokens=10, messages=[HI, HI])  # type: ignore[list-item]
    said = caught.value.body
    assert said == {"type": "error", "error": {"type": "invalid_request_error", "message": ANY}}
    raw = httpx.post(f"{api.url}/v1/messages", json=body(HI), headers={"x-api-key": api.api_key})
    assert raw.status_code == 400 and "anthropic-version" in raw.text


def test_the_fake_streams_the_apis_events(api: MessagesServer) -> None:
    api.replies = [tool_use(ORDER, words="Let me look.", thinking="Look it up.")]
    headers = {"x-api-key": api.api_key, "anthropic-version": "2023-06-01"}
    raw = httpx.post(
        f"{api.url}/v1/messages",
        json=body({"role": "user", "content": QUESTION}, stream=True, thinking=THINKING),
        headers=headers,
    )
    frames = [f for f in raw.text.split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    data = [json.loads(f.split("\n")[1].removeprefix("data: ")) for f in frames]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert "ping" in names
    starts = [d["content_block"]["type"] for d in data if d["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    deltas = [d["delta"]["type"] for d in data if d["type"] == "content_block_delta"]
    assert {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"} <= set(deltas)
    inputs = "".join(
        d.get("delta", {}).get("partial_json", "") for d in data if d.get("index") == 2
    )
    assert json.loads(inputs) == ORDER[2]
    assert data[-2]["delta"]["stop_reason"] == "tool_use"
    assert data[0]["message"]["usage"]["input_tokens"] > 0


def test_the_fakes_cache_reads_a_repeated_prefix_and_writes_the_rest() -> None:
    cache = fake.PromptCache(min_tokens=10)
    system = [{"type": "text", "text": "s" * 400, "cache_control": MARK}]
    first = body({"role": "user", "content": "hello there"}, system=system)
    written = cache.use(first).written
    assert written >= 100 and cache.use(first).read == written
    again = cache.use(body({"role": "user", "content": "another question"}, system=system))
    assert again.read == written and again.written == 0  # the system prompt, no more
    assert again.total > again.read
    other = [{"type": "text", "text": "t" * 400, "cache_control": MARK}]
    assert cache.use(body(HI, system=other)).read == 0
    short = fake.PromptCache(min_tokens=1_024)
    short.use(first)
    assert short.use(first).read == 0, "a prefix under the model's minimum is not cached"
