"""The OpenAI-compatible backend through real turn workflows, against a Chat
Completions server as strict as the strictest chat templates
(`tests/fakes/chat_completions.py`): every way a turn can go, with the exact
number of model calls it costs; error classification as the official SDKs do it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent.answers import DECLINE
from durable_agent.backends.openai_chat import classify, retry_after
from durable_agent.errors import ModelRequestRejected, ModelUnavailable
from durable_agent.runtime.turns import start_turn
from durable_agent.types import Outcome, StepKind, TurnInput, TurnLimits
from tests.conftest import SEED_CASES, Harness, kinds
from tests.fakes.brain import offline_brain
from tests.fakes.chat_completions import (
    ChatCompletionsServer,
    error,
    running,
    text,
    tool_calls,
    violation,
)

ROOT = Path(__file__).resolve().parent.parent
ORDER = ("call_a", "order_status", '{"order_id": "123456"}')
RETURN = ("call_b", "return_status", '{"return_id": "rtn001"}')


@pytest.fixture
def chat() -> Iterator[ChatCompletionsServer]:
    yield from running()


def roles(body: dict[str, Any]) -> list[str]:
    return [m["role"] for m in body["messages"]]


async def test_one_tool(harness: Harness, chat: ChatCompletionsServer) -> None:
    chat.replies = [tool_calls(ORDER), text("It shipped: 2 × Herbal Handsoap.")]
    result = await harness.ask("Has order 123456 shipped?", model=chat.model())

    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "It shipped: 2 × Herbal Handsoap."
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
    assert result.usage.model_calls == len(chat.accepted) == 2

    plan, interpret = chat.accepted
    assert roles(plan) == ["system", "user"]
    assert roles(interpret) == ["system", "user", "assistant", "tool"]
    assert interpret["messages"][0] == plan["messages"][0]  # one system prompt, unchanged
    assert interpret["messages"][2]["tool_calls"][0]["id"] == "call_a"
    assert interpret["messages"][3]["tool_call_id"] == "call_a"
    assert "Herbal Handsoap" in interpret["messages"][3]["content"]
    tools = {t["function"]["name"]: t["function"] for t in plan["tools"]}
    assert tools["order_status"]["parameters"]["properties"]["order_id"]["pattern"] == r"^\d{6}$"
    # The second call repeats the first one's tools, system prompt and question: a
    # provider's prompt cache hits on all of it.
    prefix = json.dumps(plan["tools"]) + json.dumps(plan["messages"])[:-1]
    assert result.usage.cached_input_tokens >= len(prefix) // 4


async def test_two_tools_in_sequence(harness: Harness, chat: ChatCompletionsServer) -> None:
    chat.replies = [tool_calls(ORDER), tool_calls(RETURN), text("Shipped; the return is done.")]
    result = await harness.ask("Has order 123456 shipped? Then check rtn001.", model=chat.model())

    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "Shipped; the return is done."
    assert result.usage.model_calls == len(chat.accepted) == 3
    assert kinds(result) == [
        "plan",
        "tool_call",
        "observation",
        "continue",
        "tool_call",
        "observation",
        "answer",
    ]
    last = chat.accepted[-1]
    assert roles(last) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert [m.get("tool_call_id") for m in last["messages"] if m["role"] == "tool"] == [
        "call_a",
        "call_b",
    ]


async def test_two_tools_at_once(harness: Harness, chat: ChatCompletionsServer) -> None:
    chat.replies = [tool_calls(ORDER, RETURN), text("Both fine.")]
    result = await harness.ask("Order 123456 and return rtn001?", model=chat.model())

    assert result.outcome is Outcome.ANSWERED and result.answer == "Both fine."
    assert result.usage.model_calls == len(chat.accepted) == 2
    last = chat.accepted[-1]
    assert roles(last) == ["system", "user", "assistant", "tool", "tool"]
    assert [m["tool_call_id"] for m in last["messages"][3:]] == ["call_a", "call_b"]


async def test_bad_json_then_a_corrected_call(
    harness: Harness, chat: ChatCompletionsServer
) -> None:
    chat.replies = [
        tool_calls(("call_a", "order_status", "{order_id: 123456")),
        tool_calls(("call_b", "order_status", '{"order_id": "123456"}')),
        text("Shipped."),
    ]
    result = await harness.ask("Has order 123456 shipped?", model=chat.model())

    assert result.outcome is Outcome.ANSWERED and result.answer == "Shipped."
    assert result.usage.model_calls == len(chat.accepted) == 3
    assert kinds(result)[:3] == ["plan", "rejected", "plan"]
    replan = chat.accepted[1]["messages"]
    # The model sees its own words back, and the error as that call's result.
    assert replan[2]["tool_calls"][0]["function"]["arguments"] == "{order_id: 123456"
    assert replan[3]["tool_call_id"] == "call_a"
    assert replan[3]["content"].startswith("error: invalid arguments for order_status")


async def test_unknown_tool_name(harness: Harness, chat: ChatCompletionsServer) -> None:
    chat.replies = [
        tool_calls(("call_a", "track_parcel", '{"id": "1"}')),
        tool_calls(ORDER),
        text("Shipped."),
    ]
    result = await harness.ask("Has order 123456 shipped?", model=chat.model())

    assert result.outcome is Outcome.ANSWERED and result.answer == "Shipped."
    assert result.usage.model_calls == len(chat.accepted) == 3
    error_result = chat.accepted[1]["messages"][3]["content"]
    assert error_result.startswith("error: unknown tool 'track_parcel'; available tools:")


SLOW_START_S = 3.0
"""Longer than HEARTBEAT_TIMEOUT (2 s): what importing an SDK and building its client
can take on a busy machine, before a worker's first request to a model."""


