"""Anthropic's Messages API, with native tool use, prompt caching and extended thinking.

    --model anthropic:<model>                  e.g. anthropic:claude-sonnet-4-6
    --model anthropic:<model>+thinking         extended thinking, a budget of 4,096 tokens
    --model anthropic:<model>+thinking=16000   ... of 16,000 tokens (`=adaptive`: the
                                               model's own choice, on models that have it)
    --model anthropic:<model>+max_tokens=8192  the reply's own limit (4,096 by default)
    ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL      read by the `anthropic` package
    AGENT_ANTHROPIC_CACHE=0                    no cache breakpoints (on by default)

Every request is the canonical conversation (`agent.conversation`) as Messages: the
instructions in `system`, the same on every call; user and assistant alternating; the
model's `tool_use` blocks as it sent them, each answered by its `tool_result`
(`is_error` for a failure) in the user message right after, results first.

Prompt caching is on: `cache_control` breakpoints, at most the API's four, on the last
tool, on the instructions, and in a conversation longer than its question on the end of
the previous request (where the previous call wrote the cache, read there however many
blocks the round added: the API looks only 20 blocks back from a breakpoint) and on the
end of this one (written for the next call). Usage counts the cache's reads
(`cached_input_tokens`) and writes (`cache_write_tokens`), each priced at its own rate.

Extended thinking (`+thinking`): the model's thinking blocks come back with their
signatures in the reply's opaque part (`conversation.Opaque`), which stays with its
message in the turn's record; they go back unchanged with that message, as the API
requires within a round of tool use. A request whose round opens with a message that
has none (another model's, or one compaction summarised) is sent without thinking: the
API refuses thinking there. A typed turn cannot force its output tool while thinking
(the API refuses that too): the model is offered it, and asked again if it answers in
words.

Model settings (`ModelRequest.settings`): `max_tokens` is the reply's own limit (over
the spec's `+max_tokens`; a thinking budget is added to it), `stop_sequences`,
`output_config.effort` for a reasoning effort from low to max (`none`: no thinking),
`disable_parallel_tool_use` for no parallel calls; temperature, top_p and a provider's
own parameters in the body (`extra_body`: the SDK has no argument for them). While the
model thinks the API refuses a temperature but 1 and a top_p under 0.95: a request that
thinks does not send them, and says so (`unsupported_settings`), as it does of a seed.

Given a `TextSink`, the request streams: text goes to the sink as it comes (thinking
does not), and the reply is the one the whole message gives.

The client's own retries are off; Temporal owns every attempt. Connection errors,
timeouts, 408, 409, 429, 5xx and 529 (overloaded) are transient (`ModelUnavailable`,
after the API's `retry-after`), as is an `error` event inside a stream of one of those
kinds; 400, 401, 403 and 404 are `ModelRequestRejected`, with the API's own message and
what to check; a prompt too long for the model and a `refusal` are `ModelCannotAnswer`
(a turn's fallback model may answer).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from typing import Any

from durable_agent import attachments
from durable_agent.backends.openai_chat import retry_after
from durable_agent.backends.prompts import INSTRUCTIONS
from durable_agent.compaction import known_window
from durable_agent.conversation import AssistantMessage, Message, Opaque, ToolResult, UserMessage
from durable_agent.errors import ModelCannotAnswer, ModelRequestRejected, ModelUnavailable
from durable_agent.model import ModelRequest, Reply
from durable_agent.model_settings import ModelSettings
from durable_agent.stream import TextSink
from durable_agent.types import ToolCall, Usage

PROVIDER = "anthropic"
MAX_BREAKPOINTS = 4
"""`cache_control` blocks the API takes in one request."""
CACHE = {"type": "ephemeral"}
MAX_TOKENS = 4_096
"""The reply's own limit when the spec names none: every Claude model writes as much."""
THINKING_BUDGET = 4_096
"""Thinking tokens when `+thinking` names no budget (the API's least is 1,024)."""
THINKING = ("thinking", "redacted_thinking")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
"""`output_config.effort` as the API takes it (a `reasoning_effort` of `none` sends no
thinking; `minimal` has no match)."""
MIN_TOP_P_THINKING = 0.95
"""While the model thinks, the API takes `top_p` from this up, and `temperature` only 1."""
RETRYABLE_STATUS = frozenset({408, 409, 429})
TRANSIENT_KINDS = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500}
"""An `error` event's type inside a stream the API had accepted (HTTP 200), as the
status the same error has before a stream starts."""
_TOO_LONG = re.compile(r"prompt is too long|context window|too many (input )?tokens", re.I)
_BROKEN = ("RemoteProtocolError", "ReadError", "ReadTimeout", "WriteError", "ConnectError")
"""httpx's errors when a connection breaks while a stream is read."""


