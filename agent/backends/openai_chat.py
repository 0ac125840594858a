"""OpenAI-compatible Chat Completions with native tool calling.

Works with any server that speaks the protocol (OpenAI, Ollama, vLLM, llama.cpp
server): `OPENAI_BASE_URL` and `OPENAI_API_KEY` are read by the `openai`
package. The client's own retries are off; Temporal owns every attempt:
throttling (429, honouring Retry-After), timeouts, connection errors and 5xx
become `ModelUnavailable`; auth, bad requests and unknown models become
`ModelRequestRejected` with a message that says what to fix.

Calls per iteration: two (plan, interpret).
"""

from __future__ import annotations

import json
from typing import Any

from agent.backends._transcript import AssistantCalls, AssistantText, UserText, transcript
from agent.backends.prompts import INSTRUCTIONS, INTERPRET_HINT
from agent.errors import ModelRequestRejected, ModelUnavailable
from agent.model import Decision, ModelRequest, Plan
from agent.types import ToolCall, Usage


class OpenAIChatModel:
    system = "openai"

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
            client = AsyncOpenAI(max_retries=0, timeout=timeout)
        self._client = client

    async def plan(self, request: ModelRequest) -> Plan:
        message, usage = await self._chat(request, hint=None)
        calls = [_decode_call(c) for c in message.tool_calls or []]
        return Plan(calls=calls, text=message.content or "", usage=usage)

    async def interpret(self, request: ModelRequest) -> Decision:
        message, usage = await self._chat(request, hint=INTERPRET_HINT)
        if message.tool_calls:
            wanted = ", ".join(c.function.name for c in message.tool_calls)
            return Decision(final=False, text=message.content or f"call {wanted}", usage=usage)
        return Decision(final=True, text=(message.content or "").strip(), usage=usage)

    async def _chat(self, request: ModelRequest, hint: str | None) -> tuple[Any, Usage]:
        messages = [{"role": "system", "content": self._instructions}, *to_messages(request)]
        if hint:
            messages.append({"role": "system", "content": hint})
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
        except Exception as e:  # the openai package is optional: classify by name
            raise _classify(e) from e
        if not resp.choices:
            raise ModelUnavailable("the model returned no choices")
        u = resp.usage
        usage = Usage(
            model_calls=1,
            input_tokens=getattr(u, "prompt_tokens", 0) or 0,
            output_tokens=getattr(u, "completion_tokens", 0) or 0,
        )
        return resp.choices[0].message, usage


def to_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The turn so far as Chat Completions messages."""
    messages: list[dict[str, Any]] = []
    for entry in transcript(request):
        if isinstance(entry, UserText):
            messages.append({"role": "user", "content": entry.text})
        elif isinstance(entry, AssistantText):
            messages.append({"role": "assistant", "content": entry.text})
        elif isinstance(entry, AssistantCalls):
            calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in entry.calls
            ]
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        else:
            content = entry.text if entry.ok else f"error: {entry.text}"
            messages.append({"role": "tool", "tool_call_id": entry.call_id, "content": content})
    return messages


def _decode_call(call: Any) -> ToolCall:
    raw = call.function.arguments or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCall(id=call.id, name=call.function.name, error=f"not valid JSON ({e.msg})")
    if not isinstance(args, dict):
        return ToolCall(id=call.id, name=call.function.name, error="not a JSON object")
    return ToolCall(id=call.id, name=call.function.name, arguments=args)


def _classify(e: Exception) -> Exception:
    name = type(e).__name__
    status = getattr(e, "status_code", None)
    if name in ("APITimeoutError", "APIConnectionError"):
        return ModelUnavailable(f"model endpoint unreachable: {e}")
    if status == 429:
        return ModelUnavailable("model endpoint throttled (429)", retry_after=_retry_after(e))
    if isinstance(status, int) and status >= 500:
        return ModelUnavailable(f"model endpoint error {status}", retry_after=_retry_after(e))
    if status in (401, 403):
        return ModelRequestRejected(
            f"model endpoint refused the credentials ({status}): check OPENAI_API_KEY"
        )
    if status == 404:
        return ModelRequestRejected(
            "model or endpoint not found (404): check the model name and OPENAI_BASE_URL"
        )
    if status is not None:
        return ModelRequestRejected(f"model endpoint rejected the request ({status}): {e}")
    return e


def _retry_after(e: Exception) -> float | None:
    response = getattr(e, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