def slow_to_start(chat: ChatCompletionsServer) -> Callable[[str], Any]:
    """A backend whose construction holds the worker for a while, as a slow import of
    its SDK does: plain code, in whatever thread the worker builds backends in."""

    def build(name: str) -> Any:
        time.sleep(SLOW_START_S)
        return chat.model(name or "test-model")

    return build


@pytest.mark.parametrize(
    "first",
    [tool_calls(ORDER), tool_calls(("call_a", "order_status", "{order_id: 123456"))],
    ids=["valid", "malformed-json"],
)
async def test_a_slow_first_call_sends_each_request_once(
    harness: Harness, chat: ChatCompletionsServer, first: Any
) -> None:
    """A worker's first model call waits for its backend to be built: nothing times out
    and runs again meanwhile, so the server gets exactly the requests the turn counts
    (and bills), and a malformed reply is the one the model is told about."""
    malformed = "order_id: 123456" in json.dumps(first)
    chat.replies = [first, *([tool_calls(ORDER)] if malformed else []), text("Shipped.")]
    scripted = len(chat.replies)
    agent = replace(harness.agent(), model="slow", models={"slow": slow_to_start(chat)})
    async with harness.worker(agents=[agent]) as task_queue:
        turn = TurnInput(question="Has order 123456 shipped?")
        result = await (await start_turn(harness.client, turn, task_queue)).result()

    assert result.outcome is Outcome.ANSWERED and result.answer == "Shipped."
    assert result.usage.model_calls == len(chat.requests) == scripted
    assert len({json.dumps(r.body, sort_keys=True) for r in chat.requests}) == len(chat.requests)
    if malformed:
        told = chat.requests[1].body["messages"][-1]
        assert told["role"] == "tool" and told["tool_call_id"] == "call_a"
        assert told["content"].startswith("error: invalid arguments for order_status")


async def test_429_with_retry_after_first(harness: Harness, chat: ChatCompletionsServer) -> None:
    chat.replies = [error(429, {"Retry-After": "3"}), tool_calls(ORDER), text("Shipped.")]
    result = await harness.ask("Has order 123456 shipped?", model=chat.model())

    assert result.outcome is Outcome.ANSWERED and result.answer == "Shipped."
    assert result.usage.model_calls == len(chat.accepted) == 2
    first, second = chat.requests[0].at, chat.requests[1].at
    assert second - first >= 2.9  # the server's delay, not the policy's 1 s backoff


