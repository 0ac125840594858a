"""Model fallback through real turns, against two strict Chat Completions servers
(`tests/fakes/chat_completions.py`): the next model gets the request when one fails for
good (unavailable through its retries, a request it will not take), never when the
request would fail anywhere (credentials refused); the step says which model answered,
and the turn asks the failed model no more."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from openai import AsyncOpenAI
from temporalio.exceptions import ApplicationError, TimeoutError, TimeoutType

from durable_agent import Agent, AgentClient, ToolContext, tool
from durable_agent.backends.openai_chat import OpenAIChatModel, classify
from durable_agent.errors import (
    AgentClientError,
    InvalidModelOutput,
    ModelCannotAnswer,
    ModelRequestRejected,
    ModelUnavailable,
    UnknownModel,
)
from durable_agent.fallback import next_may_answer, share, specs
from durable_agent.types import Outcome, StepKind
from tests.conftest import Harness, story
from tests.fakes.chat_completions import ChatCompletionsServer, error, running, text, tool_calls
from tests.test_context import Nothing

# Retried soon: the server says when to come back (retry-after-ms: 10), which the
# activity honours over the policy's backoff (0.5 s, doubling), so five attempts take
# about four seconds (the dev server's timers fire about a second apart), not 7.5.
DOWN = error(503, {"retry-after-ms": "10"}, "The engine is currently overloaded.")
ATTEMPTS = 5  # workflows/policies.py MODEL_RETRY


@pytest.fixture
def primary() -> Iterator[ChatCompletionsServer]:
    yield from running()


@pytest.fixture
def backup() -> Iterator[ChatCompletionsServer]:
    yield from running()


@tool(quick=True)
def status(args: Nothing, ctx: ToolContext[Any]) -> str:
    """The service's status."""
    return "all systems go"


def agent(primary: ChatCompletionsServer, backup: ChatCompletionsServer, **fields: Any) -> Agent:
    return Agent(
        name="support",
        tools=[status],
        models={"primary": lambda _: primary.model(), "backup": lambda _: backup.model()},
        **fields,
    )


async def test_a_model_down_through_its_retries_falls_back_to_the_next(
    harness: Harness, primary: ChatCompletionsServer, backup: ChatCompletionsServer
) -> None:
    primary.replies = [DOWN] * ATTEMPTS
    backup.replies = [tool_calls(("call_1", "status", "{}")), text("All systems go.")]
    served = agent(primary, backup, model=["primary", "backup"])
    async with harness.worker(agents=[served]) as task_queue:
        result = await AgentClient(harness.client, task_queue=task_queue).ask("Status?")

    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "All systems go."
    assert [r.status for r in primary.requests] == [503] * ATTEMPTS  # then never again
    assert len(backup.accepted) == 2  # plan and interpret
    steps = story(result)
    assert [s.kind for s in steps] == [
        StepKind.FALLBACK,
        StepKind.PLAN,
        StepKind.TOOL_CALL,
        StepKind.OBSERVATION,
        StepKind.ANSWER,
    ]
    # The models and the kind of failure; what the endpoint said is the operator's.
    assert steps[0].text == "primary failed (unavailable); asking backup"
    assert steps[1].model == "backup" and steps[-1].model == "backup"  # who answered


