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
- tools that are not `function`s with a valid name and an object schema;
- `stream_options` without `stream: true`, or either of the wrong type;
- a `response_format` that is not `text`, `json_object` or `json_schema`, a
  `json_schema` without a valid name or schema, and a strict one
  (`strict: true`) that breaks structured outputs' rules: the root an object,
  every object closed (`additionalProperties: false`) with every property in
  `required`, no `$ref` beside other keywords.
- a parameter Chat Completions does not have ("Unrecognized request argument
  supplied"), a temperature or top_p out of range, `max_tokens` under 1, more than
  4 stop sequences, `parallel_tool_calls` without tools; a reasoning model's
  (`reasoning_models`) `max_tokens` or temperature other than 1, and any other
  model's `reasoning_effort` (`parameter_violation`).
What it answers a `response_format` with is up to the script: the model's text
follows the schema only when the scripted reply does (`structured`).
A wrong API key gets 401 and an unknown model 404, as from OpenAI. Usage counts
about four characters a token and reports as cached the prefix (tools, then
messages) shared with an earlier request: a prompt that changes between the
calls of a turn gets no cache hits, as with a real provider.

Asked to stream, it answers as OpenAI does: server-sent events in a chunked
body, `data: {chunk}` each and `data: [DONE]` last. The first chunk carries the
role; text comes a few characters a chunk; each tool call comes as a piece with
its index, id and name, then pieces of argument text; then a chunk with the
finish reason; usage only when `stream_options.include_usage` asks for it, in a
last chunk with no choices. A `Cut` reply fails mid-answer: an error event
(OpenAI's way) or a dropped connection; asked without streaming, the same reply
is the error a whole response gets instead. Errors before the first chunk are
whole JSON answers with their status, streaming or not.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage
from durable_agent.model import Reply
from durable_agent.tools import ToolSpec
from durable_agent.types import ToolCall
from tests.fakes.brain import Brain

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ROLES = ("system", "user", "assistant", "tool")
SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"

Scripted = tuple[int, dict[str, str], dict[str, Any]]
"""status, headers, body: one HTTP answer."""


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def violation(body: dict[str, Any], reasoning: bool = False) -> str | None:
    """What a strict server refuses in this request, or None (`reasoning`: the model is
    one of OpenAI's reasoning models, which refuse some parameters)."""
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
        elif isinstance(m.get("content"), list):
            if problem := parts_violation(m["content"], i):
                return problem
        elif not isinstance(m.get("content"), str) or not m["content"]:
            return f"Invalid 'messages[{i}].content': a user message needs text"
        previous = role
    if problem := stream_violation(body):
        return problem
    if problem := format_violation(body.get("response_format")):
        return problem
    if problem := parameter_violation(body, reasoning):
        return problem
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            f"to each 'tool_call_id'. The following tool_call_ids did not have response "
            f"messages: {', '.join(pending)}"
        )
    if previous == "assistant":
        return "Conversation must end with a user or tool message."
    return None


PARAMETERS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "messages",
        "metadata",
        "modalities",
        "model",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
"""The parameters of OpenAI's Chat Completions: anything else is refused."""
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


_DATA_URL = re.compile(r"^data:([a-z]+/[a-z0-9.+-]+);base64,([A-Za-z0-9+/]*={0,2})$")
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def parts_violation(parts: list[Any], i: int) -> str | None:
    """A user message's content parts as OpenAI takes them: `text` ({"text"}),
    `image_url` ({"image_url": {"url", "detail"?}}, a data URL of PNG, JPEG, GIF or WebP
    bytes, or an http(s) URL), `file` ({"file": {"filename", "file_data"}}, a data URL
    of a PDF, or {"file_id"})."""
    if not parts:
        return (
            f"Invalid 'messages[{i}].content': empty array. Expected an array with minimum length 1"
        )
    for j, part in enumerate(parts):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                return f"Invalid type for '{where}.text': expected a string"
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else None
            if not isinstance(url, str):
                return f"Missing required parameter: '{where}.image_url.url'"
            if image.get("detail", "auto") not in ("auto", "low", "high"):
                return f"Invalid value: '{where}.image_url.detail'"
            if not url.startswith(("http://", "https://")) and not _data_of(url, IMAGE_TYPES):
                return (
                    f"Invalid '{where}.image_url.url': expected a URL or a base64 data URL "
                    "of a PNG, JPEG, GIF or WebP image"
                )
        elif kind == "file":
            file = part.get("file")
            if not isinstance(file, dict) or not (file.get("file_data") or file.get("file_id")):
                return f"Missing required parameter: '{where}.file.file_data' or 'file_id'"
            if "file_data" in file and (
                not isinstance(file.get("filename"), str)
                or not _data_of(file["file_data"], ("application/pdf",))
            ):
                return f"Invalid '{where}.file': a filename and a base64 data URL of a PDF"
        else:
            return (
                f"Invalid value: '{where}.type'. Supported values are: 'text', 'image_url', "
                "'input_audio', 'refusal', 'audio', and 'file'."
            )
    return None


def _data_of(url: Any, types: tuple[str, ...]) -> bytes | None:
    """The bytes of a base64 data URL of one of `types` whose bytes are that type."""
    found = _DATA_URL.match(url) if isinstance(url, str) else None
    if not found or found[1] not in types:
        return None
    try:
        data = base64.b64decode(found[2], validate=True)
    except binascii.Error:
        return None
    return data if data.startswith(MAGIC[found[1]]) else None


MAGIC = {
    "image/png": b"\x89PNG",
    "image/jpeg": b"\xff\xd8\xff",
    "image/gif": b"GIF8",
    "image/webp": b"RIFF",
    "application/pdf": b"%PDF-",
}
"""How the API tells an image or a PDF it can decode: it refuses bytes that are not."""


def parameter_violation(body: dict[str, Any], reasoning: bool = False) -> str | None:
    """What OpenAI refuses in a request's parameters besides the conversation, in its
    words: an unknown one; a number out of its range; more than 4 stop sequences;
    `parallel_tool_calls` without tools; on a reasoning model `max_tokens` and a
    temperature other than 1, elsewhere `reasoning_effort`."""
    for name in body:
        if name not in PARAMETERS:
            return f"Unrecognized request argument supplied: {name}"
    for name, low, high in (("temperature", 0, 2), ("top_p", 0, 1), ("presence_penalty", -2, 2)):
        if (problem := _number(body, name, low, high)) is not None:
            return problem
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return (
                f"Invalid type for '{name}': expected an integer, but got {type(value).__name__}."
            )
        if value is not None and value < 1:
            return (
                f"Invalid '{name}': integer below minimum value. Expected a value >= 1, "
                f"but got {value} instead."
            )
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
            return "Invalid type for 'stop': expected a string or an array of strings."
        if len(stop) > 4:
            return (
                "Invalid 'stop': array too long. Expected an array with maximum length 4, "
                f"but got an array with length {len(stop)} instead."
            )
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        return f"Invalid type for 'seed': expected an integer, but got {type(seed).__name__}."
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        return "Invalid type for 'parallel_tool_calls': expected a boolean."
    if parallel is not None and not body.get("tools"):
        return (
            "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed "
            "when 'tools' are specified."
        )
    effort = body.get("reasoning_effort")
    if reasoning:
        if "max_tokens" in body:
            return (
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead."
            )
        if body.get("temperature", 1) != 1:
            return (
                f"Unsupported value: 'temperature' does not support {body['temperature']} with "
                "this model. Only the default (1) value is supported."
            )
    elif effort is not None:
        return "Unsupported parameter: 'reasoning_effort' is not supported with this model."
    if effort is not None and effort not in EFFORTS:
        shown = ", ".join(f"'{e}'" for e in EFFORTS)
        return f"Invalid value: '{effort}'. Supported values are: {shown}."
    return None


def _number(body: dict[str, Any], name: str, low: float, high: float) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"Invalid type for '{name}': expected a decimal, but got {type(value).__name__}."
    if value > high:
        return (
            f"Invalid '{name}': decimal above maximum value. Expected a value <= {high}, but "
            f"got {value} instead."
        )
    if value < low:
        return (
            f"Invalid '{name}': decimal below minimum value. Expected a value >= {low}, but "
            f"got {value} instead."
        )
    return None


def stream_violation(body: dict[str, Any]) -> str | None:
    """What OpenAI refuses in a request's `stream` and `stream_options`, or None."""
    stream, options = body.get("stream"), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        return f"Invalid type for 'stream': expected a boolean, but got {type(stream).__name__}."
    if options is None:
        return None
    if not stream:
        return "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    if not isinstance(options, dict):
        return "Invalid type for 'stream_options': expected an object."
    if not isinstance(options.get("include_usage", False), bool):
        return "Invalid type for 'stream_options.include_usage': expected a boolean."
    return None


def format_violation(fmt: Any) -> str | None:
    """What OpenAI refuses in a request's `response_format`, or None."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        return (
            "Invalid value for 'response_format.type': expected one of 'text', "
            f"'json_object' or 'json_schema', got {kind!r}."
        )
    if kind != "json_schema":
        return None
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        return "Missing required parameter: 'response_format.json_schema'."
    name = spec.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        return (
            "Invalid 'response_format.json_schema.name': string does not match pattern. "
            "Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
        )
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        return "Invalid type for 'response_format.json_schema.schema': expected an object."
    if spec.get("strict") is not True:
        return None
    if schema.get("type") != "object" or "anyOf" in schema:
        return (
            f"Invalid schema for response_format '{name}': schema must be a JSON Schema of "
            f"'type: \"object\"', got 'type: \"{schema.get('type')}\"'."
        )
    if problem := strict_violation(schema, ()):
        return f"Invalid schema for response_format '{name}': {problem}"
    return None


def strict_violation(node: Any, context: tuple[str, ...]) -> str | None:
    """Where a strict schema breaks the rules of structured outputs, or None."""
    if not isinstance(node, dict):
        return None
    if "$ref" in node and len(node) > 1:
        others = sorted(k for k in node if k != "$ref")
        return f"In context={context}, $ref cannot have keywords {others}."
    if node.get("type") == "object" or "properties" in node:
        if node.get("additionalProperties") is not False:
            return (
                f"In context={context}, 'additionalProperties' is required to be supplied "
                "and to be false."
            )
        properties = node.get("properties") or {}
        required = node.get("required")
        missing = [k for k in properties if not isinstance(required, list) or k not in required]
        if missing:
            return (
                f"In context={context}, 'required' is required to be supplied and to be an "
                f"array including every key in properties. Missing '{missing[0]}'."
            )
        for key, sub in properties.items():
            if problem := strict_violation(sub, (*context, "properties", key)):
                return problem
    for keyword in ("$defs", "definitions"):
        for key, sub in (node.get(keyword) or {}).items():
            if problem := strict_violation(sub, (*context, keyword, key)):
                return problem
    for keyword in ("anyOf", "allOf"):
        for i, sub in enumerate(node.get(keyword) or []):
            if problem := strict_violation(sub, (*context, keyword, str(i))):
                return problem
    if isinstance(node.get("items"), dict):
        return strict_violation(node["items"], (*context, "items"))
    return None


def conversation(body: dict[str, Any]) -> tuple[list[Message], list[ToolSpec]]:
    """A (valid) request as the canonical conversation and tool specs, for a brain."""
    messages: list[Message] = []
    names: dict[str, str] = {}
    for m in body["messages"]:
        if m["role"] == "user":
            content = m["content"]
            if isinstance(content, list):  # what a brain reads of parts: their text
                content = "\n".join(p["text"] for p in content if p["type"] == "text")
            messages.append(UserMessage(text=content))
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


def structured(value: Any) -> Scripted:
    """A reply whose text is `value` as JSON: what a model gives for a `response_format`
    (following its schema only if the script's value does)."""
    return text(json.dumps(value))


def error(status: int, headers: dict[str, str] | None = None, message: str = "") -> Scripted:
    body = {"error": {"message": message or f"error {status}", "type": "server_error"}}
    return status, headers or {}, body


@dataclass
class Cut:
    """A reply that fails while the model writes it.

    Streamed: the role and `partial` text, then an error event with `message`, or
    (`message` None) the connection drops. Not streamed: what a whole response
    gets instead, `status` with `message`, or a dropped connection."""

    partial: str = ""
    message: str | None = SERVER_ERROR
    status: int = 500


def completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def pieces(text: str, size: int = 6) -> list[str]:
    """Text as a model writes it: a few characters at a time, spaces in front."""
    found = re.findall(rf"\s*\S{{1,{size}}}|\s+$", text)
    assert "".join(found) == text
    return found


def chunks(payload: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A whole completion as the chunks OpenAI streams it in."""
    message = payload["choices"][0]["message"]
    content, calls = message.get("content"), message.get("tool_calls") or []
    out = [_chunk(payload, include_usage, {"role": "assistant", "content": "", "refusal": None})]
    if content is None:
        out[0]["choices"][0]["delta"]["content"] = None
    for piece in pieces(content or ""):
        out.append(_chunk(payload, include_usage, {"content": piece}))
    for i, call in enumerate(calls):
        head = {"index": i, "id": call["id"], "type": "function"}
        head["function"] = {"name": call["function"]["name"], "arguments": ""}
        if i == 0 and content is None:  # OpenAI names the first call in the role's chunk
            out[0]["choices"][0]["delta"]["tool_calls"] = [head]
        else:
            out.append(_chunk(payload, include_usage, {"tool_calls": [head]}))
        arguments = call["function"]["arguments"]
        for at in range(0, len(arguments), 8):
            fragment = {"index": i, "function": {"arguments": arguments[at : at + 8]}}
            out.append(_chunk(payload, include_usage, {"tool_calls": [fragment]}))
    finish = payload["choices"][0]["finish_reason"]
    out.append(_chunk(payload, include_usage, {}, finish))
    if include_usage:
        out.append({**_chunk(payload, True, {}), "choices": [], "usage": payload["usage"]})
    return out


def _chunk(
    payload: dict[str, Any], include_usage: bool, delta: dict[str, Any], finish: str | None = None
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": payload["id"],
        "object": "chat.completion.chunk",
        "created": payload["created"],
        "model": payload["model"],
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if include_usage:
        chunk["usage"] = None  # on every chunk but the last, as OpenAI sends it
    return chunk


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
        chunk_delay: float = 0.0,
        stream_usage: bool = True,
        reasoning_models: tuple[str, ...] = (),
    ) -> None:
        self.brain = brain
        self.api_key = api_key
        self.models = (*models, *reasoning_models)
        self.reasoning_models = reasoning_models
        """Models that refuse what OpenAI's reasoning models refuse (`max_tokens`, a
        temperature other than 1) and take `reasoning_effort`."""
        self.chunk_delay = chunk_delay
        """Seconds between streamed chunks: a model takes its time to write."""
        self.stream_usage = stream_usage
        """False: no usage in a stream, whatever `include_usage` asks (some servers)."""
        self.replies: list[Scripted | Cut] = []
        """Scripted answers, used in order before the brain (if any)."""
        self.requests: list[Received] = []
        self._prefixes: list[str] = []
        self._ids = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = server.answer(self.path, self.headers.get("Authorization", ""), body)
                server.write(self, body, reply)

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

    def model(self, name: str = "test-model", **options: Any) -> Any:
        from openai import AsyncOpenAI

        from durable_agent.backends.openai_chat import OpenAIChatModel

        client = AsyncOpenAI(base_url=self.url, api_key=self.api_key, max_retries=0)
        return OpenAIChatModel(name, client=client, **options)

    def answer(self, path: str, auth: str, body: dict[str, Any]) -> Scripted | Cut:
        with self._lock:
            reply: Scripted | Cut
            try:
                reply = self._answer(path, auth, body)
            except Refused as e:
                error_body = {
                    "message": e.message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": e.code,
                }
                reply = e.status, {}, {"error": error_body}
            # A cut reply counts as the error it ends in, streamed or not.
            status = reply.status if isinstance(reply, Cut) else reply[0]
            self.requests.append(Received(time.monotonic(), body, status))
            return reply

    def _answer(self, path: str, auth: str, body: dict[str, Any]) -> Scripted | Cut:
        if path.rstrip("/") != "/v1/chat/completions":
            raise Refused(404, f"Unknown request URL: POST {path}", "unknown_url")
        if auth != f"Bearer {self.api_key}":
            raise Refused(401, "Incorrect API key provided.", "invalid_api_key")
        if body.get("model") not in self.models:
            raise Refused(
                404, f"The model `{body.get('model')}` does not exist.", "model_not_found"
            )
        if problem := violation(body, body["model"] in self.reasoning_models):
            raise Refused(400, problem)
        if self.replies:
            reply = self.replies.pop(0)
            if isinstance(reply, Cut):
                return reply
            status, headers, payload = reply
        elif self.brain is not None:
            status, headers = 200, {}
            payload = self._from_brain(body)
        else:
            raise Refused(500, "the test scripted no reply for this request")
        if status == 200:
            payload = {**payload, "model": body["model"], "usage": self._usage(body, payload)}
        return status, headers, payload

    def write(
        self, handler: BaseHTTPRequestHandler, body: dict[str, Any], reply: Scripted | Cut
    ) -> None:
        """Send `reply` as the request asked for it: whole, or as a stream of chunks."""
        streaming = body.get("stream") is True
        options = body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        include_usage = asked and self.stream_usage
        if isinstance(reply, Cut) and streaming:
            events = cut_chunks(reply, body["model"], include_usage)
            end = None if reply.message is None else _error_event(reply.message)
            _send_events(handler, events, self.chunk_delay, end)
        elif isinstance(reply, Cut):
            if reply.message is None:
                handler.close_connection = True  # no answer at all: the connection drops
            else:
                _send_json(handler, *error(reply.status, message=reply.message))
        elif streaming and reply[0] == 200:
            events = chunks(reply[2], include_usage)
            _send_events(handler, events, self.chunk_delay, "[DONE]")
        else:
            _send_json(handler, *reply)  # errors are whole JSON answers, streaming or not

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


def cut_chunks(cut: Cut, model: str, include_usage: bool) -> list[dict[str, Any]]:
    """The chunks a cut reply gets out before it fails: the role, then its partial text."""
    payload = {**completion({}, "stop"), "model": model}
    first = _chunk(payload, include_usage, {"role": "assistant", "content": "", "refusal": None})
    return [first, *(_chunk(payload, include_usage, {"content": p}) for p in pieces(cut.partial))]


def _error_event(message: str) -> dict[str, Any]:
    """What OpenAI sends in place of the next chunk when the model fails mid-answer."""
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


def _send_json(
    handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], payload: Any
) -> None:
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for k, v in headers.items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(data)


def _send_events(
    handler: BaseHTTPRequestHandler,
    events: list[dict[str, Any]],
    delay: float,
    end: str | dict[str, Any] | None,
) -> None:
    """Server-sent events in a chunked HTTP/1.1 body, one `data:` line each, then
    `end`: `[DONE]`, an error event, or (None) a dropped connection, which the
    client sees as a body cut short rather than a complete one."""
    handler.protocol_version = "HTTP/1.1"
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.send_header("Connection", "close")
    handler.end_headers()

    def send(data: str) -> None:
        frame = f"data: {data}\n\n".encode()
        handler.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
        handler.wfile.flush()

    for event in events:
        send(json.dumps(event))
        time.sleep(delay)
    if end is None:
        return  # the handler closes the connection without ending the body
    send(end if isinstance(end, str) else json.dumps(end))
    handler.wfile.write(b"0\r\n\r\n")


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
