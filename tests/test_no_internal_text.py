"""No internal text reaches the customer: a failure inside the worker (a model backend's
error, an instructions function's exception, a model that fell back) is told in the
turn's answer and steps by its kind, in a fixed sentence; the error's own text, which
may hold an API key a provider repeats, goes to the worker's log and the trace only,
with credentials masked. A tool's error keeps its words (the model needs them), its
credentials masked too. Nothing unmasked is kept in the turn's history either.

Through the worker (in this process, its log read by `caplog`) and through
`python worker.py` against an OpenAI-compatible server whose 401 repeats the key, its
JSON log and its OTLP spans read as an operator would."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durable_agent import Agent, AgentClient, ToolContext, answers, tool
from durable_agent.chat import ConversationInput
from durable_agent.errors import (
    InvalidModelOutput,
    ModelRequestRejected,
    ModelUnavailable,
    NotFound,
    UnknownModel,
)
from durable_agent.model import Reply
from durable_agent.runtime.turns import start_chat, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.tools import ToolRegistry
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnOutput
from durable_agent.workflows import Conversation, UnversionedConversation
from tests.conftest import Harness, last_result
from tests.fakes.chat_completions import ChatCompletionsServer, error
from tests.fakes.otlp import OtlpReceiver

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-proj-Zx81Lm0Qp7Rt4Vw2Yb9Nc3Kd6Fg5Hj1Aa"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ3b3JrZXIifQ.c2lnbmF0dXJlLXNlY3JldA"
PASSWORD = "Tr0ub4dor-and-3"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEK3Y"
SECRETS = (KEY, TOKEN, PASSWORD, AWS_SECRET)


def shown(result: TurnOutput) -> str:
    """Everything a front end shows of a turn: its answer and every step's text."""
    steps = [s.text for s in result.steps]
    steps += [s.observation.text for s in result.steps if s.observation]
    return "\n".join([result.answer, *steps])


async def recorded(handle: WorkflowHandle[Any, Any]) -> str:
    return (await handle.fetch_history()).to_json()


