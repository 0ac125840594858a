"""Amazon Bedrock through the Converse API, with native tool use.

    --model bedrock:<model-id>      e.g. bedrock:anthropic.claude-3-5-haiku-20241022-v1:0

Credentials and region come from the standard AWS settings the worker sees
(AWS_PROFILE, AWS_REGION, AWS_* keys, instance roles). botocore's own retries
are off (one attempt per activity attempt): throttling, timeouts, 5xx and a
model that is not ready yet become `ModelUnavailable`; bad credentials, access
denied, validation errors and unknown models become `ModelRequestRejected`.

Calls per iteration: two (plan, interpret).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent.backends import _aws
from agent.backends._transcript import AssistantCalls, AssistantText, UserText, transcript
from agent.backends.prompts import INSTRUCTIONS, INTERPRET_HINT
from agent.errors import ModelRequestRejected
from agent.model import Decision, ModelRequest, Plan
from agent.types import ToolCall, Usage


class BedrockConverseModel:
    system = "aws.bedrock"

    def __init__(self, model_id: str, client: Any = None, instructions: str = INSTRUCTIONS):
        if not model_id:
            raise ModelRequestRejected(
                "name the model: --model bedrock:<model-id>, e.g. "
                "bedrock:anthropic.claude-3-5-haiku-20241022-v1:0"
            )
        self.name = model_id
        self._instructions = instructions
        self._client = client or _aws.client("bedrock-runtime", "bedrock")

    async def plan(self, request: ModelRequest) -> Plan:
        text, calls, usage, _ = await self._converse(request, self._instructions)
        return Plan(calls=calls, text=text, usage=usage)

    async def interpret(self, request: ModelRequest) -> Decision:
        text, calls, usage, _ = await self._converse(
            request, f"{self._instructions}\n\n{INTERPRET_HINT}"
        )
        if calls:
            wanted = ", ".join(c.name for c in calls)
            return Decision(final=False, text=text or f"call {wanted}", usage=usage)
        return Decision(final=True, text=text, usage=usage)

    async def _converse(
        self, request: ModelRequest, system: str
    ) -> tuple[str, list[ToolCall], Usage, str]:
        kwargs: dict[str, Any] = {
            "modelId": self.name,
            "system": [{"text": system}],
            "messages": to_messages(request),
        }
        if request.tools:
            kwargs["toolConfig"] = {
                "tools": [
                    {
                        "toolSpec": {
                            "name": t.name,
                            "description": t.description,
                            "inputSchema": {"json": t.parameters},
                        }
                    }
                    for t in request.tools
                ]
            }
        try:
            # boto3 is synchronous: keep the worker's event loop free meanwhile.
            resp = await asyncio.to_thread(self._client.converse, **kwargs)
        except Exception as e:
            raise _aws.classify(e, "Bedrock", "model id") from e

        stop = resp.get("stopReason", "")
        blocks = resp.get("output", {}).get("message", {}).get("content", [])
        text = "".join(b["text"] for b in blocks if "text" in b).strip()
        calls = [
            ToolCall(id=b["toolUse"]["toolUseId"], name=b["toolUse"]["name"], arguments=args)
            if isinstance(args := b["toolUse"].get("input"), dict)
            else ToolCall(
                id=b["toolUse"]["toolUseId"], name=b["toolUse"]["name"], error="not a JSON object"
            )
            for b in blocks
            if "toolUse" in b
        ]
        if stop == "max_tokens" and not calls:
            text = (text + " …").strip()  # cut short: still the best answer there is
        if stop == "guardrail_intervened":
            calls = []  # the guardrail's message is the answer; run nothing it blocked
            text = text or "Sorry, I cannot answer that question."
        u = resp.get("usage", {})
        usage = Usage(
            model_calls=1,
            input_tokens=u.get("inputTokens", 0),
            output_tokens=u.get("outputTokens", 0),
        )
        return text, calls, usage, stop


def to_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The turn as Converse messages: roles alternate, tool results ride in user turns."""
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for entry in transcript(request):
        if isinstance(entry, UserText):
            add("user", {"text": entry.text})
        elif isinstance(entry, AssistantText):
            add("assistant", {"text": entry.text})
        elif isinstance(entry, AssistantCalls):
            for c in entry.calls:
                add(
                    "assistant",
                    {"toolUse": {"toolUseId": c.id, "name": c.name, "input": c.arguments}},
                )
        else:
            add(
                "user",
                {
                    "toolResult": {
                        "toolUseId": entry.call_id,
                        "content": [{"text": entry.text}],
                        "status": "success" if entry.ok else "error",
                    }
                },
            )
    if messages[-1]["role"] == "assistant":  # Converse wants the user to speak last
        add("user", {"text": "Continue."})
    return messages