class AnthropicModel:
    provider = PROVIDER

    def __init__(
        self,
        model: str,
        client: Any = None,
        instructions: str = INSTRUCTIONS,
        *,
        thinking: int | str | None = None,
        max_tokens: int = MAX_TOKENS,
        cache: bool | None = None,
        timeout: float = 50,
    ) -> None:
        """`thinking`: a budget in tokens (at least 1,024), `"adaptive"`, or None for
        none; `cache`: None reads AGENT_ANTHROPIC_CACHE (on unless `0`)."""
        if not model:
            raise ModelRequestRejected(
                "name the model: --model anthropic:<model>, e.g. anthropic:claude-sonnet-4-6"
            )
        if isinstance(thinking, int) and thinking < 1_024:
            raise ModelRequestRejected(
                f"anthropic:{model}: a thinking budget is at least 1024 tokens, not {thinking}"
            )
        self.name = model
        self.context_window = known_window(model)
        """Tokens, when the model is one `durable_agent.compaction` knows."""
        self._instructions = instructions
        self._thinking = thinking
        self._max_tokens = max_tokens
        if cache is None:
            cache = os.environ.get("AGENT_ANTHROPIC_CACHE", "").strip().lower() not in (
                "0",
                "false",
                "off",
            )
        self._cache = cache
        self._client = _client(timeout) if client is None else _without_retries(client)

    @classmethod
    def from_spec(cls, spec: str) -> AnthropicModel:
        """`<model>[+thinking[=BUDGET|adaptive]][+max_tokens=N]`, the part of a model
        spec after `anthropic:`."""
        name, *options = spec.split("+")
        thinking: int | str | None = None
        max_tokens = MAX_TOKENS
        for option in options:
            key, has_value, value = option.partition("=")
            if key == "thinking" and not has_value:
                thinking = THINKING_BUDGET
            elif key == "thinking" and value == "adaptive":
                thinking = "adaptive"
            elif key in ("thinking", "max_tokens") and value.isdigit():
                if key == "thinking":
                    thinking = int(value)
                else:
                    max_tokens = int(value)
            else:
                raise ModelRequestRejected(
                    f"anthropic:{spec}: unknown option {option!r}; the options are "
                    "+thinking, +thinking=BUDGET, +thinking=adaptive and +max_tokens=N"
                )
        return cls(name, thinking=thinking, max_tokens=max_tokens)

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        body = self.request(request)
        try:
            if stream is None:
                message = await self._client.messages.create(**body)
            else:
                message = await self._streamed(body, stream)
        except ModelUnavailable:
            raise  # a stream that ended too soon: already said
        except Exception as e:  # the anthropic package is optional: classify by shape
            raise classify(e) from e
        return _reply(message, self.name, body["max_tokens"])

    async def _streamed(self, body: dict[str, Any], sink: TextSink) -> Any:
        """The same request, streamed: text deltas go to `sink` as they come, and the
        SDK puts the events back together into the message a whole response holds."""
        async with self._client.messages.stream(**body) as events:
            async for event in events:
                if event.type == "text":
                    sink(event.text)
            message = await events.get_final_message()
        if message.stop_reason is None:
            raise ModelUnavailable("the model's stream ended before its message did")
        return message

    # A chat model answers "what next, given the results" from the same conversation.
    interpret = plan

    def unsupported_settings(self, request: ModelRequest) -> dict[str, str]:
        """No seed, no `minimal` effort; while the model thinks, no temperature but 1
        and no top_p under 0.95 (the API refuses them then)."""
        if request.settings is None:
            return {}
        return _settings(request.settings, self._thinking_in(request) is not None)[1]

    def _thinking_in(self, request: ModelRequest) -> int | str | None:
        """The thinking this request asks for: the spec's, unless the turn's effort is
        `none` or its round may not think (`_may_think`)."""
        if self._thinking is None or _effort(request) == "none":
            return None
        return self._thinking if _may_think(request.messages, self.name) else None

    def request(self, request: ModelRequest) -> dict[str, Any]:
        """The `messages.create` keyword arguments for a request."""
        settings = request.settings or ModelSettings()
        thinking = self._thinking_in(request)
        body: dict[str, Any] = {
            "model": self.name,
            "max_tokens": settings.max_tokens or self._max_tokens,
            "system": [{"type": "text", "text": request.instructions or self._instructions}],
            "messages": to_messages(
                request.messages, self.name, thinking=thinking is not None, files=request.files
            ),
        }
        if request.tools:
            body["tools"] = [_tool(t.name, t.description, t.parameters) for t in request.tools]
            choice = _tool_choice(request, thinking is not None) if request.final_tool else None
            if settings.parallel_tool_calls is False:
                choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
            if choice is not None:
                body["tool_choice"] = choice
        body.update(_settings(settings, thinking is not None)[0])
        if thinking == "adaptive":
            body["thinking"] = {"type": "adaptive"}
            body["max_tokens"] += THINKING_BUDGET
        elif thinking is not None:
            # The budget is part of `max_tokens`: the reply keeps its own room beside it.
            body["thinking"] = {"type": "enabled", "budget_tokens": thinking}
            body["max_tokens"] += thinking
        if self._cache:
            _mark_cache(body)
        return body


