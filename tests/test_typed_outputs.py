"""Typed outputs (`durable_agent/outputs.py`) through real turns: a value of a type
reaches the client as an object, given natively (the strict Chat Completions fake's
`response_format`) or through the output tool (the scripted and offline models); a
value that does not fit is repaired, within `max_replans`, or the turn ends
`invalid_output`; a worker killed between the model's reply and the turn's end still
delivers the value once."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentClient, TurnResult
from durable_agent.agents import Agent
from durable_agent.backends.bedrock import BedrockConverseModel
from durable_agent.conversation import AssistantMessage, ToolResult, UserMessage
from durable_agent.errors import AgentClientError
from durable_agent.model import ModelRequest, Reply
from durable_agent.outputs import OUTPUT_TOOL, Output, output_spec, parameters, strict_schema
from durable_agent.runtime.turns import start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import ShopStore
from durable_agent.testing import TestModel
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits
from tests.conftest import Harness, kinds, story
from tests.fakes.chat_completions import (
    ChatCompletionsServer,
    format_violation,
    running,
    structured,
    tool_calls,
)
from tests.test_crash import spawn_worker, wait_for

ROOT = Path(__file__).resolve().parent.parent
ORDER = ("call_a", "order_status", '{"order_id": "123456"}')


class OrderFacts(BaseModel):
    order_id: str
    item: str
    quantity: int = Field(ge=1)
    status: str
    shipped_on: str | None = None


FACTS = {
    "order_id": "123456",
    "item": "Herbal Handsoap",
    "quantity": 2,
    "status": "shipped",
    "shipped_on": "2026-11-20",
}


@pytest.fixture
def chat() -> Iterator[ChatCompletionsServer]:
    yield from running()


def final(arguments: dict[str, Any], id: str = "out1") -> Reply:
    return Reply(calls=[ToolCall(id=id, name=OUTPUT_TOOL, arguments=arguments)])


async def test_a_typed_result_reaches_the_client_as_the_object(
    env: WorkflowEnvironment, harness: Harness, chat: ChatCompletionsServer
) -> None:
    chat.replies = [tool_calls(ORDER), structured(FACTS)]
    async with harness.worker(chat.model()) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        result = await agents.ask(
            "Which item was ordered for 123456?", model="scripted", output_type=OrderFacts
        )

    assert result.outcome is Outcome.ANSWERED
    assert result.output == OrderFacts(**FACTS) and isinstance(result.output, OrderFacts)
    assert json.loads(result.answer) == FACTS  # the answer is the value's JSON
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
    assert json.loads(result.steps[-1].text) == FACTS  # the story shows it
    # Both calls asked for the schema natively, strict, as the fake accepts it.
    assert len(chat.accepted) == len(chat.requests) == 2
    sent = strict_schema(output_spec(OrderFacts))
    for body in chat.accepted:
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "OrderFacts", "schema": sent, "strict": True},
        }
        assert OUTPUT_TOOL not in {t["function"]["name"] for t in body["tools"]}
    assert sent["required"] == list(OrderFacts.model_fields)  # optional ones too
    assert sent["additionalProperties"] is False
    # The result reads back the same from its JSON (as a service would send it on).
    again = TurnResult.model_validate_json(result.model_dump_json())
    assert again.output == FACTS


async def test_an_agents_own_type_through_the_output_tool(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    model = ScriptedModel(
        plans=[
            Reply(calls=[ToolCall(id="c1", name="order_status", arguments={"order_id": "123456"})])
        ],
        decisions=[final(FACTS)],
    )
    typed = replace(harness.agent(), output_type=OrderFacts)
    async with harness.worker(model, agents=[typed]) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        turn = await agents.start("Which item was ordered for 123456?", model="scripted")
        result = await turn.result()
        as_json = await agents.turn(turn.id, output_type=output_spec(OrderFacts)).result()

    # Not named again: this process has the agent's type (its module), as its record says.
    assert result.outcome is Outcome.ANSWERED and result.output == OrderFacts(**FACTS)
    assert result.output_type == f"{__name__}:OrderFacts"
    assert as_json.output == FACTS  # an OutputSpec names no type: the value as JSON
    assert result.fingerprint != harness.agent().fingerprint()  # the type is part of it
    # The scripted model was offered the output tool, with the type's schema, last.
    kind, request = model.requests[0]
    assert request.tools[-1].name == OUTPUT_TOOL and request.final_tool == OUTPUT_TOOL
    assert request.tools[-1].parameters == parameters(output_spec(OrderFacts))
    assert request.output is None  # no native structured output for this backend


async def test_an_invalid_value_is_repaired_once_then_accepted(
    env: WorkflowEnvironment, harness: Harness, chat: ChatCompletionsServer
) -> None:
    wrong = {**FACTS, "quantity": "two"}
    chat.replies = [structured(wrong), structured(FACTS)]
    async with harness.worker(chat.model()) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        result = await agents.ask(
            "Which item was ordered for 123456?", model="scripted", output_type=OrderFacts
        )

    assert result.outcome is Outcome.ANSWERED and result.output == OrderFacts(**FACTS)
    assert kinds(result) == ["rejected", "answer"]
    assert story(result)[0].text.startswith("output: rejected: quantity: ")
    assert result.usage.model_calls == len(chat.accepted) == 2
    repair = chat.accepted[1]["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert json.loads(repair[2]["content"]) == wrong  # the model reads its own value
    assert "quantity" in repair[3]["content"] and "Fix it" in repair[3]["content"]


async def test_invalid_values_past_the_limit_end_the_turn_gracefully(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    bad = final({"order_id": "123456", "item": "Herbal Handsoap", "quantity": 0})
    model = ScriptedModel(plans=[bad], decisions=[bad.model_copy(deep=True)])
    async with harness.worker(model) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        result = await agents.ask(
            "Which item was ordered for 123456?",
            model="scripted",
            limits=TurnLimits(max_replans=1),
            output_type=OrderFacts,
        )

    assert result.outcome is Outcome.INVALID_OUTPUT and result.output is None
    assert "could not give the answer in the form asked for after 1 correction" in result.answer
    assert "status" in result.answer  # why the last value did not fit
    assert kinds(result) == ["rejected", "rejected", "limit"]
    assert [k for k, _ in model.requests] == ["plan", "interpret"]
    # The repair: the model's call, answered by its errors, as any tool's result.
    _, repair = model.requests[1]
    said, answered = repair.messages[-2:]
    assert isinstance(said, AssistantMessage) and said.calls[0].name == OUTPUT_TOOL
    assert isinstance(answered, ToolResult) and not answered.ok
    assert "quantity" in answered.text and "status" in answered.text


async def test_words_where_a_value_is_due_go_back_to_the_model(harness: Harness) -> None:
    model = ScriptedModel(plans=[Reply(text="It is Herbal Handsoap.")], decisions=[final(FACTS)])
    async with harness.worker(model) as task_queue:
        turn = TurnInput(
            question="Which item was ordered for 123456?",
            model="scripted",
            output=output_spec(OrderFacts),
        )
        result = await (await start_turn(harness.client, turn, task_queue)).result()

    assert result.outcome is Outcome.ANSWERED and result.output == FACTS
    _, repair = model.requests[1]
    assert isinstance(repair.messages[-1], UserMessage)
    assert f"call {OUTPUT_TOOL}" in repair.messages[-1].text


async def test_a_killed_worker_still_delivers_the_value_once(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The offline model fills the type from the tool's result; the worker dies right
    after the model call that gave the value, before the turn heard of it."""
    task_queue = f"crash-typed-{uuid.uuid4().hex[:6]}"
    db, log, marker = tmp_path / "shop.db", tmp_path / "activities.log", tmp_path / "hung"
    ShopStore(db)
    first = spawn_worker(
        env, task_queue, str(db), "--log", str(log), "--crash-after", "interpret",
        "--marker", str(marker),
    )  # fmt: skip
    second = None
    try:
        turn = TurnInput(
            question="Which item was ordered for 123456?", output=output_spec(OrderFacts)
        )
        handle = await start_turn(env.client, turn, task_queue)
        await wait_for(marker)
        first.kill()
        first.wait()
        second = spawn_worker(env, task_queue, str(db), "--log", str(log))
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        for proc in (first, second):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()

    assert result.outcome is Outcome.ANSWERED
    facts = OrderFacts.model_validate(result.output)
    assert (facts.order_id, facts.item, facts.quantity) == ("123456", "Herbal Handsoap", 2)
    assert [s.kind for s in result.steps].count(StepKind.ANSWER) == 1
    runs = Counter(log.read_text().split())
    assert runs["interpret"] == 2 and runs["plan"] == 1, runs  # only the one in flight again
    # The turn ran to its end once: one result, and the value in it.
    history = await handle.fetch_history()
    completed = [
        e for e in history.events if e.HasField("workflow_execution_completed_event_attributes")
    ]
    assert len(completed) == 1


