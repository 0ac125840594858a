"""A Chat Completions server as strict as OpenAI's API and the strictest chat templates.

    server = ChatCompletionsServer()          # scripted: server.replies = [...]
    server = ChatCompletionsServer(brain=offline_brain)
    python -m tests.fakes.chat_completions --port 8000   # by hand, with the brain

It refuses, with a 400 and OpenAI's own wording where OpenAI has one:
- a system message anywhere but first; a conversation that does not start with
  the user, or whose user and assistant turns do not alternate (Llama 3,
  Mistral and Gemma templates raise on these);
- a `tool` message that answers no pending call of the assistant message before
  it, or a message of any other role while calls still await their result;
- an assistant message with neither content nor tool calls, arguments that are
  not a string, duplicate call ids; a request that ends with an assistant
  message (the model would be asked to answer itself);
- tools that are not `function`s with a valid name and an object schema.
A wrong API key gets 401 and an unknown model 404, as from OpenAI. Usage counts
about four characters a token and reports as cached the prefix (tools, then
messages) shared with an earlier request: a prompt that changes between the
calls of a turn gets no cache hits, as with a real provider.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent.conversation import AssistantMessage, Message, ToolResult, UserMessage
from agent.model import Reply
from agent.tools import ToolSpec
from agent.types import ToolCall
from tests.fakes.brain import Brain

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ROLES = ("system", "user", "assistant", "tool")

Scripted = tuple[int, dict[str, str], dict[str, Any]]
"""status, headers, body: one HTTP answer."""


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def violation(body: dict[str, Any]) -> str | None:
    """What a strict server refuses in this request, or None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    for tool in body.get("tools") or []:
        fn = tool.get("function", {}) if isinstance(tool, dict) else {}
        if tool.get("type") != "function" or not TOOL_NAME.match(str(fn.get("name", ""))):
            return f"Invalid 'tools': {json.dumps(tool)[:80]} is not a function with a valid name"
        if (fn.get("parameters") or {}).get("type", "object") != "object":
            return (
                f"Invalid schema for function '{fn['name']}': "
                "schema must be a JSON Schema of 'type: \"object\"'"
            )
    pending: list[str] = []
    seen: set[str] = set()
    previous = None
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ROLES:
            return f"Invalid value for 'messages[{i}].role': {role!r}"
        if role == "system":
            if i != 0:
                return "System message must be at the beginning."
            previous = "system"
            continue
        if role == "tool":
            call_id = m.get("tool_call_id")
            if previous not in ("assistant", "tool"):
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'."
                )
            if call_id not in pending:
                return (
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in "
                    "'tool_calls' of previous message."
                )
            if not isinstance(m.get("content"), str):
                return f"Invalid type for 'messages[{i}].content': expected a string"
            pending.remove(call_id)
            previous = "tool"
            continue
        if pending:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}"
            )
        expected = "assistant" if previous in ("user", "tool") else "user"
        if role != expected:
            if previous in (None, "system"):
                return "Conversation must start with a user message."
            return "Conversation roles must alternate user/assistant/user/assistant/..."
        if role == "assistant":
            calls = m.get("tool_calls") or []
            if m.get("content") is None and not calls:
                return f"Invalid 'messages[{i}]': assistant messages need content or tool_calls"
            for c in calls:
                fn = c.get("function", {})
                if c.get("type") != "function" or not c.get("id") or c["id"] in seen:
                    return f"Invalid 'messages[{i}].tool_calls': ids must be unique and non-empty"
                if not isinstance(fn.get("arguments"), str):
                    return f"Invalid type for 'messages[{i}].tool_calls.function.arguments'"
                seen.add(c["id"])
                pending.append(c["id"])
        elif not isinstance(m.get("content"), str) or not m["content"]:
            return f"Invalid 'messages[{i}].content': a user message needs text"
        previous = role
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            f"to each 'tool_call_id'. The following tool_call_ids did not have response "
            f"messages: {', '.join(pending)}"
        )
    if previous == "assistant":
        return "Conversation must end with a user or tool message."
    return None


def conversation(body: dict[str, Any]) -> tuple[list[Message], list[ToolSpec]]:
    """A (valid) request as the canonical conversation and tool specs, for a brain."""
    messages: list[Message] = []
    names: dict[str, str] = {}
    for m in body["messages"]:
        if m["role"] == "user":
            messages.append(UserMessage(text=m["content"]))
        elif m["role"] == "assistant":
            calls = []
            for c in m.get("tool_calls") or []:
                names[c["id"]] = name = c["function"]["name"]
                try:
                    args = json.loads(c["function"]["arguments"] or "{}")
                except json.JSONDecodeError:
                    args = {}
                calls.append(ToolCall(id=c["id"], name=name, arguments=args))
            messages.append(AssistantMessage(text=m.get("content") or "", calls=calls))
        elif m["role"] == "tool":
            ok = not m["content"].startswith("error: ")
            messages.append(
                ToolResult(
                    call_id=m["tool_call_id"],
                    tool=names[m["tool_call_id"]],
                    ok=ok,
                    text=m["content"],
                )
            )
    tools = [
        ToolSpec(
            name=t["function"]["name"],
            description=t["function"].get("description", ""),
            parameters=t["function"].get("parameters", {}),
        )
        for t in body.get("tools") or []
    ]
    return messages, tools