def _effort(request: ModelRequest) -> str | None:
    return request.settings.reasoning_effort if request.settings is not None else None


def _settings(settings: ModelSettings, thinking: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings as `messages.create` takes them (what the SDK has no argument for,
    and a provider's own extras, in `extra_body`: the body's top level), and those it
    does not send, with why. The output limit and the parallel-call switch are set
    where the request is built."""
    sent: dict[str, Any] = {}
    body: dict[str, Any] = {}
    ignored: dict[str, str] = {}
    if settings.temperature is not None:
        if thinking and settings.temperature != 1:
            ignored["temperature"] = "the API takes none but 1 while the model thinks (+thinking)"
        else:
            body["temperature"] = settings.temperature
    if settings.top_p is not None:
        if thinking and settings.top_p < MIN_TOP_P_THINKING:
            ignored["top_p"] = (
                f"the API takes none under {MIN_TOP_P_THINKING} while the model thinks (+thinking)"
            )
        else:
            body["top_p"] = settings.top_p
    if settings.stop:
        sent["stop_sequences"] = list(settings.stop)
    if settings.seed is not None:
        ignored["seed"] = "the Messages API has no seed"
    effort = settings.reasoning_effort
    if effort in EFFORTS:
        sent["output_config"] = {"effort": effort}
    elif effort == "minimal":
        ignored["reasoning_effort"] = (
            f"the API's efforts are {', '.join(EFFORTS)} (none: no thinking)"
        )
    body.update(settings.extra)
    if body:
        sent["extra_body"] = body
    return sent, ignored


def _client(timeout: float) -> Any:
    try:
        from anthropic import AsyncAnthropic
    except ImportError:
        raise ModelRequestRejected(
            "the anthropic backend needs the `anthropic` package: pip install -e '.[anthropic]'"
        ) from None
    try:
        client = AsyncAnthropic(max_retries=0, timeout=timeout)
    except Exception as e:  # anthropic.CredentialsError: a profile named and not found
        raise ModelRequestRejected(
            f"the anthropic backend cannot start ({e}); set ANTHROPIC_API_KEY for the worker "
            "and restart it"
        ) from None
    if client.api_key is None and client.auth_token is None and client.credentials is None:
        raise ModelRequestRejected(
            "the anthropic backend has no API key: set ANTHROPIC_API_KEY for the worker "
            "and restart it"
        )
    return client


def _without_retries(client: Any) -> Any:
    # A client of the agent's own retries nothing either: a request the SDK sends again
    # inside one attempt is one the turn neither sees nor counts.
    retries = getattr(client, "max_retries", 0)
    if isinstance(retries, int) and retries > 0 and hasattr(client, "with_options"):
        return client.with_options(max_retries=0)
    return client


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": name, "input_schema": parameters}
    if description:
        tool["description"] = description
    return tool


def _tool_choice(request: ModelRequest, thinking: bool) -> dict[str, Any]:
    """A typed turn ends with the output tool: the model must call a tool (it may call
    others first), and that one when it is the only one; while it thinks, the API lets
    no tool be forced, so the tool is only offered."""
    if thinking:
        return {"type": "auto"}
    if len(request.tools) == 1:
        return {"type": "tool", "name": request.final_tool}
    return {"type": "any"}


def _may_think(messages: list[Message], model: str) -> bool:
    """Whether this request may think: the API wants the round of tool use it
    continues (from the customer's latest words on) to open with the thinking the
    model did there, returned unchanged. A round not begun yet may; one whose first
    message has no thinking of this model's (another model wrote it, or compaction
    summarised it) may not."""
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=-1)
    opener = next((m for m in messages[last_user + 1 :] if isinstance(m, AssistantMessage)), None)
    if opener is None:
        return True
    blocks = opener.opaque.of(PROVIDER, model) if opener.opaque else []
    return bool(blocks) and blocks[0].get("type") in THINKING


def to_messages(
    messages: list[Message], model: str, thinking: bool, files: Mapping[str, bytes] | None = None
) -> list[dict[str, Any]]:
    """The conversation as Messages: a call's results ride in one user message, before
    anything else in it. Thinking blocks go back with their message, unchanged, only
    to the model that wrote them and only when the request thinks."""
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        if isinstance(m, UserMessage):
            add("user", [*_attached(m, files or {}), {"type": "text", "text": m.text}])
        elif isinstance(m, AssistantMessage):
            blocks = list(m.opaque.of(PROVIDER, model)) if m.opaque and thinking else []
            # The API refuses blank text blocks; a message of calls alone has none.
            if m.text.strip():
                blocks.append({"type": "text", "text": m.text})
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                for c in m.calls
            ]
            add("assistant", blocks)
        else:
            add("user", [_result(m)])
    return out


def _attached(m: UserMessage, files: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """A message's attachments as Messages blocks, before its text (as the API's guide
    puts them): an image as an `image` block, a PDF as a base64 `document` block, a text
    file as a text `document` block, each titled with its name."""
    blocks: list[dict[str, Any]] = []
    for a in m.attachments:
        data = files[a.sha256]
        if attachments.kind(a) == "image":
            source = {"type": "base64", "media_type": a.content_type, "data": _b64(data)}
            blocks.append({"type": "image", "source": source})
            continue
        if attachments.kind(a) == "document":
            source = {"type": "base64", "media_type": a.content_type, "data": _b64(data)}
        else:
            text = data.decode("utf-8", errors="replace")
            source = {"type": "text", "media_type": "text/plain", "data": text}
        blocks.append({"type": "document", "source": source, "title": a.name})
    return blocks


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _result(m: ToolResult) -> dict[str, Any]:
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.call_id}
    if m.text:  # an empty result is no content at all, never an empty text block
        result["content"] = m.text
    if not m.ok:
        result["is_error"] = True
    return result


def _mark_cache(body: dict[str, Any]) -> None:
    """Cache breakpoints: the tools, the instructions (the API reads tools, then system,
    then messages), and in a conversation past its question the end of the previous
    request and of this one, within the API's four."""
    marks: list[dict[str, Any]] = []
    if body.get("tools"):
        marks.append(body["tools"][-1])
    marks.append(body["system"][-1])
    messages = body["messages"]
    if len(messages) > 1:
        # Alternating roles, ending with the user: the previous request ended two back.
        if len(messages) >= 3:
            marks.append(messages[-3]["content"][-1])
        marks.append(messages[-1]["content"][-1])
    for block in marks[:MAX_BREAKPOINTS]:
        block["cache_control"] = dict(CACHE)