async def test_answer_without_a_tool(harness: Harness, chat: ChatCompletionsServer) -> None:
    chat.replies = [text(DECLINE)]
    result = await harness.ask("How is the weather in Scotland right now?", model=chat.model())

    assert result.outcome is Outcome.ANSWERED and result.answer == DECLINE
    assert kinds(result) == ["answer"]
    assert result.usage.model_calls == len(chat.accepted) == 1


async def test_tools_forever_hit_the_step_cap(
    harness: Harness, chat: ChatCompletionsServer
) -> None:
    chat.replies = [tool_calls((f"call_{i}", *ORDER[1:])) for i in range(10)]
    result = await harness.ask(
        "Has order 123456 shipped?", model=chat.model(), limits=TurnLimits(max_steps=3)
    )
    assert result.outcome is Outcome.STEP_LIMIT
    assert result.answer.startswith("Sorry, I could not finish within 3 steps.")
    assert "Herbal Handsoap" in result.answer
    assert result.usage.model_calls == len(chat.accepted) == 4


async def test_rejected_request_tells_the_operator_what_to_fix(
    harness: Harness, chat: ChatCompletionsServer, caplog: pytest.LogCaptureFixture
) -> None:
    chat.replies = [error(401, message="Incorrect API key provided.")]
    result = await harness.ask("Has order 123456 shipped?", model=chat.model())

    assert result.outcome is Outcome.MODEL_ERROR
    assert len(chat.requests) == 1  # not retried
    assert "refused the request" in result.answer and "unavailable" not in result.answer
    failure = next(s for s in result.steps if s.kind is StepKind.LIMIT)
    assert failure.text == "model request rejected: scripted failed (request rejected)"
    # The provider's words and what to check are the operator's, in the worker's log.
    assert "Incorrect API key provided" in caplog.text and "OPENAI_API_KEY" in caplog.text
    assert "OPENAI_API_KEY" not in result.answer


async def test_unknown_model_is_named(
    harness: Harness, chat: ChatCompletionsServer, caplog: pytest.LogCaptureFixture
) -> None:
    result = await harness.ask("Has order 123456 shipped?", model=chat.model("no-such-model"))
    assert result.outcome is Outcome.MODEL_ERROR
    assert "The model `no-such-model` does not exist" in caplog.text
    assert "check the model name" in caplog.text
    assert len(chat.requests) == 1


@pytest.mark.parametrize(
    ("messages", "refusal"),
    [
        (
            [{"role": "user", "content": "hi"}, {"role": "system", "content": "be brief"}],
            "System message must be at the beginning.",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },  # noqa: E501
                {"role": "tool", "tool_call_id": "zzz", "content": "x"},
            ],
            "'tool_call_id' of 'zzz' not found",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },  # noqa: E501
                {"role": "assistant", "content": "done"},
            ],
            "did not have response messages: a",
        ),
        (
            [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "hi"}],
            "Conversation must start with a user message.",
        ),
        (
            [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}],
            "Conversation roles must alternate",
        ),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
            "Conversation must end with a user or tool message.",
        ),
    ],
)
def test_the_fake_refuses_what_strict_servers_refuse(
    messages: list[dict[str, Any]], refusal: str
) -> None:
    problem = violation({"messages": messages})
    assert problem is not None and refusal in problem


def test_the_fake_refuses_over_http(chat: ChatCompletionsServer) -> None:
    client = openai.OpenAI(base_url=chat.url, api_key="test-key", max_retries=0)
    bad = [{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}]
    with pytest.raises(openai.BadRequestError, match="System message must be at the beginning"):
        client.chat.completions.create(model="test-model", messages=bad)  # type: ignore[arg-type]


def _status_error(
    chat: ChatCompletionsServer, status: int, headers: dict[str, str] | None = None
) -> openai.APIStatusError:
    """The `openai` package's own exception for a server's answer."""
    chat.replies = [error(status, headers, message=f"said {status}")]
    client = openai.OpenAI(base_url=chat.url, api_key="test-key", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "hi"}]
        )
    return caught.value


