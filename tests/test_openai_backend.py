"""The OpenAI-compatible backend through a real turn workflow, against a small
scripted HTTP server that speaks the Chat Completions tool-calling protocol."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from openai import AsyncOpenAI

from agent.answers import DECLINE
from agent.backends.openai_chat import OpenAIChatModel
from agent.types import Outcome, StepKind
from tests.conftest import SEED_CASES, Harness, kinds

Reply = tuple[int, dict[str, str], dict[str, Any]]


def tool_calls(*calls: tuple[str, str, str]) -> Reply:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }
    return 200, {}, _completion(message, "tool_calls")


def text(content: str) -> Reply:
    return 200, {}, _completion({"role": "assistant", "content": content}, "stop")


def error(status: int, headers: dict[str, str] | None = None) -> Reply:
    return status, headers or {}, {"error": {"message": f"error {status}", "type": "x"}}


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
    }


class ChatServer:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[tuple[float, str, dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((time.monotonic(), self.path, body))
                status, headers, payload = server.replies.pop(0)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def model(self) -> OpenAIChatModel:
        client = AsyncOpenAI(base_url=self.url, api_key="test-key", max_retries=0)
        return OpenAIChatModel("test-model", client=client)


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.httpd.shutdown()


ORDER_CALL = ("call_a", "order_status", '{"order_id": "123456"}')


async def test_tool_call_round_trip(harness: Harness, chat: ChatServer) -> None:
    chat.replies = [tool_calls(ORDER_CALL), text("It shipped: 2 × Herbal Handsoap.")]
    result = await harness.ask("Has order 123456 shipped?", model=chat.model())

    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "It shipped: 2 × Herbal Handsoap."
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
    assert result.usage.input_tokens == 100 and result.usage.output_tokens == 20

    (_, path, plan_req), (_, _, interpret_req) = chat.requests
    assert path == "/v1/chat/completions"
    assert plan_req["model"] == "test-model"
    tools = {t["function"]["name"]: t["function"] for t in plan_req["tools"]}
    assert tools["order_status"]["parameters"]["properties"]["order_id"]["pattern"] == r"^\d{6}$"
    assert plan_req["messages"][1] == {"role": "user", "content": "Has order 123456 shipped?"}
    tool_message = next(m for m in interpret_req["messages"] if m["role"] == "tool")
    assert tool_message["tool_call_id"] == "call_a"
    assert "Herbal Handsoap" in tool_message["content"]


async def test_malformed_arguments_are_sent_back(harness: Harness, chat: ChatServer) -> None:
    chat.replies = [
        tool_calls(("call_a", "order_status", "{order_id: 123456")),
        tool_calls(("call_b", "order_status", '{"order_id": "123456"}')),
        text("Shipped."),
    ]
    result = await harness.ask("Has order 123456 shipped?", model=chat.model())

    assert result.outcome is Outcome.ANSWERED
    assert kinds(result)[:3] == ["plan", "rejected", "plan"]
    assert "not valid JSON" in result.steps[1].text
    replan = chat.requests[1][2]["messages"]
    rejection = next(m for m in replan if m["role"] == "tool")
    assert rejection["tool_call_id"] == "call_a"
    assert rejection["content"].startswith("error: invalid arguments for order_status")


async def test_429_retry_after_is_honoured(harness: Harness, chat: ChatServer) -> None:
    chat.replies = [error(429, {"Retry-After": "3"}), tool_calls(ORDER_CALL), text("Shipped.")]
    result = await harness.ask("Has order 123456 shipped?", model=chat.model())

    assert result.outcome is Outcome.ANSWERED
    first, second = chat.requests[0][0], chat.requests[1][0]
    assert second - first >= 2.9  # the server's delay, not the policy's 1 s backoff


async def test_bad_credentials_are_not_retried(harness: Harness, chat: ChatServer) -> None:
    chat.replies = [error(401)]
    result = await harness.ask("Has order 123456 shipped?", model=chat.model())

    assert result.outcome is Outcome.MODEL_ERROR
    assert len(chat.requests) == 1
    failure = next(s for s in result.steps if s.kind is StepKind.LIMIT)
    assert "check OPENAI_API_KEY" in failure.text


SEED_CALLS = {  # what a tool-calling model asks for on each seed question
    SEED_CASES[0][0]: ("order_status", '{"order_id": "123456"}'),
    SEED_CASES[1][0]: ("return_status", '{"return_id": "rtn003"}'),
    SEED_CASES[3][0]: ("order_status", '{"order_id": "383833"}'),
    SEED_CASES[4][0]: ("return_status", '{"return_id": "rtn123"}'),
}


@pytest.mark.parametrize(("question", "expected"), SEED_CASES)
async def test_seed_cases(harness: Harness, chat: ChatServer, question: str, expected: str) -> None:
    if question in SEED_CALLS:
        chat.replies = [tool_calls(("call_1", *SEED_CALLS[question])), text("The answer.")]
    else:
        chat.replies = [text(DECLINE)]
    result = await harness.ask(question, model=chat.model())

    assert result.outcome is Outcome.ANSWERED
    if question in SEED_CALLS:
        tool_message = next(m for m in chat.requests[1][2]["messages"] if m["role"] == "tool")
        assert expected in tool_message["content"]  # the tool's result reached the model
        assert result.answer == "The answer."
    else:
        assert result.answer == DECLINE and len(chat.requests) == 1