def _reply(message: Any, model: str, max_tokens: int) -> Reply:
    stop = message.stop_reason or ""
    blocks = list(message.content)
    text = "".join(b.text for b in blocks if b.type == "text")
    calls = [_decode_call(b) for b in blocks if b.type == "tool_use"]
    if stop == "max_tokens" and blocks and blocks[-1].type == "tool_use":
        # Cut while it wrote this call: what arrived of its input may parse, and be wrong.
        calls[-1] = ToolCall(
            id=calls[-1].id,
            name=calls[-1].name,
            error=f"cut short: the reply reached max_tokens ({max_tokens}) while writing it",
        )
    if stop == "refusal":
        # The API's safety classifier stopped the reply: what came before is not an answer.
        details = getattr(message, "stop_details", None)
        category = getattr(details, "category", None)
        why = f" ({category})" if category else ""
        raise ModelCannotAnswer(f"the model declined to answer this request{why}")
    if not calls and not text.strip():
        if stop == "max_tokens":
            raise ModelCannotAnswer(
                f"the model reached its output limit (max_tokens {max_tokens}) before it "
                "wrote an answer: raise it (the max_tokens setting, or "
                "anthropic:<model>+max_tokens=N)"
            )
        if stop == "model_context_window_exceeded":
            raise ModelCannotAnswer("the conversation fills the model's context window")
        raise ModelUnavailable(f"the model returned an empty message (stop_reason {stop!r})")
    if stop in ("max_tokens", "model_context_window_exceeded") and not calls:
        text = text.rstrip() + " …"  # cut short: still the best answer there is
    thoughts = [_thought(b) for b in blocks if b.type in THINKING]
    return Reply(
        text=text if calls else text.strip(),
        calls=calls,
        usage=_usage(message.usage),
        finish_reason=stop,
        response_model=getattr(message, "model", "") or "",
        opaque=Opaque(provider=PROVIDER, model=model, blocks=thoughts) if thoughts else None,
    )