async def test_a_type_pydantic_cannot_describe_is_one_clear_line(
    env: WorkflowEnvironment,
) -> None:
    agents = AgentClient(env.client, task_queue="unused")
    with pytest.raises(AgentClientError, match="pydantic cannot describe it"):
        await agents.start("Which item?", output_type=object())
    with pytest.raises(ValueError, match="agent 'x': output_type"):
        Agent(name="x", output_type=object())


def test_the_strict_fake_refuses_a_schema_that_is_not_strict() -> None:
    spec = output_spec(OrderFacts)

    def asked(schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "json_schema",
            "json_schema": {"name": spec.name, "schema": schema, "strict": True},
        }

    problem = format_violation(asked(parameters(spec)))
    assert problem is not None and "'additionalProperties' is required" in problem
    closed = {**parameters(spec), "additionalProperties": False}
    problem = format_violation(asked(closed))
    assert problem is not None and "Missing 'shipped_on'" in problem
    assert format_violation(asked(strict_schema(spec) or {})) is None
    # A list, a scalar: an object whose `result` is the value, strict as well.
    for kind in (list[OrderFacts], int):
        assert format_violation(asked(strict_schema(output_spec(kind)) or {})) is None


async def test_a_dict_cannot_be_strict_so_it_goes_through_the_output_tool(
    harness: Harness, chat: ChatCompletionsServer
) -> None:
    assert strict_schema(output_spec(dict[str, int])) is None
    chat.replies = [tool_calls(("o1", OUTPUT_TOOL, '{"a": 1, "b": 2}'))]
    async with harness.worker(chat.model()) as task_queue:
        turn = TurnInput(
            question="Count them", model="scripted", output=output_spec(dict[str, int])
        )
        result = await (await start_turn(harness.client, turn, task_queue)).result()
    assert result.outcome is Outcome.ANSWERED and result.output == {"a": 1, "b": 2}
    [body] = chat.accepted
    assert "response_format" not in body
    assert body["tools"][-1]["function"]["name"] == OUTPUT_TOOL


