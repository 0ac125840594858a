"""sample: an MCP server's sampling request, answered by the turn's model.

A model call like plan and interpret (`durable_agent/sampling.py`): the same models,
settings and prices, so it is an activity of its own, retried, recorded, falling back
as theirs do, and a step of the turn's story. It sends only what the server asked
(its messages and system prompt, no tools, not the turn's conversation), asking for
at most the tokens the turn allows.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from durable_agent import model_settings
from durable_agent.activities._common import heartbeating, server_suggested_delay
from durable_agent.activities._model_call import ModelCaller, settings_ignored
from durable_agent.conversation import AssistantMessage, Message, UserMessage
from durable_agent.model import Model, ModelRequest, Reply
from durable_agent.model_settings import ModelSettings
from durable_agent.pricing import format_cost
from durable_agent.principal import Principal
from durable_agent.runtime import metrics
from durable_agent.sampling import MAX_REPLY_CHARS, Request
from durable_agent.telemetry import model_span, record_cost, record_reply, record_settings
from durable_agent.types import Usage


class SampleInput(BaseModel):
    model: str
    """The model asked: the one the turn asks now (`_model_call` sets it per fallback)."""
    agent: str = ""
    request: Request
    max_tokens: int
    """The reply's limit: the server's, within `sampling.MAX_TOKENS` and the turn's cap."""
    settings: ModelSettings | None = None
    """The turn's own model settings: the request is asked as the turn's calls are."""
    principal: Principal | None = None
    """Whom the turn serves: the sample counts against their budgets, as the turn's calls."""
    budget_ok: list[str] = []
    """The budgets a person approved the turn to pass the soft line of (`ModelCallInput`)."""


class SampleOutput(BaseModel):
    text: str
    model: str
    stop_reason: str = "endTurn"
    usage: Usage = Field(default_factory=Usage)


class SampleActivity(ModelCaller):
    @activity.defn(name="sample")
    async def sample(self, input: SampleInput) -> SampleOutput:
        # Heartbeats from the start, as a model call's (`ModelCaller.call`).
        async with heartbeating():
            return await self._sample(input)

    async def _sample(self, input: SampleInput) -> SampleOutput:
        served = self._agents.get(input.agent)
        spec = input.model or served.models.default
        model = await served.models.get(spec)
        asked = input.request
        messages: list[Message] = [
            UserMessage(text=m.text) if m.role == "user" else AssistantMessage(text=m.text)
            for m in asked.messages
        ]
        own = ModelSettings(
            max_tokens=input.max_tokens,
            temperature=asked.temperature,
            stop=asked.stop_sequences or None,
        )
        settings = model_settings.merged(served.agent.settings_for(spec), input.settings, own)
        request = ModelRequest(
            messages=messages, instructions=asked.system_prompt, settings=settings
        )
        ignored = settings_ignored(model, request)
        async with self.budgeted(input.principal, model, spec, request, input.budget_ok) as bill:
            reply, usage, cost = await self._asked(model, spec, served.name, request, ignored)
            bill.paid(cost)
        activity.logger.info(
            "sample for %s: %s, %d out tokens, cost %s",
            asked.server,
            spec,
            usage.output_tokens,
            format_cost(cost),
        )
        # A reply that calls tools is none a server can take: its text only (no tools
        # were offered, so a model seldom does).
        return SampleOutput(text=reply.text[:MAX_REPLY_CHARS], model=spec, usage=usage)

    async def _asked(
        self, model: Model, spec: str, agent: str, request: ModelRequest, ignored: dict[str, str]
    ) -> tuple[Reply, Usage, float | None]:
        with (
            model_span("sample", model.provider, model.name) as span,
            metrics.model_call(model.provider, model.name, agent) as measured,
            server_suggested_delay(),
        ):
            record_settings(span, request.settings, ignored)
            reply = await model.interpret(request)
            record_reply(span, reply)
            cost = self._pricing.price(reply.usage, model.provider, model.name, spec)
            usage = reply.usage.model_copy(update={"model_calls": 1, "cost_usd": cost})
            record_cost(span, cost)
            measured.usage, measured.cost = usage, cost
        return reply, usage, cost
