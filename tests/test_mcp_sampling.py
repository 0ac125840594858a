"""MCP sampling as a durable step, against a real server written with the `mcp` SDK
(tests/fakes/sampling_server.py) whose tools ask the client's model for a message:
served by the agent's model as a recorded model call of its own, counted in the
turn's usage, and refused (one line the server gets) without a person's consent, with
`sampling: deny`, at the turn's token cap, or for what the model does not serve."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentClient
from durable_agent.elicitation import Question
from durable_agent.errors import ModelRequestRejected
from durable_agent.mcp import MCPConfigError, MCPServer, connected, load_config
from durable_agent.model import ModelRequest, Reply
from durable_agent.runtime.turns import start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shields import Position
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits, Usage
from tests.conftest import Harness, last_result
from tests.fakes.chat_completions import ChatCompletionsServer, text, tool_calls
from tests.test_mcp import (
    agent_with,
    client_py,
    everything_over_http,
    needs_npm,
    worker_environ,
    worker_process,
)
from tests.test_shields_turn import Keyword, at

pytestmark = pytest.mark.usefixtures("own_state_dir")
ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "fakes" / "sampling_server.py"
SYSTEM = "Summarise in one line."  # the server's system prompt
SAMPLED = Usage(input_tokens=30, output_tokens=7)


def sampling_server(log: Path, **options: Any) -> MCPServer:
    return MCPServer(name="sm", command=sys.executable, args=(str(SERVER), str(log)), **options)


def ran(log: Path) -> list[str]:
    """What the server's tool got from the client, each time it ran."""
    return log.read_text().splitlines() if log.exists() else []


def model(tool: str = "summarise", plan_usage: Usage | None = None) -> ScriptedModel:
    """Plans one call of `tool`; answers a sampling request (the server's system prompt)
    with one line, and the turn with the tool's result."""
    call = ToolCall(id="c1", name=f"sm__{tool}", arguments={"text": "the quarterly report"})
    if tool == "describe":
        call = call.model_copy(update={"arguments": {}})

    def reply(request: ModelRequest) -> Reply:
        if request.instructions == SYSTEM:
            return Reply(text="Sales rose.", usage=SAMPLED)
        return Reply(text=last_result(request))

    return ScriptedModel(
        plans=[Reply(calls=[call], usage=plan_usage or Usage())], decisions=[reply]
    )


def sampled(scripted: ScriptedModel) -> list[ModelRequest]:
    """The requests the model got for the server (not for the turn itself)."""
    return [r for _, r in scripted.requests if r.instructions == SYSTEM]


async def run_turn(
    harness: Harness,
    scripted: ScriptedModel,
    server: MCPServer,
    limits: TurnLimits | None = None,
    answer: str | None = None,
    approve: bool = False,
    **agent: Any,
) -> tuple[Any, list[Question]]:
    """The turn's result, and the questions it asked (each answered with `answer`);
    `approve`: a call that waits for consent gets it."""
    asked: list[Question] = []
    async with (
        connected([agent_with(server, **agent)]) as agents,
        harness.worker(scripted, agents=agents) as task_queue,
    ):
        handle = await start_turn(
            harness.client,
            TurnInput(question="Summarise the report", model="scripted", limits=limits),
            task_queue,
        )
        turn = AgentClient(harness.client, task_queue=task_queue).turn(handle.id)
        result_task = asyncio.ensure_future(turn.result())
        async with asyncio.timeout(120):
            while not result_task.done():
                waiting = await turn.questions()
                for q in waiting:
                    assert answer is not None, f"the turn asked: {q.message}"
                    asked.append(q)
                    await turn.answer(q.id, action=answer, by="alice")
                for pending in await turn.pending() if approve else ():
                    await turn.approve(pending.call.id, by="alice")
                await asyncio.wait({result_task}, timeout=0.1)
        return result_task.result(), asked


def steps(result: Any, kind: StepKind) -> list[str]:
    return [s.text for s in result.steps if s.kind is kind]


