"""Per-turn context and instructions that depend on it, on a real server and worker:
the caller's context reaches the tools (`ctx.context`), the instructions function and
the sub-agents; the function runs once per turn, in an activity whose result the
history keeps, so a turn picked up by another worker (a replay) uses the text it got and
never calls the function again; a context that cannot travel is refused at the client."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.worker import Replayer

from durable_agent import Agent, AgentClient, ToolContext, tool
from durable_agent.commands.worker import build_worker
from durable_agent.errors import AgentClientError, InvalidContext
from durable_agent.model import ModelRequest, Reply
from durable_agent.runtime.codec import LEAN_DATA_CONVERTER
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.types import MAX_CONTEXT_BYTES, Outcome, ToolCall
from durable_agent.workflows import AgentTurn, Conversation
from tests.conftest import Harness, last_result
from tests.procs import Forks

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = {"name": "Ada", "plan": "pro", "locale": "fr-FR", "tenant": "acme", "date": "2026-12-01"}


class Nothing(BaseModel):
    pass


class Note(BaseModel):
    text: str


@tool(quick=True)
def whoami(args: Nothing, ctx: ToolContext[Any]) -> str:
    """Who is asking, as the caller said."""
    return f"{ctx.context.get('name', 'nobody')} on plan {ctx.context.get('plan', '-')}"


@tool(side_effects=True)
def save_note(args: Note, ctx: ToolContext[list[str]]) -> str:
    """Save a note for the customer."""
    ctx.deps.append(args.text)
    return "saved"


class Counted:
    """Instructions that differ on every call, and say how often they were made."""

    def __init__(self, prefix: str = "call") -> None:
        self.prefix = prefix
        self.calls: list[dict[str, Any]] = []

    def __call__(self, context: dict[str, Any], deps: Any) -> str:
        self.calls.append(context)
        who = context.get("name", "a customer")
        return f"{self.prefix} #{len(self.calls)}: you speak to {who} in {context.get('locale')}."


def instructions_seen(model: ScriptedModel) -> list[str]:
    return [request.instructions for _, request in model.requests]


def answering_with_tool() -> ScriptedModel:
    return ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="whoami")])],
        decisions=[lambda req: Reply(text=last_result(req))],
    )


def agent_of(model: ScriptedModel, instructions: Any, **fields: Any) -> Agent:
    return Agent(
        name="concierge",
        instructions=instructions,
        tools=[whoami, save_note],
        model="scripted",
        models={"scripted": lambda _: model},
        deps=[],
        **fields,
    )


async def test_context_reaches_a_tool_and_the_instructions(harness: Harness) -> None:
    model = answering_with_tool()
    made = Counted()
    agent = agent_of(model, made)
    async with harness.worker(agents=[agent]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        result = await client.ask("Who am I?", context=CONTEXT)

    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "Ada on plan pro"
    assert made.calls == [CONTEXT]  # the function got the caller's context, once
    text = "call #1: you speak to Ada in fr-FR."
    assert instructions_seen(model) == [text, text]  # every model call of the turn
    # The turn's fingerprint is that of the text it used, not of the definition.
    assert result.fingerprint != agent.fingerprint()
    assert result.fingerprint == replace(agent, instructions=text).fingerprint()


async def test_instructions_are_evaluated_once_per_turn(harness: Harness) -> None:
    model = answering_with_tool()
    made = Counted()
    async with harness.worker(agents=[agent_of(model, made)]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        first = await client.ask("Who am I?", context={"name": "Ada", "locale": "fr-FR"})
        second = await client.ask("Who am I?", context={"name": "Bo", "locale": "sv-SE"})

    assert len(made.calls) == 2  # one per turn, though each turn made two model calls
    assert instructions_seen(model) == [
        "call #1: you speak to Ada in fr-FR.",
        "call #1: you speak to Ada in fr-FR.",
        "call #2: you speak to Bo in sv-SE.",
        "call #2: you speak to Bo in sv-SE.",
    ]
    assert first.fingerprint != second.fingerprint


async def test_async_instructions_get_the_agents_deps(harness: Harness) -> None:
    model = ScriptedModel(plans=[Reply(text="Hello.")])

    async def instructions(context: dict[str, Any], deps: dict[str, str]) -> str:
        await asyncio.sleep(0)
        return f"Plan {context['plan']}: {deps[context['plan']]}"

    agent = replace(agent_of(model, instructions), deps={"pro": "answer in depth."})
    async with harness.worker(agents=[agent]) as task_queue:
        result = await AgentClient(harness.client, task_queue=task_queue).ask(
            "Hi", context={"plan": "pro"}
        )
    assert result.outcome is Outcome.ANSWERED
    assert instructions_seen(model) == ["Plan pro: answer in depth."]


async def test_plain_instructions_cost_no_activity(harness: Harness) -> None:
    """The common case: text instructions, no extra step in the turn's history."""
    model = ScriptedModel(plans=[Reply(text="Hello.")])
    async with harness.worker(agents=[agent_of(model, "Be brief.")]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        turn = await client.start("Hi", context=CONTEXT)
        await turn.result()
        history = await turn.temporal.fetch_history()
    kinds = [
        e.marker_recorded_event_attributes.details["data"].payloads[0].data
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    assert kinds and not any(b'"instructions"' in k for k in kinds)
    assert instructions_seen(model) == ["Be brief."]


async def test_a_failing_instructions_function_ends_the_turn_saying_why(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(plans=[Reply(text="unreachable")])

    def broken(context: dict[str, Any], deps: Any) -> str:
        return ""  # no text: a definition to fix, not retried

    async with harness.worker(agents=[agent_of(model, broken)]) as task_queue:
        result = await AgentClient(harness.client, task_queue=task_queue).ask("Hi")
    assert result.outcome is Outcome.MODEL_ERROR
    assert "instructions could not be prepared" in result.answer
    # What is wrong with the function is for whoever runs the agent: the worker's log.
    assert "returned empty text" in caplog.text and "returned empty text" not in result.answer
    assert model.requests == []


async def test_sub_agents_get_the_context_unless_told_otherwise(harness: Harness) -> None:
    expert_model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="e1", name="whoami")])],
        decisions=[lambda req: Reply(text=last_result(req))],
    )
    made = Counted("expert")
    expert = Agent(
        name="expert",
        instructions=made,
        tools=[whoami],
        model="expert-model",
        models={"expert-model": lambda _: expert_model},
    )
    asks = ToolCall(id="c1", name="expert", arguments={"question": "Who is this?"})
    asks_private = ToolCall(id="c2", name="private", arguments={"question": "Who is this?"})
    model = ScriptedModel(
        plans=[Reply(calls=[asks, asks_private])],
        decisions=[lambda req: Reply(text=" | ".join(r.text for r in _results(req)))],
    )
    front = Agent(
        name="front",
        tools=[expert.as_tool(), expert.as_tool("private", share_context=False)],
        model="scripted",
        models={"scripted": lambda _: model},
    )
    async with harness.worker(agents=[front]) as task_queue:
        result = await AgentClient(harness.client, task_queue=task_queue).ask(
            "Ask the expert who I am.", context=CONTEXT
        )
    assert result.outcome is Outcome.ANSWERED
    assert sorted(result.answer.split(" | ")) == ["Ada on plan pro", "nobody on plan -"]
    assert sorted(c.get("name", "") for c in made.calls) == ["", "Ada"]


