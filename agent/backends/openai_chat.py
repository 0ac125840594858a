"""OpenAI-compatible Chat Completions with native tool calling.

Works with any server that speaks the protocol (OpenAI, Ollama, vLLM, llama.cpp
server): `OPENAI_BASE_URL` and `OPENAI_API_KEY` are read by the `openai`
package. Every request of a turn is the canonical conversation
(`agent.conversation`) as Chat Completions messages: one system message, always
first and always the same; the question; then the model's own messages and one
`tool` message per call. `plan` and `interpret` send the same kind of request.

The client's own retries are off; Temporal owns every attempt. Errors are
classified as the official SDKs do: connection errors, timeouts, 408, 409, 429
and 5xx are transient (`ModelUnavailable`, honouring `retry-after-ms` and
`retry-after`); anything else the server refused (400, 401, 403, 404, 422) is
`ModelRequestRejected`, with the server's own message and what to check.
"""

from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime
from typing import Any

from agent.backends.prompts import INSTRUCTIONS
from agent.conversation import AssistantMessage, UserMessage
from agent.errors import ModelRequestRejected, ModelUnavailable
from agent.model import ModelRequest, Reply
from agent.stream import TextSink
from agent.types import ToolCall, Usage

RETRYABLE_STATUS = frozenset({408, 409, 429})


class OpenAIChatModel:
    provider = "openai"

    def __init__(
        self, model: str, client: Any = None, instructions: str = INSTRUCTIONS, timeout: float = 50
    ) -> None:
        if not model:
            raise ModelRequestRejected("name the model: --model openai:<model>, e.g. openai:gpt-4o")
        self.name = model
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
        self._client = client

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        system = request.instructions or self._instructions
        messages = [{"role": "system", "content": system}, *to_messages(request)]
        tools = [
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
        try:
            resp = await self._client.chat.completions.create(
                model=self.name, messages=messages, tools=tools or None
            )
        except Exception as e:  # the openai package is optional: classify by shape
            raise classify(e) from e
        if not resp.choices:
            raise ModelUnavailable("the model returned no choices")
        choice = resp.choices[0]
        message = choice.message
        calls = [_decode_call(c) for c in message.tool_calls or []]
        text = message.content or ""
        if not calls and not text.strip():
            raise ModelUnavailable("the model returned an empty message")
        if choice.finish_reason == "length" and not calls:
            text = text.rstrip() + " …"  # cut short: still the best answer there is
        return Reply(
            text=text if calls else text.strip(),
            calls=calls,
            usage=_usage(resp.usage),
            finish_reason=choice.finish_reason or "",
            response_model=getattr(resp, "model", "") or "",
        )

    # A chat model answers "what next, given the results" from the same conversation.
    interpret = plan


def to_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages (after the system message)."""
    messages: list[dict[str, Any]] = []
    for m in request.messages:
        if isinstance(m, UserMessage):
            messages.append({"role": "user", "content": m.text})
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


def _arguments(call: ToolCall) -> str:
    # The model's own words when they could not be decoded: it should see its mistake.
    return call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)


def _decode_call(call: Any) -> ToolCall:
    raw = call.function.arguments or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCall(
            id=call.id,
            name=call.function.name,
            error=f"not valid JSON ({e.msg})",
            raw_arguments=raw,
        )
    if not isinstance(args, dict):
        return ToolCall(
            id=call.id, name=call.function.name, error="not a JSON object", raw_arguments=raw
        )
    return ToolCall(id=call.id, name=call.function.name, arguments=args)


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
    if not isinstance(status, int):
        return e
    said = _provider_message(e)
    if status in RETRYABLE_STATUS or status >= 500:
        return ModelUnavailable(
            f"model endpoint answered {status}: {said}", retry_after=retry_after(e)
        )
    if status in (401, 403):
        return ModelRequestRejected(
            f"model endpoint refused the credentials ({status}: {said}); check OPENAI_API_KEY"
        )
    if status == 404:
        return ModelRequestRejected(
            f"model or endpoint not found (404: {said}); check the model name and OPENAI_BASE_URL"
        )
    return ModelRequestRejected(f"model endpoint rejected the request ({status}): {said}")


def _provider_message(e: Exception) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(getattr(e, "message", "") or e)


def retry_after(e: Exception) -> float | None:
    """Seconds the server asked to wait: `retry-after-ms`, else `retry-after`
    (seconds or an HTTP date), as the official SDKs read them."""
    response = getattr(e, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
