"""OpenAI-compatible Chat Completions with native tool calling.

Works with any server that speaks the protocol (OpenAI, Ollama, vLLM, llama.cpp
server): `OPENAI_BASE_URL` and `OPENAI_API_KEY` are read by the `openai`
package. Every request of a turn is the canonical conversation
(`agent.conversation`) as Chat Completions messages: one system message, always
first and always the same; the question; then the model's own messages and one
`tool` message per call. `plan` and `interpret` send the same kind of request.

A typed turn's schema (`ModelRequest.output`, made strict by `durable_agent.outputs`)
goes as `response_format: {type: json_schema, json_schema: {name, schema, strict}}`:
the model answers with JSON text that follows it, or calls tools first.

Given a `TextSink`, the request asks for `stream: true` (with usage in a last
chunk): the text goes to the sink as it comes, the tool calls are put together
from their pieces, and the reply is the one the whole response would have given.
A server that sends no usage while streaming leaves it at zero.

Model settings (`ModelRequest.settings`) go under the API's names: `temperature`,
`top_p`, `stop`, `seed`, `reasoning_effort`, `parallel_tool_calls` (only in a request
with tools: the API refuses it without), the output limit as `max_completion_tokens` to
OpenAI's own API (its reasoning models refuse `max_tokens`) and as `max_tokens` to any
other server; a provider's own parameters in `extra_body`, at the body's top level.

The client's own retries are off; Temporal owns every attempt. Errors are
classified as the official SDKs do: connection errors, timeouts, 408, 409, 429
and 5xx are transient (`ModelUnavailable`, honouring `retry-after-ms` and
`retry-after`); anything else the server refused (400, 401, 403, 404, 422) is
`ModelRequestRejected`, with the server's own message and what to check. An
error event in the middle of a stream is transient, unless it carries a status
(vLLM) that says otherwise.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

from durable_agent import attachments
from durable_agent.backends.prompts import INSTRUCTIONS
from durable_agent.compaction import known_window
from durable_agent.conversation import AssistantMessage, UserMessage
from durable_agent.errors import ModelCannotAnswer, ModelRequestRejected, ModelUnavailable
from durable_agent.model import ModelRequest, Reply
from durable_agent.model_settings import ModelSettings
from durable_agent.stream import TextSink
from durable_agent.types import ToolCall, Usage

MAX_TOKENS_PARAMS = ("max_completion_tokens", "max_tokens")
OPENAI_HOSTS = ("api.openai.com", ".openai.azure.com")
"""OpenAI's own API (and Azure's): the output limit is `max_completion_tokens` there."""
RETRYABLE_STATUS = frozenset({408, 409, 429})
THIS_MODEL_ONLY = frozenset(
    {"context_length_exceeded", "content_filter", "string_above_max_length"}
)
"""Error codes of a request this model will not take, which another model may: its
context window, its content filter (`ModelCannotAnswer`: a fallback model is asked)."""


class OpenAIChatModel:
    provider = "openai"
    native_output = True
    """A typed turn's schema goes as `response_format` (strict structured outputs)."""

    def __init__(
        self,
        model: str,
        client: Any = None,
        instructions: str = INSTRUCTIONS,
        timeout: float = 50,
        *,
        max_tokens_param: str | None = None,
    ) -> None:
        """`max_tokens_param`: the name a reply's output limit is sent under;
        None: `max_completion_tokens` to OpenAI's own API (its reasoning models refuse
        `max_tokens`), `max_tokens` to any other server (what they all take)."""
        if not model:
            raise ModelRequestRejected("name the model: --model openai:<model>, e.g. openai:gpt-4o")
        self.name = model
        self.context_window = known_window(model)
        """Tokens, when the model is one `durable_agent.compaction` knows."""
        self._instructions = instructions
        if client is None:
            try:
                from openai import AsyncOpenAI
            except ImportError:
                raise ModelRequestRejected(
                    "the openai backend needs the `openai` package: pip install -e '.[openai]'"
                ) from None
            try:
                client = AsyncOpenAI(max_retries=0, timeout=timeout)
            except Exception as e:  # openai.OpenAIError: no API key
                raise ModelRequestRejected(
                    f"the openai backend cannot start ({e}); set OPENAI_API_KEY for the "
                    "worker (any value for a local server that needs none) and restart it"
                ) from None
        retries = getattr(client, "max_retries", 0)
        if isinstance(retries, int) and retries > 0 and hasattr(client, "with_options"):
            # A client of the agent's own retries nothing either: a request the SDK
            # sends again inside one attempt is one the turn neither sees nor counts.
            client = client.with_options(max_retries=0)
        self._client = client
        if max_tokens_param not in (None, *MAX_TOKENS_PARAMS):
            raise ModelRequestRejected(
                f"max_tokens_param={max_tokens_param!r}: use one of {', '.join(MAX_TOKENS_PARAMS)}"
            )
        self.max_tokens_param = max_tokens_param or _max_tokens_param(client)

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        body = self.request(request)
        try:
            if stream is None:
                answer = _whole(await self._client.chat.completions.create(**body))
            else:
                answer = await self._streamed(body, stream)
        except Exception as e:  # the openai package is optional: classify by shape
            raise classify(e) from e
        return answer.reply()

    def unsupported_settings(self, request: ModelRequest) -> dict[str, str]:
        """Every setting has its parameter here (whether the model takes it is the
        server's to say)."""
        return {}

    def request(self, request: ModelRequest) -> dict[str, Any]:
        """The `chat.completions.create` keyword arguments for a request."""
        system = request.instructions or self._instructions
        body: dict[str, Any] = {
            "model": self.name,
            "messages": [{"role": "system", "content": system}, *to_messages(request)],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
            or None,
        }
        if request.output is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": request.output.name,
                    "schema": request.output.json_schema,
                    "strict": True,
                },
            }
        if request.settings is not None:
            body.update(self._settings(request.settings, bool(request.tools)))
        return body

    def _settings(self, settings: ModelSettings, tools: bool) -> dict[str, Any]:
        """The settings under the API's names; a provider's own in `extra_body`, which the
        SDK sends at the body's top level."""
        sent: dict[str, Any] = {
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            self.max_tokens_param: settings.max_tokens,
            "stop": settings.stop or None,
            "seed": settings.seed,
            # Only with tools: the API refuses `parallel_tool_calls` in a request without.
            "parallel_tool_calls": settings.parallel_tool_calls if tools else None,
            "reasoning_effort": settings.reasoning_effort,
            "extra_body": settings.extra or None,
        }
        return {k: v for k, v in sent.items() if v is not None}

    async def _streamed(self, body: dict[str, Any], sink: TextSink) -> _Answer:
        """The same request with `stream: true`: the text goes to `sink` as it comes,
        and the chunks are put back together into the message a whole response holds.
        Usage comes in a last chunk of its own, only when asked for."""
        chunks = await self._client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}
        )
        answer = _Answer()
        async with chunks:  # closes the connection however reading ends
            async for chunk in chunks:
                answer.add(chunk, sink)
        return answer

    # A chat model answers "what next, given the results" from the same conversation.
    interpret = plan