def _thought(block: Any) -> dict[str, Any]:
    """A thinking block as the API takes it back: exactly what it sent."""
    if block.type == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block.data}
    return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}


def _decode_call(block: Any) -> ToolCall:
    if isinstance(block.input, dict):
        return ToolCall(id=block.id, name=block.name, arguments=block.input)
    return ToolCall(id=block.id, name=block.name, error="not a JSON object")


def _usage(u: Any) -> Usage:
    read = getattr(u, "cache_read_input_tokens", 0) or 0
    written = getattr(u, "cache_creation_input_tokens", 0) or 0
    return Usage(
        model_calls=1,
        # The API counts cache reads and writes apart from `input_tokens`.
        input_tokens=(getattr(u, "input_tokens", 0) or 0) + read + written,
        output_tokens=getattr(u, "output_tokens", 0) or 0,
        cached_input_tokens=read,
        cache_write_tokens=written,
    )


def classify(e: Exception) -> Exception:
    """An `anthropic` exception as `ModelUnavailable` (retried), `ModelCannotAnswer` or
    `ModelRequestRejected`; anything else as it is."""
    name = type(e).__name__
    if name in ("APITimeoutError", "APIConnectionError") or name in _BROKEN:
        return ModelUnavailable(f"Anthropic API unreachable: {e}")
    status = getattr(e, "status_code", None)
    if not isinstance(status, int):
        return e
    kind, said = _error(e)
    if status < 400:
        # An `error` event inside a stream the API had accepted (HTTP 200).
        status = TRANSIENT_KINDS.get(kind, 400 if kind.endswith("request_error") else 500)
    if status in RETRYABLE_STATUS or status >= 500:
        return ModelUnavailable(
            f"Anthropic API answered {status} ({kind or 'error'}): {said}",
            retry_after=retry_after(e),
        )
    if status == 413 or _TOO_LONG.search(said):
        return ModelCannotAnswer(f"the model will not take this request ({status}): {said}")
    if status == 401:
        return ModelRequestRejected(
            f"Anthropic API refused the API key (401: {said}); check ANTHROPIC_API_KEY"
        )
    if status == 403:
        return ModelRequestRejected(
            f"Anthropic API refused access (403: {said}); check that ANTHROPIC_API_KEY's "
            "workspace may use this model"
        )
    if status == 404:
        return ModelRequestRejected(
            f"model or endpoint not found (404: {said}); check the model name "
            "(anthropic:<model>) and ANTHROPIC_BASE_URL"
        )
    return ModelRequestRejected(f"Anthropic API rejected the request ({status}): {said}")


def _error(e: Exception) -> tuple[str, str]:
    """The API's error type and message (`{"type": "error", "error": {...}}`)."""
    body = getattr(e, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict):
        return str(inner.get("type") or ""), str(inner.get("message") or e)
    return "", str(getattr(e, "message", "") or e)