def test_bedrock_is_made_to_end_with_the_output_tool() -> None:
    model = BedrockConverseModel("anthropic.claude", client=object())
    tool = Output.of_type(OrderFacts).tool()
    ask = ModelRequest(
        messages=[UserMessage(text="Which item?")], tools=[tool], final_tool=OUTPUT_TOOL
    )
    assert model.request(ask)["toolConfig"]["toolChoice"] == {"tool": {"name": OUTPUT_TOOL}}
    other = tool.model_copy(update={"name": "order_status"})
    ask = ask.model_copy(update={"tools": [other, tool]})
    assert model.request(ask)["toolConfig"]["toolChoice"] == {"any": {}}
    plain = ask.model_copy(update={"final_tool": ""})
    assert "toolChoice" not in model.request(plain)["toolConfig"]


class Tracking(BaseModel):
    order_id: str
    link: str


async def test_a_return_direct_result_does_not_end_a_typed_turn(harness: Harness) -> None:
    """The tool's text would be the answer of a text turn; a typed one needs the value."""
    track = ToolCall(id="c1", name="tracking_link", arguments={"order_id": "123456"})
    value = {"order_id": "123456", "link": "https://shop.example/track/123456"}
    model = ScriptedModel(plans=[Reply(calls=[track])], decisions=[final(value)])
    typed = replace(harness.agent(), output_type=Tracking)
    async with harness.worker(model, agents=[typed]) as task_queue:
        turn = TurnInput(question="Tracking link for 123456?", model="scripted")
        result = await (await start_turn(harness.client, turn, task_queue)).result()

    assert result.outcome is Outcome.ANSWERED and result.output == value
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
    assert [k for k, _ in model.requests] == ["plan", "interpret"]