def _results(request: ModelRequest) -> list[Any]:
    from durable_agent.conversation import latest_results

    return latest_results(request.messages)


async def test_conversations_give_their_context_to_every_turn(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="whoami")])],
        decisions=[lambda req: Reply(text=last_result(req))],
    )
    async with harness.worker(agents=[agent_of(model, "Be brief.")]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        chat = client.chat(context=CONTEXT, stream=False)
        first = await chat.send("Who am I?")
        second = await chat.send("And now?")
        await chat.end()
    assert first.answer == second.answer == "Ada on plan pro"


@asynccontextmanager
async def serving(harness: Harness, task_queue: str, agent: Agent) -> AsyncIterator[None]:
    settings = replace(Settings.from_env(), versioning=False, workflow_sandbox=True)
    async with build_worker(harness.client, task_queue, agents=[agent], settings=settings):
        yield


async def test_a_replayed_turn_uses_the_recorded_instructions(harness: Harness) -> None:
    """A turn waits for consent on worker A; worker B, whose function would give other
    text, finishes it: B replays the turn from its history, reads the text A's function
    gave, and sends that to the model, never calling its own function. Replayed again
    from the finished history, the turn is deterministic."""
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="save_note", arguments={"text": "hi"})])],
        decisions=[Reply(text="Saved.")],
    )
    first, second = Counted("worker A"), Counted("worker B")
    task_queue = f"test-{uuid.uuid4().hex[:8]}"
    client = AgentClient(harness.client, task_queue=task_queue)
    async with serving(harness, task_queue, agent_of(model, first)):
        turn = await client.start("Save a note saying hi", context=CONTEXT)
        while not await turn.pending():
            await asyncio.sleep(0.1)
    assert len(first.calls) == 1
    async with serving(harness, task_queue, agent_of(model, second)):
        await turn.approve(by="test")
        result = await turn.result()

    assert result.outcome is Outcome.ANSWERED, result.answer
    assert second.calls == []  # worker B never evaluated the instructions
    text = "worker A #1: you speak to Ada in fr-FR."
    assert instructions_seen(model) == [text, text]  # plan on A, interpret on B
    history = await turn.temporal.fetch_history()
    replayer = Replayer(workflows=[AgentTurn, Conversation], data_converter=LEAN_DATA_CONVERTER)
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None