async def test_with_consent_the_request_is_a_recorded_model_call_counted_in_usage(
    harness: Harness, tmp_path: Path
) -> None:
    log, scripted = tmp_path / "ran.log", model()
    result, asked = await run_turn(harness, scripted, sampling_server(log), answer="accept")
    # One question, to the person the turn serves, through the elicitation machinery.
    [question] = asked
    assert question.id == "c1.sampling" and question.server == "sm"
    assert "asks to use the agent's model (1 message(s), up to 200 tokens)" in question.message
    # The server's first try met "not asked yet"; its second got the model's reply.
    assert ran(log)[0].startswith("error") and ran(log)[-1] == "sampled scripted: Sales rose."
    assert result.outcome is Outcome.ANSWERED and result.answer.startswith(
        "sampled scripted: Sales rose."
    )
    # The model got the server's request only: its system prompt, its message, its limit.
    [request] = sampled(scripted)
    assert [m.text for m in request.messages] == ["Summarise: the quarterly report"]
    assert not request.tools and request.settings and request.settings.max_tokens == 200
    # A model call of its own: a step, and in the turn's usage (plan, sample, interpret).
    assert steps(result, StepKind.SAMPLE) == [
        "sm__summarise: MCP server sm asks for the model: scripted answered (37 tokens)"
    ]
    assert result.usage.model_calls == 3
    assert result.usage.input_tokens >= 30 and result.usage.output_tokens >= 7


@pytest.mark.parametrize("answer", ["decline", "cancel"])
async def test_without_consent_the_server_gets_a_refusal_and_the_model_is_not_asked(
    harness: Harness, tmp_path: Path, answer: str
) -> None:
    log, scripted = tmp_path / "ran.log", model()
    result, asked = await run_turn(harness, scripted, sampling_server(log), answer=answer)
    assert len(asked) == 1 and not sampled(scripted)
    refusal = "sampling refused: no consent for 'sm' to use the agent's model in this turn"
    assert ran(log)[-1] == f"error {refusal}"
    assert steps(result, StepKind.SAMPLE)[-1].endswith(f"refused: {refusal[18:]}")


async def test_allow_serves_without_asking_and_deny_declares_no_sampling(
    harness: Harness, tmp_path: Path
) -> None:
    log, scripted = tmp_path / "allow.log", model()
    result, asked = await run_turn(harness, scripted, sampling_server(log, sampling="allow"))
    assert not asked and len(sampled(scripted)) == 1
    assert result.answer.startswith("sampled scripted: Sales rose.")

    log, scripted = tmp_path / "deny.log", model()
    result, asked = await run_turn(harness, scripted, sampling_server(log, sampling="deny"))
    # The client declares no sampling capability; the SDK refuses the request.
    assert not asked and not sampled(scripted)
    assert ran(log) == ["error Sampling not supported"]
    assert not steps(result, StepKind.SAMPLE)


async def test_a_turn_at_its_token_cap_refuses_sampling_in_one_line_without_asking(
    harness: Harness, tmp_path: Path
) -> None:
    log, scripted = tmp_path / "ran.log", model(plan_usage=Usage(input_tokens=60))
    result, asked = await run_turn(
        harness, scripted, sampling_server(log), limits=TurnLimits(max_tokens=50)
    )
    assert not asked and not sampled(scripted)
    assert ran(log)[-1] == "error sampling refused: the turn is at its token cap (50 tokens)"
    assert result.outcome is Outcome.TOKEN_LIMIT


async def test_a_request_the_model_does_not_serve_is_refused_in_one_line(
    harness: Harness, tmp_path: Path
) -> None:
    log, scripted = tmp_path / "ran.log", model("describe")
    result, asked = await run_turn(harness, scripted, sampling_server(log))
    assert not asked and not sampled(scripted)
    assert ran(log) == [
        "error MCP server 'sm' asked for the model with a message that is not text: text only"
    ]
    assert result.answer.startswith(ran(log)[0])


