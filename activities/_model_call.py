"""What `plan` and `interpret` share: one model call over the turn's conversation.

Both activities send the same kind of request (the conversation so far and the
tool specs); they differ only in which of the model's two methods answers it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from activities._common import heartbeating, server_suggested_delay
from agent.conversation import Message, calls_so_far, check
from agent.model import ModelCatalog, ModelRequest, Reply
from agent.telemetry import model_span, record_reply
from agent.tools import ToolRegistry


class ModelCallInput(BaseModel):
    model: str
    """The turn's model spec; empty means the worker's default."""
    messages: list[Message]
    """The conversation so far: all the model needs, nothing for display."""


class ModelCaller:
    """Holds the worker's models and tools for the model-call activities."""

    def __init__(self, models: ModelCatalog, tools: ToolRegistry) -> None:
        self._models = models
        self._tools = tools

    async def call(self, input: ModelCallInput, step: Literal["plan", "interpret"]) -> Reply:
        model = self._models.resolve(input.model)
        # A broken conversation is a bug of the turn: say so before a provider's 400 does.
        check(input.messages)
        request = ModelRequest(messages=input.messages, tools=self._tools.specs)
        async with heartbeating():
            with (
                model_span(step, model.provider, model.name) as span,
                server_suggested_delay(),
            ):
                reply = await getattr(model, step)(request)
                record_reply(span, reply)
        reply.usage.model_calls = 1  # counted here, whatever the backend reports
        _name_calls(reply, input.messages)
        return reply


def _name_calls(reply: Reply, messages: list[Message]) -> None:
    """Every call needs an id unique in the conversation: its result refers to it.
    Providers always send one; prompt-based and offline models may not."""
    n = calls_so_far(messages)
    seen: set[str] = set()
    for m in messages:
        seen.update(c.id for c in getattr(m, "calls", ()))
    for call in reply.calls:
        n += 1
        if not call.id or call.id in seen:
            call.id = f"call_{n}"
        seen.add(call.id)