def no_secret_in(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


MODEL_FAILURES = [
    pytest.param(
        ModelRequestRejected(
            f"model endpoint refused the credentials (401: Incorrect API key provided: {KEY}); "
            "check OPENAI_API_KEY"
        ),
        "model request rejected: scripted failed (request rejected)",
        answers.model_rejected(),
        "Incorrect API key provided: sk-***",
        id="rejected-key",
    ),
    pytest.param(
        UnknownModel("scripted-x", ["offline"]),
        "model request rejected: scripted failed (unknown model)",
        answers.model_rejected(),
        "unknown model 'scripted-x'",
        id="unknown-model",
    ),
    pytest.param(
        InvalidModelOutput(f"reply not JSON; the request had Authorization: Bearer {TOKEN}"),
        "model reply unusable: scripted failed (reply unusable)",
        answers.model_unusable(),
        "reply not JSON; the request had Authorization: ***",
        id="unusable-bearer",
    ),
    pytest.param(
        ModelUnavailable(f"https://app:{PASSWORD}@llm.internal:8443 unreachable"),
        "model unavailable: scripted failed (unavailable)",
        answers.model_failed([]),
        "https://app:***@llm.internal:8443 unreachable",
        id="unavailable-url-password",
    ),
    pytest.param(
        RuntimeError(f"boto3 said: aws_secret_access_key={AWS_SECRET} is not valid"),
        "model reply unusable: scripted failed (reply unusable)",
        answers.model_unusable(),
        "boto3 said: aws_secret_access_key=*** is not valid",
        id="crash-aws-secret",
    ),
]


@pytest.mark.parametrize(("failure", "step", "answer", "logged"), MODEL_FAILURES)
async def test_a_models_error_is_told_by_its_kind_and_logged_masked(
    skipping_harness: Harness,
    caplog: pytest.LogCaptureFixture,
    failure: Exception,
    step: str,
    answer: str,
    logged: str,
) -> None:
    model = ScriptedModel(plans=[failure])
    result, handle = await skipping_harness.ask_with_handle(
        "Has order 123456 shipped?", model=model
    )

    assert result.outcome is Outcome.MODEL_ERROR
    assert result.answer == answer
    assert step in [s.text for s in result.steps if s.kind is StepKind.LIMIT]
    said = str(failure).split(":")[0]
    assert said not in shown(result)  # not even the unmasked part of the error's words
    assert logged in caplog.text  # the operator reads it, masked
    no_secret_in(shown(result), caplog.text, await recorded(handle))


class Lookup(BaseModel):
    order_id: str = Field(pattern=r"^\d{6}$", description="order ID (6 digits, like 123456)")


@tool
def order_status(args: Lookup, ctx: ToolContext[None]) -> str:
    """Status of one order."""
    raise NotFound(f"no order {args.order_id} in shop-db (connected with password={PASSWORD})")


@tool(max_attempts=2)
def order_history(args: Lookup, ctx: ToolContext[None]) -> str:
    """History of one order."""
    raise ConnectionError(f"history service refused Authorization: Bearer {TOKEN}")


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("order_status", "no order 999999 in shop-db (connected with password=***)"),
        ("order_history", "history service refused Authorization: ***"),
    ],
)
async def test_a_tools_error_keeps_its_words_and_loses_its_credentials(
    harness: Harness, caplog: pytest.LogCaptureFixture, name: str, kept: str
) -> None:
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name=name, arguments={"order_id": "999999"})])],
        decisions=[lambda req: Reply(text=f"The tool said: {last_result(req)}")],
    )
    tools = ToolRegistry([order_status, order_history])
    result, handle = await harness.ask_with_handle(
        "Has order 999999 shipped?", model=model, tools=tools
    )

    assert result.outcome is Outcome.ANSWERED
    (observation,) = [s.observation for s in result.steps if s.observation]
    assert not observation.ok and observation.text == kept  # what the model read
    assert kept in result.answer
    no_secret_in(shown(result), caplog.text, await recorded(handle))