async def test_a_turn_names_its_models_in_order(
    harness: Harness, primary: ChatCompletionsServer, backup: ChatCompletionsServer
) -> None:
    """`ask(model=[...])` (`--model a,b`): the turn's list, over the agent's default."""
    primary.replies = [DOWN] * ATTEMPTS
    backup.replies = [text("Fine.")]
    async with harness.worker(agents=[agent(primary, backup, model="primary")]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        result = await client.ask("Status?", model=["primary", "backup"])
        with pytest.raises(AgentClientError, match="each spec once"):
            await client.start("Status?", model="primary,primary")

    assert result.outcome is Outcome.ANSWERED and result.answer == "Fine."
    assert story(result)[-1].model == "backup"


async def test_bad_credentials_stop_at_once_with_the_first_models_error(
    harness: Harness,
    primary: ChatCompletionsServer,
    backup: ChatCompletionsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backup.replies = [text("never asked")]
    served = agent(primary, backup, model=["primary", "backup"])
    wrong_key = AsyncOpenAI(base_url=primary.url, api_key="not-the-key", max_retries=0)
    served = replace(
        served,
        models={**served.models, "primary": lambda _: OpenAIChatModel("test-model", wrong_key)},
    )
    async with harness.worker(agents=[served]) as task_queue:
        result = await AgentClient(harness.client, task_queue=task_queue).ask("Status?")

    assert result.outcome is Outcome.MODEL_ERROR
    assert "refused the request" in result.answer
    assert "refused the credentials (401" in caplog.text and "OPENAI_API_KEY" in caplog.text
    assert [r.status for r in primary.requests] == [401]  # not retried
    assert backup.requests == []  # not asked: another model would not fix this
    assert not any(s.kind is StepKind.FALLBACK for s in result.steps)


async def test_a_request_too_long_for_one_model_goes_to_the_next(
    harness: Harness, primary: ChatCompletionsServer, backup: ChatCompletionsServer
) -> None:
    primary.replies = [
        (
            400,
            {},
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
        )
    ]
    backup.replies = [text("Fine.")]
    served = agent(primary, backup, model=["primary", "backup"])
    async with harness.worker(agents=[served]) as task_queue:
        result = await AgentClient(harness.client, task_queue=task_queue).ask("Status?")

    assert result.outcome is Outcome.ANSWERED
    assert len(primary.requests) == 1  # a refusal no retry fixes
    assert story(result)[0].text == "primary failed (will not take this request); asking backup"


async def test_every_model_down_ends_the_turn_gracefully(
    harness: Harness, primary: ChatCompletionsServer, backup: ChatCompletionsServer
) -> None:
    primary.replies = [DOWN] * ATTEMPTS
    backup.replies = [DOWN] * ATTEMPTS
    served = agent(primary, backup, model=["primary", "backup"])
    async with harness.worker(agents=[served]) as task_queue:
        result = await AgentClient(harness.client, task_queue=task_queue).ask("Status?")
    assert result.outcome is Outcome.MODEL_ERROR
    assert "the language model is unavailable" in result.answer
    assert len(primary.requests) == len(backup.requests) == ATTEMPTS


def test_which_failures_leave_the_request_to_the_next_model() -> None:
    def failed(error: type[Exception]) -> ApplicationError:
        return ApplicationError("x", type=error.__name__)

    assert next_may_answer(failed(ModelUnavailable))
    assert next_may_answer(failed(ModelCannotAnswer))
    assert next_may_answer(failed(InvalidModelOutput))
    timed_out = TimeoutError("t", type=TimeoutType.SCHEDULE_TO_CLOSE, last_heartbeat_details=[])
    assert next_may_answer(timed_out)
    assert not next_may_answer(failed(ModelRequestRejected))
    assert not next_may_answer(failed(UnknownModel))
    assert not next_may_answer(ApplicationError("a bug", type="KeyError"))
    # Half the time left while another model waits; the last gets all of it.
    assert share(timedelta(seconds=60), 2) == timedelta(seconds=30)
    assert share(timedelta(seconds=60), 1) is None
    assert specs(" a, b ,,c") == ["a", "b", "c"] and specs(["a", "b"]) == ["a", "b"]


class _Refused(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body["error"]["message"])
        self.status_code = status
        self.body = body


def test_refusals_of_one_model_are_told_apart_from_bad_requests() -> None:
    def refused(code: str) -> Exception:
        return classify(_Refused(400, {"error": {"message": "no", "code": code}}))

    assert isinstance(refused("context_length_exceeded"), ModelCannotAnswer)
    assert isinstance(refused("content_filter"), ModelCannotAnswer)
    assert isinstance(refused("invalid_value"), ModelRequestRejected)


def test_an_agent_names_each_model_once() -> None:
    with pytest.raises(ValueError, match="each spec once"):
        Agent(name="a", model=["offline", "offline"])
    with pytest.raises(ValueError, match="no spaces"):
        Agent(name="a", model=["open ai:x"])


def test_the_cli_takes_models_in_order() -> None:
    from durable_agent.commands.client import parser

    args = parser().parse_args(["ask", "Hi", "--model", "openai:gpt-4.1-mini,offline"])
    assert args.model == "openai:gpt-4.1-mini,offline"
    with pytest.raises(SystemExit) as refused:
        parser().parse_args(["ask", "Hi", "--model", "offline,offline"])
    assert refused.value.code == 1