async def test_context_over_its_limit_is_refused_at_the_client(harness: Harness) -> None:
    client = AgentClient(harness.client, task_queue="nobody-serves-this")
    big = {"notes": "x" * MAX_CONTEXT_BYTES}
    with pytest.raises(InvalidContext, match=r"the context is too large \(16,396 bytes"):
        await client.start("Hi", context=big)
    with pytest.raises(InvalidContext, match="must be a JSON object, not list"):
        await client.start("Hi", context=["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(InvalidContext, match="must be JSON data"):
        await client.start("Hi", context={"when": object()})
    with pytest.raises(InvalidContext):
        client.chat(context=big)
    assert issubclass(InvalidContext, AgentClientError)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ('{"notes": "' + "x" * MAX_CONTEXT_BYTES + '"}', "--context: the context is too large"),
        ("[1, 2]", "--context: the context must be a JSON object, not list"),
        ("{name: Ada}", "--context: give a JSON object"),
        ('{"score": NaN}', "--context: context['score'] is nan, which JSON cannot hold"),
        ('{"a": [1, {"b": -Infinity}]}', "--context: context['a'][1]['b'] is -inf, which JSON"),
        ('{"a": ' * 5000 + "1" + "}" * 5000, "--context: the context nests lists and objects"),
    ],
)
def test_the_cli_refuses_a_bad_context_in_one_line(cli_forks: Forks, given: str, said: str) -> None:
    done = cli_forks.run(["client.py", "ask", "Hi", "--context", given], dict(os.environ))
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: {said}")
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


async def test_the_pages_instructions_function_adapts_the_bookstore_to_each_user(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/your-own-agent.md's bookstore, with the page's instructions function: each
    turn gets instructions of its own user's words, and answers."""
    from tests.test_examples import DOC, code_blocks

    module, *rest = code_blocks(DOC.read_text(), "python")
    (snippet,) = [block for block in rest if block.startswith("def instructions")]
    monkeypatch.chdir(tmp_path)  # the shelf's SQLite file
    namespace: dict[str, Any] = {"__name__": "bookstore"}
    exec(module + "\n" + snippet, namespace)
    seen: list[str] = []
    model = ScriptedModel(
        plans=[
            lambda req: (
                seen.append(req.instructions)
                or Reply(calls=[ToolCall(id="c1", name="book_price", arguments={"isbn": ISBN})])
            )
        ],
        decisions=[lambda req: Reply(text=last_result(req))],
    )
    agent = replace(namespace["agent"], model="scripted", models={"scripted": lambda _: model})
    async with harness.worker(agents=[agent]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        pro = await client.ask(
            f"How much is the book {ISBN}?", context={"name": "Ada", "plan": "pro"}
        )
        free = await client.ask(
            f"How much is the book {ISBN}?", context={"name": "Bo", "locale": "sv-SE"}
        )

    assert pro.outcome is free.outcome is Outcome.ANSWERED
    assert "$9.99" in pro.answer
    assert "speaking to Ada (locale en-GB)" in seen[0] and "hold 5 book(s)" in seen[0]
    assert "speaking to Bo (locale sv-SE)" in seen[1] and "hold 1 book(s)" in seen[1]


ISBN = "9780141187761"