@pytest.mark.parametrize(
    ("position", "pattern", "refusal", "asked_model"),
    [
        ("input", "Summarise:", "blocked by the keyword shield (injection)", False),
        ("output", "Sales rose", "the reply was blocked by the keyword shield (leak)", True),
    ],
)
async def test_the_input_and_output_shields_judge_the_request_and_the_reply(
    harness: Harness,
    tmp_path: Path,
    position: Position,
    pattern: str,
    refusal: str,
    asked_model: bool,
) -> None:
    category = "injection" if position == "input" else "leak"
    shield = Keyword(pattern, category)
    log, scripted = tmp_path / "ran.log", model()
    server = sampling_server(log, sampling="allow")
    result, _ = await run_turn(harness, scripted, server, shields=at(position, shield))
    # The shield read the server's request (its system prompt and message) or the reply.
    judged = "Summarise: the quarterly report" if position == "input" else "Sales rose."
    assert any(judged in seen.text for seen in shield.seen)
    assert ran(log)[-1] == f"error sampling refused: {refusal}"
    assert len(sampled(scripted)) == int(asked_model)
    assert steps(result, StepKind.SAMPLE)[-1].endswith(f"refused: {refusal}")
    # A reply paid for is counted, even when a shield keeps it from the server.
    assert result.usage.output_tokens == (7 if asked_model else 0)


async def test_consent_holds_for_the_whole_turn_across_continue_as_new(
    harness: Harness, tmp_path: Path
) -> None:
    """Asked once per server per turn, not per run: the turn continues as new between
    its two rounds (at every safe point here), and the second call's request is served
    without asking again."""
    log = tmp_path / "ran.log"
    again = ToolCall(id="c2", name="sm__summarise", arguments={"text": "the annual report"})
    interpreted: list[str] = []

    def reply(request: ModelRequest) -> Reply:
        if request.instructions == SYSTEM:
            return Reply(text="Sales rose.", usage=SAMPLED)
        interpreted.append(last_result(request))
        return Reply(calls=[again]) if len(interpreted) == 1 else Reply(text="Both done.")

    first = ToolCall(id="c1", name="sm__summarise", arguments={"text": "the quarterly report"})
    scripted = ScriptedModel(plans=[Reply(calls=[first])], decisions=[reply])
    limits = TurnLimits(continue_after_events=10)
    result, asked = await run_turn(
        harness, scripted, sampling_server(log), limits=limits, answer="accept"
    )
    assert result.outcome is Outcome.ANSWERED and result.runs >= 2
    assert [q.id for q in asked] == ["c1.sampling"]
    assert len(sampled(scripted)) == 2
    assert [line for line in ran(log) if not line.startswith("error")] == [
        "sampled scripted: Sales rose."
    ] * 2


async def test_a_model_that_fails_on_the_request_refuses_it_and_the_turn_goes_on(
    harness: Harness, tmp_path: Path
) -> None:
    """The server's request fails, not the turn: the server reads one line saying the
    model failed (its kind, not its error's own text), and the model reads the tool's
    result as usual."""
    log = tmp_path / "ran.log"

    def reply(request: ModelRequest) -> Reply:
        if request.instructions == SYSTEM:
            raise ModelRequestRejected("the provider refused: secret-key-123 invalid")
        return Reply(text=last_result(request))

    call = ToolCall(id="c1", name="sm__summarise", arguments={"text": "the quarterly report"})
    scripted = ScriptedModel(plans=[Reply(calls=[call])], decisions=[reply])
    server = sampling_server(log, sampling="allow")
    result, _ = await run_turn(harness, scripted, server)
    refused = ran(log)[-1]
    assert refused.startswith(
        "error sampling refused: the agent's model failed (model request rejected: scripted"
    )
    assert "secret-key-123" not in refused
    assert result.outcome is Outcome.ANSWERED and result.answer.startswith(refused)
    assert steps(result, StepKind.SAMPLE)[-1].endswith(refused.removeprefix("error sampling "))
    assert not steps(result, StepKind.LIMIT)


