"""Amazon Bedrock through the Converse API, with native tool use.

    --model bedrock:<model-id>      e.g. bedrock:anthropic.claude-3-5-haiku-20241022-v1:0
    AGENT_BEDROCK_CACHE_POINT=1     prompt caching: a cache point after the system
                                    prompt and after the tools (models that support it)

Credentials and region come from the standard AWS settings the worker sees
(AWS_PROFILE, AWS_REGION, AWS_* keys, instance roles). Every request is the
canonical conversation (`agent.conversation`) as Converse messages: the system
prompt in `system`, the same on every call; then user and assistant messages
alternating, the model's `toolUse` blocks as it sent them, and each call's
`toolResult` (with its `toolUseId`) in the user message right after; the
conversation always ends with a user message. `plan` and `interpret` send the
same kind of request.

botocore's own retries are off (one attempt per activity attempt): throttling,
timeouts, 5xx and a model that is not ready yet become `ModelUnavailable`; bad
credentials, access denied, validation errors and unknown models become
`ModelRequestRejected`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from agent.backends import _aws
from agent.backends.prompts import INSTRUCTIONS
from agent.conversation import AssistantMessage, UserMessage
from agent.errors import ModelRequestRejected, ModelUnavailable
from agent.model import ModelRequest, Reply
from agent.stream import TextSink
from agent.types import ToolCall, Usage

CACHE_POINT = {"cachePoint": {"type": "default"}}
GUARDRAIL_ANSWER = "Sorry, I can't help with that."


class BedrockConverseModel:
    provider = "aws.bedrock"

    def __init__(
        self,
        model_id: str,
        client: Any = None,
        instructions: str = INSTRUCTIONS,
        cache_point: bool | None = None,
    ) -> None:
        if not model_id:
            raise ModelRequestRejected(
                "name the model: --model bedrock:<model-id>, e.g. "
                "bedrock:anthropic.claude-3-5-haiku-20241022-v1:0"
            )
        self.name = model_id
        self._instructions = instructions
        if cache_point is None:
            cache_point = os.environ.get("AGENT_BEDROCK_CACHE_POINT", "").strip() in ("1", "true")
        self._cache_point = cache_point
        self._client = client or _aws.client("bedrock-runtime", "bedrock")

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        kwargs = self.request(request)
        try:
            # boto3 is synchronous: keep the worker's event loop free meanwhile.
            resp = await asyncio.to_thread(self._client.converse, **kwargs)
        except Exception as e:
            raise _aws.classify(e, "Bedrock", "model id") from e
        return _reply(resp)

    # A chat model answers "what next, given the results" from the same conversation.
    interpret = plan

    def request(self, request: ModelRequest) -> dict[str, Any]:
        """The `converse` keyword arguments for a request."""
        system: list[dict[str, Any]] = [{"text": request.instructions or self._instructions}]
        if self._cache_point:
            system.append(CACHE_POINT)
        kwargs: dict[str, Any] = {
            "modelId": self.name,
            "system": system,
            "messages": to_messages(request),
        }
        if request.tools:
            tools: list[dict[str, Any]] = [
                {
                    "toolSpec": {
                        "name": t.name,
                        "description": t.description,
                        "inputSchema": {"json": t.parameters},
                    }
                }
                for t in request.tools
            ]
            if self._cache_point:
                tools.append(CACHE_POINT)
            kwargs["toolConfig"] = {"tools": tools}
        return kwargs


def _reply(resp: dict[str, Any]) -> Reply:
    stop = resp.get("stopReason", "")
    blocks = resp.get("output", {}).get("message", {}).get("content", [])
    text = "".join(b["text"] for b in blocks if "text" in b)
    calls = [_decode_call(b["toolUse"]) for b in blocks if "toolUse" in b]
    if stop == "guardrail_intervened":
        calls = []  # the guardrail's message is the answer; run nothing it blocked
        text = text.strip() or GUARDRAIL_ANSWER
    if not calls and not text.strip():
        raise ModelUnavailable(f"the model returned an empty message (stopReason {stop!r})")
    if stop == "max_tokens" and not calls:
        text = text.rstrip() + " …"  # cut short: still the best answer there is
    u = resp.get("usage", {})
    cached = u.get("cacheReadInputTokens", 0) or 0
    usage = Usage(
        model_calls=1,
        # Converse counts cache reads and writes apart from `inputTokens`.
        input_tokens=u.get("inputTokens", 0) + cached + (u.get("cacheWriteInputTokens", 0) or 0),
        output_tokens=u.get("outputTokens", 0),
        cached_input_tokens=cached,
    )
    return Reply(text=text if calls else text.strip(), calls=calls, usage=usage, finish_reason=stop)


def _decode_call(use: dict[str, Any]) -> ToolCall:
    args = use.get("input")
    if isinstance(args, dict):
        return ToolCall(id=use["toolUseId"], name=use["name"], arguments=args)
    return ToolCall(id=use["toolUseId"], name=use["name"], error="not a JSON object")


def to_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Converse messages: a call's results ride in one user message."""
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for m in request.messages:
        if isinstance(m, UserMessage):
            add("user", [{"text": m.text}])
        elif isinstance(m, AssistantMessage):
            # Converse refuses blank text blocks; a message of calls alone has none.
            blocks: list[dict[str, Any]] = [{"text": m.text}] if m.text.strip() else []
            blocks += [
                {"toolUse": {"toolUseId": c.id, "name": c.name, "input": c.arguments}}
                for c in m.calls
            ]
            add("assistant", blocks)
        else:
            add(
                "user",
                [
                    {
                        "toolResult": {
                            "toolUseId": m.call_id,
                            "content": [{"text": m.text}],
                            "status": "success" if m.ok else "error",
                        }
                    }
                ],
            )
    return messages
