"""What `plan` and `interpret` share: one model call over the turn's conversation.

Both activities send the same kind of request (the conversation so far and the
tool specs); they differ only in which of the model's two methods answers it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel
from temporalio import activity

from activities._common import heartbeating, server_suggested_delay
from durable_agent.conversation import Message, calls_so_far, check
from durable_agent.model import ModelCatalog, ModelRequest, Reply
from durable_agent.pricing import Pricing, format_cost
from durable_agent.runtime import metrics, streams
from durable_agent.telemetry import model_span, record_cost, record_reply
from durable_agent.tools import ToolRegistry


class ModelCallInput(BaseModel):
    model: str
    """The turn's model spec; empty means the worker's default."""
    messages: list[Message]
    """The conversation so far: all the model needs, nothing for display."""
    tools: list[str] | None = None
    """A sub-agent's tools (None: the top-level agent's)."""
    instructions: str = ""
    """A sub-agent's system prompt (empty: the default)."""
    stream: bool = False
    """Publish the model's text to the turn's stream as it comes."""


class ModelCaller:
    """Holds the worker's models, tools and prices for the model-call activities."""

    def __init__(
        self, models: ModelCatalog, tools: ToolRegistry, pricing: Pricing | None = None
    ) -> None:
        self._models = models
        self._tools = tools
        # Read at worker start, so a malformed AGENT_MODEL_PRICES stops the worker there.
        self._pricing = pricing if pricing is not None else Pricing.from_env()

    async def call(self, input: ModelCallInput, step: Literal["plan", "interpret"]) -> Reply:
        spec = input.model or self._models.default
        model = self._models.resolve(spec)
        # A broken conversation is a bug of the turn: say so before a provider's 400 does.
        check(input.messages)
        request = ModelRequest(
            messages=input.messages,
            tools=self._tools.specs_for(input.tools),
            instructions=input.instructions,
        )
        async with heartbeating(), streams.model_text(input.stream) as sink:
            with (
                model_span(step, model.provider, model.name) as span,
                metrics.model_call(model.provider, model.name) as measured,
                server_suggested_delay(),
            ):
                # A model that cannot stream writes nothing: its text comes with the
                # step that records it, a moment later, and costs the turn no signal.
                reply = await getattr(model, step)(request, sink)
                record_reply(span, reply)
                # Priced as it happens: the workflow only adds the costs up. One call is
                # counted here, whatever the backend reports.
                cost = self._pricing.price(reply.usage, model.provider, model.name, spec)
                reply.usage = reply.usage.model_copy(update={"model_calls": 1, "cost_usd": cost})
                record_cost(span, cost)
                measured.usage, measured.cost = reply.usage, cost
        activity.logger.info(
            "%s %s: %d in / %d out tokens, cost %s",
            model.provider,
            model.name,
            reply.usage.input_tokens,
            reply.usage.output_tokens,
            format_cost(cost),
        )
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
