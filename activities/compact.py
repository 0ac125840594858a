"""compact: older exchanges of a long turn's conversation, summarised by its model.

The model-call activity shortens older tool results to keep a conversation within
the model's context window; when even that fills it, its reply says so, and the
turn runs this before its next call (`durable_agent/compaction.py`). The summary
replaces everything between the question and the latest round. It is a model call
like plan and interpret, so it is an activity of its own: retried, recorded, and a
step of the turn's story.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from durable_agent import compaction, model_settings, redact
from durable_agent.activities._common import heartbeating
from durable_agent.activities._conversation import Conversations
from durable_agent.activities._model_call import ModelCaller, settings_ignored
from durable_agent.conversation import UserMessage
from durable_agent.errors import InvalidModelOutput, ModelCannotAnswer
from durable_agent.model import Model, ModelRequest, Reply
from durable_agent.model_settings import ModelSettings
from durable_agent.pricing import format_cost
from durable_agent.principal import Principal
from durable_agent.runtime import metrics
from durable_agent.telemetry import model_span, record_cost, record_reply, record_settings
from durable_agent.transcript import ConversationRef
from durable_agent.types import Usage


class CompactInput(BaseModel):
    model: str
    """The model that writes the summary: the one the turn asks now."""
    agent: str = ""
    conversation: ConversationRef
    """The turn's conversation, as its next model call would have it."""
    question: str
    """The turn's question: never summarised, it opens the compacted conversation."""
    kept: int
    """How many messages at the end stay as they are (the latest round)."""
    consented: list[str] = Field(default_factory=list)
    """Calls a person granted consent to: written into the summary word for word."""
    settings: ModelSettings | None = None
    """The turn's own model settings (`TurnInput.settings`): the summary is a call of
    the turn's model like the others, asked as they are."""
    principal: Principal | None = None
    """Whom the turn serves: the summary counts against their budgets."""
    budget_ok: list[str] = []
    """The budgets a person approved the turn to pass the soft line of (`ModelCallInput`)."""


class CompactOutput(BaseModel):
    text: str
    """What opens the compacted conversation's first kept message: the summary, and the
    calls granted consent with their results."""
    summarised: int
    """How many messages the summary replaces."""
    usage: Usage = Field(default_factory=Usage)
    written_by: str = ""
    """`model`, or `digest` when the model could not write one (`compaction.digest`)."""


class CompactActivity(ModelCaller):
    def __init__(self, *args, conversations: Conversations | None = None, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._conversations = conversations or Conversations(self._transcripts)

    @activity.defn(name="compact")
    async def compact(self, input: CompactInput) -> CompactOutput:
        # Heartbeats from the start, as a model call's (`ModelCaller.call`).
        async with heartbeating():
            return await self._compact(input)

    async def _compact(self, input: CompactInput) -> CompactOutput:
        served = self._agents.get(input.agent)
        policy = served.agent.compaction or compaction.Compaction()
        spec = input.model or served.models.default
        model = await served.models.get(spec)
        messages = await self._conversations.of(input.conversation)
        if not 0 < input.kept < len(messages):
            raise ValueError(
                f"compact: keep {input.kept} of a conversation of {len(messages)} messages"
            )
        older = [
            m
            for m in messages[: len(messages) - input.kept]
            if not (isinstance(m, UserMessage) and m.text == input.question)
        ]
        # As the model last read them: older results shortened, within its window.
        window = compaction.window_of(model, policy) or 128_000
        chars = compaction.summary_chars(policy, window)
        instructions, rendered = compaction.summary_prompt(older, chars)
        room = (window - policy.reply_tokens - compaction.estimate(instructions)) * 2 // 3
        rendered = compaction.shorten(rendered, max(room, 1) * compaction.CHARS_PER_TOKEN)
        request = ModelRequest(
            messages=[UserMessage(text=rendered)],
            instructions=instructions,
            settings=model_settings.merged(served.agent.settings_for(spec), input.settings),
        )
        async with self.budgeted(input.principal, model, spec, request, input.budget_ok) as bill:
            summary, usage, by = await self._summary(model, spec, served.name, request)
            bill.paid(usage.cost_usd if by == "model" else 0.0)  # a digest asked no one
        if not summary.strip():
            summary, by = compaction.digest(rendered, chars), "digest"
        text = compaction.opening(
            compaction.bounded_summary(summary, chars),
            compaction.consented(older, input.consented),
        )
        activity.logger.info("compact: %d messages summarised (%s)", len(older), by)
        return CompactOutput(text=text, summarised=len(older), usage=usage, written_by=by)

    async def _summary(
        self, model: Model, spec: str, agent: str, request: ModelRequest
    ) -> tuple[str, Usage, str]:
        """The model's summary, its usage, and who wrote it. A model that will not
        write one (its window, its filter, a reply that is no summary) leaves it to
        `compaction.digest`: a summary is never a reason for a turn to fail."""
        write = getattr(model, "summarise", None) or model.interpret
        provider, name = model.provider, model.name
        ignored = settings_ignored(model, request)
        with (
            model_span("compact", provider, name) as span,
            metrics.model_call(provider, name, agent) as measured,
        ):
            record_settings(span, request.settings, ignored)
            try:
                reply: Reply = await write(request)
            except (ModelCannotAnswer, InvalidModelOutput) as e:
                activity.logger.warning(
                    "compact: %s wrote no summary: %s", spec, redact.mask(str(e))
                )
                return "", Usage(), "digest"
            record_reply(span, reply)
            cost = self._pricing.price(reply.usage, provider, name, spec)
            usage = reply.usage.model_copy(update={"model_calls": 1, "cost_usd": cost})
            record_cost(span, cost)
            measured.usage, measured.cost = usage, cost
        activity.logger.info("compact: %s, cost %s", spec, format_cost(cost))
        return reply.text, usage, "model"