@pytest.mark.parametrize(
    ("status", "retried"),
    [(400, False), (401, False), (403, False), (404, False), (408, True), (409, True),
     (422, False), (429, True), (500, True), (502, True), (503, True)],
)  # fmt: skip
def test_errors_are_classified_as_the_official_sdks_do(
    chat: ChatCompletionsServer, status: int, retried: bool
) -> None:
    err = classify(_status_error(chat, status))
    assert isinstance(err, ModelUnavailable if retried else ModelRequestRejected)
    assert f"said {status}" in str(err)  # the provider's own message


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after": "4"}, 4.0),
        ({}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "86400"}, None),  # over a minute: the retry policy's backoff
        ({"retry-after-ms": "-5"}, 0.0),
    ],
)
def test_retry_after_headers(
    chat: ChatCompletionsServer, headers: dict[str, str], seconds: float | None
) -> None:
    assert retry_after(_status_error(chat, 429, headers)) == seconds


def test_retry_after_as_an_http_date(chat: ChatCompletionsServer) -> None:
    from email.utils import formatdate

    date = formatdate(time.time() + 30, usegmt=True)
    waited = retry_after(_status_error(chat, 503, {"retry-after": date}))
    assert waited is not None and 25 < waited <= 30


SEED_CALLS = {  # what a tool-calling model asks for on each seed question
    SEED_CASES[0][0]: ("order_status", '{"order_id": "123456"}'),
    SEED_CASES[1][0]: ("return_status", '{"return_id": "rtn003"}'),
    SEED_CASES[3][0]: ("order_status", '{"order_id": "383833"}'),
    SEED_CASES[4][0]: ("return_status", '{"return_id": "rtn123"}'),
}


@pytest.mark.parametrize(("question", "expected"), SEED_CASES)
async def test_seed_cases(
    harness: Harness, chat: ChatCompletionsServer, question: str, expected: str
) -> None:
    if question in SEED_CALLS:
        chat.replies = [tool_calls(("call_1", *SEED_CALLS[question])), text("The answer.")]
    else:
        chat.replies = [text(DECLINE)]
    result = await harness.ask(question, model=chat.model())

    assert result.outcome is Outcome.ANSWERED
    if question in SEED_CALLS:
        tool_message = chat.accepted[1]["messages"][-1]
        assert expected in tool_message["content"]  # the tool's result reached the model
        assert result.answer == "The answer."
        assert result.usage.model_calls == 2
    else:
        assert result.answer == DECLINE and result.usage.model_calls == 1


async def test_a_worker_process_on_a_strict_server_answers_the_seed_questions(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`python worker.py` with `AGENT_MODEL=openai:<model>`, as a user runs it, against a
    strict server whose replies come from a model's reading of each request."""
    server = ChatCompletionsServer(brain=offline_brain, models=("llama-3-strict",))
    task_queue = f"openai-{uuid.uuid4().hex[:6]}"
    environ = {
        **os.environ,
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "AGENT_MODEL": "openai:llama-3-strict",
        "OPENAI_BASE_URL": server.url,
        "OPENAI_API_KEY": server.api_key,
        "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
    }
    worker = subprocess.Popen(
        [sys.executable, "worker.py", "--task-queue", task_queue],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert "worker ready" in worker.stdout.readline()
        results = []
        for question, _ in SEED_CASES:
            handle = await start_turn(env.client, TurnInput(question=question), task_queue)
            results.append(await handle.result())
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        server.close()

    for (question, expected), result in zip(SEED_CASES, results, strict=True):
        assert result.outcome is Outcome.ANSWERED, (question, result.answer)
        assert expected in result.answer, (question, result.answer)
    # The fewest calls: one to decline, two for a lookup; nothing refused, nothing retried.
    assert [r.usage.model_calls for r in results] == [2, 2, 1, 2, 2, 1]
    assert all(r.status == 200 for r in server.requests)
    assert len(server.requests) == 10
    sent = json.dumps([r.body["model"] for r in server.requests])
    assert "llama-3-strict" in sent