async def test_asked_with_the_agent_itself_the_value_is_an_object_of_its_type(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """A type no other process could find by name (made inside a function: the turn
    records no place for it): asked by name, the value is JSON, as the caller knows no
    type; asked with the agent itself (a turn or a conversation), an object of it."""

    class Booking(BaseModel):
        slot_id: str
        doctor: str

    value = {"slot_id": "s-17", "doctor": "Dr Ng"}
    agent = Agent(
        name="clinic",
        model="test",
        models={"test": lambda _: TestModel(output=value)},
        output_type=Booking,
    )
    async with harness.worker(agents=[agent]) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        by_name = await agents.ask("Book me s-17", agent="clinic")
        by_agent = await agents.ask("Book me s-17", agent=agent)
        chatted = await agents.chat(agent=agent).send("Book me s-17")

    assert by_name.outcome is Outcome.ANSWERED and by_name.output_type == ""
    assert by_name.output == value and isinstance(by_name.output, dict)
    assert by_agent.output == Booking(**value) and isinstance(by_agent.output, Booking)
    assert isinstance(chatted.output, Booking)


async def test_a_type_this_process_has_not_loaded_is_json_and_is_never_imported(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The agent's worker runs in another process: the turn records where its type is
    defined, but the client imports no module a record names; once this process has
    loaded the module itself, the same turn's value is an object of the type."""
    module = "tests.typed_clinic"
    assert module not in sys.modules
    task_queue = f"typed-{uuid.uuid4().hex[:6]}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OTEL_"))}
    environ.update(
        TEMPORAL_ADDRESS=env.client.service_client.config.target_host,
        TEMPORAL_CONFIG_FILE=str(tmp_path / "no-such-temporal.toml"),
        AGENT_STATE_DIR=str(tmp_path / "state"),
        AGENT_PAYLOAD_STORE="off",  # inline payloads, as this process's client reads them
        AGENT_VERSIONING="off",
    )
    worker = subprocess.Popen(
        [sys.executable, "worker.py", "--agent", f"{module}:clinic", "--task-queue", task_queue],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert worker.stdout is not None
        said = [worker.stdout.readline()]
        while said[-1] and not said[-1].startswith("worker ready"):
            said.append(worker.stdout.readline())
        assert said[-1], said
        agents = AgentClient(env.client, task_queue=task_queue)
        first = await agents.ask("Book me the first slot on Monday")
        assert module not in sys.modules  # the record named it; nothing imported it
        typed = importlib.import_module(module)
        again = await agents.turn(first.workflow_id).result()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        sys.modules.pop(module, None)

    assert first.outcome is Outcome.ANSWERED, first.answer
    assert first.output_type == f"{module}:Slot"
    assert first.output == typed.SLOT and isinstance(first.output, dict)
    assert isinstance(again.output, typed.Slot) and again.output == typed.Slot(**typed.SLOT)