async def test_an_instructions_functions_exception_is_the_operators(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(plans=[Reply(text="unreachable")])

    def profile(context: dict[str, Any], deps: Any) -> str:
        raise RuntimeError(f"profiles at postgresql://app:{PASSWORD}@db.internal/p: timeout")

    agent = Agent(
        name="concierge",
        instructions=profile,
        model="scripted",
        models={"scripted": lambda _: model},
    )
    async with harness.worker(agents=[agent]) as task_queue:
        turn = await AgentClient(harness.client, task_queue=task_queue).start("Hi")
        result = await turn.result()
        history = await recorded(turn.temporal)

    assert result.outcome is Outcome.MODEL_ERROR
    assert result.answer == answers.instructions_failed()
    limits = [s.text for s in result.steps if s.kind is StepKind.LIMIT]
    assert "instructions: could not be prepared" in limits
    assert "profiles at" not in shown(result)
    assert "profiles at postgresql://app:***@db.internal/p: timeout" in caplog.text
    assert model.requests == []
    no_secret_in(shown(result), caplog.text, history)


async def test_the_fallback_step_names_the_models_and_the_kind_only(
    skipping_harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    primary = ScriptedModel(plans=[ModelUnavailable(f"throttled; key {KEY}")], name="primary")
    backup = ScriptedModel(plans=[Reply(text="Fine.")], name="backup")
    agent = Agent(
        name="desk",
        model=["primary", "backup"],
        models={"primary": lambda _: primary, "backup": lambda _: backup},
    )
    async with skipping_harness.worker(agents=[agent]) as task_queue:
        turn = await AgentClient(skipping_harness.client, task_queue=task_queue).start("Hi")
        result = await turn.result()
        history = await recorded(turn.temporal)

    assert result.outcome is Outcome.ANSWERED and result.answer == "Fine."
    fallbacks = [s.text for s in result.steps if s.kind is StepKind.FALLBACK]
    assert fallbacks == ["primary failed (unavailable); asking backup"]
    assert "throttled" not in shown(result)
    assert "throttled; key sk-***" in caplog.text
    no_secret_in(shown(result), caplog.text, history)


@workflow.defn(name="AgentTurn", sandboxed=False)
class FailingTurn:
    """A turn whose workflow fails with an operator's words (as a fork refused, or a
    bug, does): what its conversation tells the customer."""

    @workflow.run
    async def run(self, turn: Any) -> None:
        raise ApplicationError(
            f"profiles at postgresql://app:{PASSWORD}@db.internal/p refused", non_retryable=True
        )


async def test_a_chat_turn_that_fails_is_told_without_its_error(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    task_queue = f"failing-{uuid.uuid4().hex[:8]}"
    async with Worker(
        harness.client,
        task_queue=task_queue,
        workflows=[UnversionedConversation, FailingTurn],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        conversation, _ = await start_chat(harness.client, ConversationInput(), "Hi", task_queue)
        deadline = time.monotonic() + 30
        while not (state := await conversation.query(Conversation.state)).exchanges:
            assert time.monotonic() < deadline, "the turn never ended"
            await asyncio.sleep(0.05)

    (exchange,) = state.exchanges
    assert exchange.answer == "(no answer: the turn ended without one)"
    assert "profiles at postgresql://app:***@db.internal/p refused" in caplog.text
    no_secret_in(exchange.answer, caplog.text)


async def test_a_workers_log_and_trace_hold_a_providers_error_masked(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`python worker.py` on an OpenAI-compatible server that refuses its key and says
    the key back, as OpenAI's 401 does: the customer reads a fixed sentence, the
    operator the provider's words in the worker's JSON log and its spans, key masked."""
    server = ChatCompletionsServer()
    server.replies = [error(401, message=f"Incorrect API key provided: {KEY}.")]
    task_queue = f"secrets-{uuid.uuid4().hex[:8]}"
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    }
    with OtlpReceiver() as otlp:
        proc = subprocess.Popen(
            [sys.executable, "worker.py", "--log-format", "json", "--log-level", "info"],
            cwd=ROOT,
            env=base
            | {
                "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
                "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
                "AGENT_TASK_QUEUE": task_queue,
                "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
                "AGENT_MODEL": "openai:test-model",
                "OPENAI_BASE_URL": server.url,
                "OPENAI_API_KEY": server.api_key,
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and "worker ready" in proc.stdout.readline()
            handle = await start_turn(env.client, TurnInput(question="Hi"), task_queue)
            result = await handle.result()
            history = await recorded(handle)
        finally:
            proc.terminate()
            _, log = proc.communicate(timeout=30)
            server.close()
        otlp.wait_for(
            lambda: any(s.name == "invoke_agent shop" for s in otlp.spans()), what_for="the turn"
        )
        spans = otlp.spans()

    assert len(server.requests) == 1
    assert result.outcome is Outcome.MODEL_ERROR and result.answer == answers.model_rejected()
    limit = "model request rejected: the worker's default model failed (request rejected)"
    assert limit in [s.text for s in result.steps if s.kind is StepKind.LIMIT]
    assert "Incorrect API key" not in shown(result)

    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    mine = "\n".join(json.dumps(line) for line in lines if line.get("workflow_id") == handle.id)
    assert "Incorrect API key provided: sk-***." in mine  # the activity's and the turn's

    (turn,) = [s for s in spans if s.name == "invoke_agent shop"]
    assert turn.events["turn_failure"]["agent.failure.reason"] == limit
    assert (
        "Incorrect API key provided: sk-***." in turn.events["turn_failure"]["agent.failure.error"]
    )
    (chat,) = [s for s in spans if s.name == "chat test-model"]
    assert "Incorrect API key provided: sk-***." in chat.events["exception"]["exception.message"]
    assert "sk-***" in chat.status
    (attempt,) = [s for s in spans if s.name == "RunActivity:plan"]
    assert "sk-***" in attempt.events["exception"]["exception.stacktrace"]
    no_secret_in(shown(result), log, history, repr(spans))