@pytest.mark.parametrize(
    ("value", "says"), [("sometimes", "sampling is ask, allow or deny"), (True, "sampling is ask")]
)
def test_a_bad_sampling_setting_is_refused_in_one_line(
    tmp_path: Path, value: Any, says: str
) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"sm": {"command": "x", "sampling": value}}}))
    with pytest.raises(MCPConfigError, match=says):
        load_config(config)


async def test_a_worker_killed_while_consent_waits_loses_nothing(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The consent is workflow state: a worker SIGKILLed while it waits, the consent
    given on the command line with no worker running, and another worker started, the
    call is sent again and the server gets the model's reply."""
    log = tmp_path / "ran.log"
    fake = ChatCompletionsServer()
    fake.replies = [
        tool_calls(("c1", "sm__summarise", json.dumps({"text": "the quarterly report"}))),
        text("Sales rose."),  # the server's request
        text("Done."),
    ]
    config = tmp_path / "mcp.json"
    entry = {"command": sys.executable, "args": [str(SERVER), str(log)]}
    config.write_text(json.dumps({"mcpServers": {"sm": entry}}))
    environ = worker_environ(env, tmp_path, fake)
    client = AgentClient(env.client, task_queue=environ["AGENT_TASK_QUEUE"])

    def cli(*args: str) -> Awaitable[subprocess.CompletedProcess[str]]:
        return client_py(environ, *args)

    try:
        with worker_process(environ, "worker.py", "--mcp-config", str(config)) as first:
            handle = await start_turn(
                env.client,
                TurnInput(question="Summarise the report", customer_id="c-sm"),
                environ["AGENT_TASK_QUEUE"],
            )
            turn = client.turn(handle.id)
            async with asyncio.timeout(120):
                while not (waiting := await turn.questions()):
                    await asyncio.sleep(0.05)
            first.process.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(first.process.wait, 60) == -signal.SIGKILL
        # No worker runs: the consent is still listed, and taken for when one does.
        listed = await cli("pending", "--customer", "c-sm")
        assert listed.returncode == 0, listed.stderr
        assert f"{handle.id}  c1.sampling  sm asks: MCP server 'sm' asks to use" in listed.stdout
        given = await cli("answer", handle.id, waiting[0].id, "--accept")
        assert given.returncode == 0, given.stderr
        assert "the answer is recorded, and applies when one runs the turn" in given.stdout
        assert len(ran(log)) == 1 and len(fake.accepted) == 1  # nothing sampled yet
        with worker_process(environ, "worker.py", "--mcp-config", str(config)):
            result = await turn.result()
    finally:
        fake.close()
    assert result.outcome is Outcome.ANSWERED
    assert ran(log)[-1] == "sampled openai:test-model: Sales rose."
    sampled_request = fake.accepted[1]
    assert not sampled_request.get("tools") and sampled_request["max_tokens"] == 200
    assert [m["role"] for m in sampled_request["messages"]] == ["system", "user"]
    assert result.usage.model_calls == 3


@needs_npm
async def test_server_everythings_sampling_tool_gets_the_models_reply(
    harness: Harness,
) -> None:
    """Another SDK's server (TypeScript: `@modelcontextprotocol/server-everything`, which
    offers its sampling tool only to a client that declares sampling) gets the reply."""
    call = ToolCall(
        id="c1",
        name="everything__trigger-sampling-request",
        arguments={"prompt": "say hi", "maxTokens": 50},
    )

    def reply(request: ModelRequest) -> Reply:
        if request.instructions == "You are a helpful test server.":
            return Reply(text="Hi from the agent's model.", usage=SAMPLED)
        return Reply(text=last_result(request))

    scripted = ScriptedModel(plans=[Reply(calls=[call])], decisions=[reply])
    with everything_over_http() as url:
        server = MCPServer(name="everything", url=url, sampling="allow")
        # The tool is a write: consent to the call first, then no question for sampling.
        result, asked = await run_turn(harness, scripted, server, approve=True)
    assert not asked
    assert result.outcome is Outcome.ANSWERED
    assert "LLM sampling result" in result.answer
    assert "Hi from the agent's model." in result.answer
    assert steps(result, StepKind.SAMPLE)[-1].endswith("scripted answered (37 tokens)")