def _max_tokens_param(client: Any) -> str:
    """`max_completion_tokens` for OpenAI's own API (`max_tokens` is deprecated there,
    and its reasoning models refuse it); `max_tokens` for the servers that speak its
    protocol (vLLM, Ollama, llama.cpp, LM Studio), which all take it."""
    host = str(getattr(getattr(client, "base_url", None), "host", "") or "")
    if host == OPENAI_HOSTS[0] or host.endswith(OPENAI_HOSTS[1]):
        return MAX_TOKENS_PARAMS[0]
    return MAX_TOKENS_PARAMS[1]


def to_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages (after the system message)."""
    messages: list[dict[str, Any]] = []
    for m in request.messages:
        if isinstance(m, UserMessage):
            messages.append({"role": "user", "content": _user_content(m, request)})
        elif isinstance(m, AssistantMessage):
            message: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": _arguments(c)},
                    }
                    for c in m.calls
                ]
            messages.append(message)
        else:
            content = m.text if m.ok else f"error: {m.text}"
            messages.append({"role": "tool", "tool_call_id": m.call_id, "content": content})
    return messages


def _user_content(m: UserMessage, request: ModelRequest) -> str | list[dict[str, Any]]:
    """The customer's words; with attachments, content parts: the words, then each file,
    an image as an `image_url` part (a data URL), a PDF as a `file` part, a text file as
    text."""
    if not m.attachments:
        return m.text
    parts: list[dict[str, Any]] = [{"type": "text", "text": m.text}]
    for a in m.attachments:
        data = request.attached(a)
        if attachments.kind(a) == "image":
            url = attachments.data_url(a.content_type, data)
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif attachments.kind(a) == "document":
            url = attachments.data_url(a.content_type, data)
            parts.append({"type": "file", "file": {"filename": a.name, "file_data": url}})
        else:
            parts.append({"type": "text", "text": attachments.as_text(a, data)})
    return parts


def _arguments(call: ToolCall) -> str:
    # The model's own words when they could not be decoded: it should see its mistake.
    return call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class _Answer:
    """The first choice's message, read whole or put back together from chunks: one
    place turns it into a `Reply`, so streaming cannot change what a turn decides."""

    choices: bool = False
    text: str = ""
    calls: list[_PartialCall] = field(default_factory=list)
    finish_reason: str = ""
    usage: Any = None
    model: str = ""
    _by_index: dict[int, _PartialCall] = field(default_factory=dict)

    def add(self, chunk: Any, sink: TextSink) -> None:
        """Take the next chunk; its text goes to `sink` at once."""
        self.model = getattr(chunk, "model", "") or self.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage  # the last chunk's (some servers send it on each)
        for choice in chunk.choices or []:
            if (choice.index or 0) != 0:
                continue  # one choice is asked for; ignore any other
            self.choices = True
            delta = choice.delta
            # A model that refuses a structured output says why in `refusal`.
            if said := delta.content or getattr(delta, "refusal", None):
                self.text += said
                sink(said)
            for piece in delta.tool_calls or []:
                self._add_call(piece)
            self.finish_reason = choice.finish_reason or self.finish_reason

    def _add_call(self, piece: Any) -> None:
        """A call comes in pieces: the first names it (id, function name), the rest add
        argument text. Pieces say which call they belong to by `index`; a server that
        leaves it out starts a new call with each new id."""
        index = piece.index
        if index is None:
            new = piece.id and (not self.calls or self.calls[-1].id != piece.id)
            index = len(self.calls) if new or not self.calls else len(self.calls) - 1
        call = self._by_index.get(index)
        if call is None:
            call = self._by_index[index] = _PartialCall()
            self.calls.append(call)
        call.id = call.id or piece.id or ""
        if piece.function is not None:
            call.name += piece.function.name or ""
            call.arguments += piece.function.arguments or ""

    def reply(self) -> Reply:
        if not self.choices:
            raise ModelUnavailable("the model returned no choices")
        calls = [_decode_call(c.id, c.name, c.arguments) for c in self.calls]
        text = self.text
        if not calls and not text.strip():
            if self.finish_reason == "content_filter":
                raise ModelCannotAnswer("the model's content filter withheld its reply")
            raise ModelUnavailable("the model returned an empty message")
        if self.finish_reason == "length" and not calls:
            text = text.rstrip() + " …"  # cut short: still the best answer there is
        return Reply(
            text=text if calls else text.strip(),
            calls=calls,
            usage=_usage(self.usage),
            finish_reason=self.finish_reason,
            response_model=self.model,
        )


def _whole(resp: Any) -> _Answer:
    """A whole (non-streamed) response as the answer it holds."""
    answer = _Answer(model=getattr(resp, "model", "") or "", usage=resp.usage)
    if not resp.choices:
        return answer
    choice = resp.choices[0]
    message = choice.message
    answer.choices = True
    # A model that refuses a structured output says why in `refusal`, not `content`.
    answer.text = message.content or getattr(message, "refusal", None) or ""
    answer.finish_reason = choice.finish_reason or ""
    answer.calls = [
        _PartialCall(c.id, c.function.name, c.function.arguments or "")
        for c in message.tool_calls or []
    ]
    return answer


def _decode_call(id: str, name: str, arguments: str) -> ToolCall:
    raw = arguments or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCall(id=id, name=name, error=f"not valid JSON ({e.msg})", raw_arguments=raw)
    if not isinstance(args, dict):
        return ToolCall(id=id, name=name, error="not a JSON object", raw_arguments=raw)
    return ToolCall(id=id, name=name, arguments=args)


def _usage(u: Any) -> Usage:
    details = getattr(u, "prompt_tokens_details", None)
    return Usage(
        model_calls=1,
        input_tokens=getattr(u, "prompt_tokens", 0) or 0,
        output_tokens=getattr(u, "completion_tokens", 0) or 0,
        cached_input_tokens=getattr(details, "cached_tokens", 0) or 0,
    )


def classify(e: Exception) -> Exception:
    """An `openai` exception as `ModelUnavailable` (retried) or `ModelRequestRejected`."""
    name = type(e).__name__
    status = getattr(e, "status_code", None)
    if name in ("APITimeoutError", "APIConnectionError"):
        return ModelUnavailable(f"model endpoint unreachable: {e}")
    said = _provider_message(e)
    if name == "APIError" and not isinstance(status, int):
        # An error event inside a stream the server had accepted (HTTP 200). vLLM
        # puts the status it means in `code`; OpenAI names only a type: the model
        # failed while writing, which another attempt may not.
        code = _error_body(e).get("code")
        if not isinstance(code, int):
            return ModelUnavailable(f"model endpoint failed while answering: {said}")
        status = code
    if not isinstance(status, int):
        return e
    if status in RETRYABLE_STATUS or status >= 500:
        return ModelUnavailable(
            f"model endpoint answered {status}: {said}", retry_after=retry_after(e)
        )
    if _error_body(e).get("code") in THIS_MODEL_ONLY:
        return ModelCannotAnswer(f"the model will not take this request ({status}): {said}")
    if status in (401, 403):
        return ModelRequestRejected(
            f"model endpoint refused the credentials ({status}: {said}); check OPENAI_API_KEY"
        )
    if status == 404:
        return ModelRequestRejected(
            f"model or endpoint not found (404: {said}); check the model name and OPENAI_BASE_URL"
        )
    return ModelRequestRejected(f"model endpoint rejected the request ({status}): {said}")


def _error_body(e: Exception) -> dict[str, Any]:
    """The server's error object (`{"message": ..., "type": ..., "code": ...}`), if any."""
    body = getattr(e, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    return inner if isinstance(inner, dict) else {}


def _provider_message(e: Exception) -> str:
    said = _error_body(e).get("message")
    return str(said) if said else str(getattr(e, "message", "") or e)


MAX_RETRY_AFTER_S = 60.0
"""Longer waits than this a server asks for are not taken (the model retry policy's
backoff is), as the official SDKs do: a turn is not parked for a day by one header."""


def retry_after(e: Exception) -> float | None:
    """Seconds the server asked to wait: `retry-after-ms`, else `retry-after`
    (seconds or an HTTP date), as the official SDKs read them; None for no usable
    ask, or one over `MAX_RETRY_AFTER_S`."""
    response = getattr(e, "response", None)
    headers = getattr(response, "headers", None)
    seconds = _asked_wait(headers) if headers is not None else None
    if seconds is None or seconds > MAX_RETRY_AFTER_S:
        return None
    return max(0.0, seconds)


def _asked_wait(headers: Any) -> float | None:
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        return None