def tool_calls(*calls: tuple[str, str, str]) -> Scripted:
    """A reply asking for calls: (id, name, arguments as JSON text)."""
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }
    return 200, {}, completion(message, "tool_calls")


def text(content: str, finish: str = "stop") -> Scripted:
    return 200, {}, completion({"role": "assistant", "content": content}, finish)


def error(status: int, headers: dict[str, str] | None = None, message: str = "") -> Scripted:
    body = {"error": {"message": message or f"error {status}", "type": "server_error"}}
    return status, headers or {}, body


def completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


@dataclass
class Received:
    at: float
    """time.monotonic() on arrival"""
    body: dict[str, Any]
    status: int
    """what the server answered"""


class ChatCompletionsServer:
    def __init__(
        self,
        brain: Brain | None = None,
        api_key: str = "test-key",
        models: tuple[str, ...] = ("test-model",),
        port: int = 0,
    ) -> None:
        self.brain = brain
        self.api_key = api_key
        self.models = models
        self.replies: list[Scripted] = []
        """Scripted answers, used in order before the brain (if any)."""
        self.requests: list[Received] = []
        self._prefixes: list[str] = []
        self._ids = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, headers, payload = server.answer(
                    self.path, self.headers.get("Authorization", ""), body
                )
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

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @property
    def accepted(self) -> list[dict[str, Any]]:
        """Bodies of the requests answered with 200: the model calls that happened."""
        return [r.body for r in self.requests if r.status == 200]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def model(self, name: str = "test-model") -> Any:
        from openai import AsyncOpenAI

        from agent.backends.openai_chat import OpenAIChatModel

        client = AsyncOpenAI(base_url=self.url, api_key=self.api_key, max_retries=0)
        return OpenAIChatModel(name, client=client)

    def answer(self, path: str, auth: str, body: dict[str, Any]) -> Scripted:
        with self._lock:
            try:
                status, headers, payload = self._answer(path, auth, body)
            except Refused as e:
                error_body = {
                    "message": e.message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": e.code,
                }
                status, headers, payload = e.status, {}, {"error": error_body}
            self.requests.append(Received(time.monotonic(), body, status))
            return status, headers, payload

    def _answer(self, path: str, auth: str, body: dict[str, Any]) -> Scripted:
        if path.rstrip("/") != "/v1/chat/completions":
            raise Refused(404, f"Unknown request URL: POST {path}", "unknown_url")
        if auth != f"Bearer {self.api_key}":
            raise Refused(401, "Incorrect API key provided.", "invalid_api_key")
        if body.get("model") not in self.models:
            raise Refused(
                404, f"The model `{body.get('model')}` does not exist.", "model_not_found"
            )
        if problem := violation(body):
            raise Refused(400, problem)
        if self.replies:
            status, headers, payload = self.replies.pop(0)
        elif self.brain is not None:
            status, headers = 200, {}
            payload = self._from_brain(body)
        else:
            raise Refused(500, "the test scripted no reply for this request")
        if status == 200:
            payload = {**payload, "model": body["model"], "usage": self._usage(body, payload)}
        return status, headers, payload

    def _from_brain(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self.brain is not None
        reply: Reply = self.brain(*conversation(body))
        if not reply.calls:
            return completion({"role": "assistant", "content": reply.text}, "stop")
        calls = []
        for c in reply.calls:
            self._ids += 1
            calls.append(
                {
                    "id": f"call_{self._ids:024x}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
            )
        message = {"role": "assistant", "content": reply.text or None, "tool_calls": calls}
        return completion(message, "tool_calls")

    def _usage(self, body: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
        prompt = json.dumps(body.get("tools") or []) + json.dumps(body["messages"])
        shared = max((_common_prefix(prompt, p) for p in self._prefixes), default=0)
        self._prefixes.append(prompt)
        prompt_tokens = len(prompt) // 4
        completion_tokens = len(json.dumps(payload["choices"][0]["message"])) // 4
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": shared // 4},
        }


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def running(brain: Brain | None = None) -> Iterator[ChatCompletionsServer]:
    """For fixtures: a server that is shut down afterwards."""
    server = ChatCompletionsServer(brain=brain)
    try:
        yield server
    finally:
        server.close()


def main() -> None:
    from tests.fakes.brain import offline_brain

    p = argparse.ArgumentParser(description="A strict Chat Completions server (offline brain).")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="test-model")
    p.add_argument("--api-key", default="test-key")
    args = p.parse_args()
    server = ChatCompletionsServer(
        brain=offline_brain, api_key=args.api_key, models=(args.model,), port=args.port
    )
    print(f"serving {args.model!r} on {server.url} (key {args.api_key!r}); Ctrl-C to stop")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.close()


if __name__ == "__main__":
    main()
