"""What `plan` and `interpret` share: one model call over the turn's conversation.

Both activities send the same kind of request (the conversation so far and the
tool specs); they differ only in which of the model's two methods answers it. Their
input carries only what is new since the turn's previous call; the activity puts the
conversation together (`durable_agent/transcript.py`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Collection
from typing import Literal, Protocol

from pydantic import BaseModel
from temporalio import activity

from durable_agent import compaction, model_settings, outputs
from durable_agent.activities._common import heartbeating, server_suggested_delay, within
from durable_agent.activities._conversation import Sent, recorded_conversation, turn_key, whole
from durable_agent.activities._tools import turn_tools
from durable_agent.activities.parse import AHEAD_TIMEOUT_S, ParseInput, ParseOutput, parse_calls
from durable_agent.bounds import bounded_reply
from durable_agent.context_sources import KeepsByReference
from durable_agent.conversation import (
    AssistantMessage,
    Message,
    UserMessage,
    calls_so_far,
    check,
)
from durable_agent.errors import ModelRequestRejected
from durable_agent.model import Model, ModelRequest, Reply
from durable_agent.model_settings import ModelSettings
from durable_agent.pricing import Pricing, format_cost
from durable_agent.principal import Principal
from durable_agent.runtime import attachments as stored_attachments
from durable_agent.runtime import metrics, streams
from durable_agent.serving import Agents
from durable_agent.telemetry import model_span, record_cost, record_reply, record_settings
from durable_agent.transcript import Delta, Transcripts
from durable_agent.types import OutputSpec, Usage

OUTPUT_RESERVE = 4_096
"""The output tokens a call's reservation counts when its settings set no `max_tokens`
(the most the Anthropic backend asks for by default)."""


class Spending(Protocol):
    """Budgets kept outside the turn (`durable_agent.budgets.Ledgers`): before a model
    call, `reserve` holds its worst case against every budget of the person it serves
    (or raises `BudgetExceeded`); after it, `settle` replaces the hold with its cost."""

    def applies(self, who: Principal) -> bool: ...

    async def reserve(
        self, who: Principal, worst: float | None, model: str, ok: Collection[str] = ()
    ) -> object: ...

    async def settle(self, hold: object, cost: float | None) -> None: ...


class Bill:
    """What a budgeted call cost, set by the caller once the reply is priced."""

    def __init__(self) -> None:
        self.cost: float | None = None
        self.answered = False

    def paid(self, cost: float | None) -> None:
        self.cost, self.answered = cost, True


class ModelCallInput(BaseModel):
    model: str
    """The turn's model spec; empty means the worker's default."""
    messages: list[Message]
    """The conversation from message `since` on: all the model needs, nothing for
    display."""
    tools: list[str] | None = None
    """Only these of the agent's tools (turns recorded before agents were named)."""
    instructions: str = ""
    """Other instructions than the agent's (turns recorded before agents were named)."""
    stream: bool = False
    """Publish the model's text to the turn's stream as it comes."""
    agent: str = ""
    """The turn's agent (empty: the worker's first): its instructions, tools, models."""
    tools_version: str = ""
    """The version of the agent's tools the turn started with (`AgentInfo.tools_version`)."""
    tool_lists: dict[str, str] = {}
    """Its MCP servers' lists, by hash (`AgentInfo.tool_lists`)."""
    since: int | None = None
    """How many messages of the conversation the turn's previous model call had come
    before `messages` (`durable_agent.transcript.Delta`). None: `messages` is the whole
    conversation (turns recorded before calls carried what is new)."""
    call: int = 0
    """This call's number in its turn (1, 2, ...), across the turn's runs."""
    turn: str = ""
    """The turn's first run id: the conversation goes on across the turn's runs (empty:
    recorded before turns continued as new; the conversation is this run's)."""
    output: OutputSpec | None = None
    """The turn's own output type; None: its agent's, if it has one (`outputs`)."""
    settings: ModelSettings | None = None
    """The turn's own model settings, over its agent's and its model's (`TurnInput.settings`)."""
    principal: Principal | None = None
    """Whom the turn serves: whose budgets the call is counted against (None: recorded
    before budgets; counted against none)."""
    budget_ok: list[str] = []
    """The budgets (ledger ids) a person approved this turn to pass the soft line of."""
    parse: ParseInput | None = None
    """Parse the reply's calls here, as the turn's parse activity would with this input
    (its calls aside: the reply's), and return them with the reply: a step is one local
    activity, not two. None: the turn parses them (a call made as an activity, whose
    input the history keeps; a reply the turn will not parse; histories from before)."""

    @property
    def delta(self) -> Delta:
        return Delta(call=self.call, since=self.since, messages=self.messages)

    def sent(self) -> Sent | None:
        """What this call was sent, for its result to record when it runs as a local
        activity (whose input the history does not keep); None otherwise."""
        if not activity.info().is_local:
            return None
        return Sent(messages=self.messages, since=self.since, call=self.call)


class ModelCaller:
    """Holds the worker's agents, prices and the turns' conversations for the
    model-call activities."""

    def __init__(
        self,
        agents: Agents,
        pricing: Pricing | None = None,
        transcripts: Transcripts | None = None,
        spending: Spending | None = None,
    ) -> None:
        self._agents = agents
        self._spending = spending
        # Read at worker start, so a malformed AGENT_MODEL_PRICES stops the worker there.
        self._pricing = pricing if pricing is not None else Pricing.from_env()
        self._transcripts = transcripts if transcripts is not None else Transcripts()

    @contextlib.asynccontextmanager
    async def budgeted(
        self,
        who: Principal | None,
        model: Model,
        spec: str,
        request: ModelRequest,
        ok: Collection[str] = (),
    ) -> AsyncIterator[Bill]:
        """Every model call of a turn (plan, interpret, a summary, a server's sample) goes
        through here: with budgets set, its worst case (the prompt's estimated input and
        the reply's whole output limit, at the model's price) is reserved first, and the
        reservation settled with its cost after (released when the call failed). `ok`:
        the budgets whose soft line a person let the turn pass."""
        bill = Bill()
        if self._spending is None or who is None or not self._spending.applies(who):
            yield bill
            return
        out = (request.settings.max_tokens if request.settings else None) or OUTPUT_RESERVE
        prompt = sum(compaction.message_tokens(m) for m in request.messages)
        prompt += compaction.overhead(request.instructions, request.tools)
        worst = self._pricing.price(
            Usage(input_tokens=prompt, output_tokens=out), model.provider, model.name, spec
        )
        hold = await self._spending.reserve(who, worst, spec, ok)
        try:
            yield bill
        finally:
            # A call that failed is settled at nothing; one whose cost nobody knows keeps
            # its worst case (`Ledgers.settle`).
            await self._spending.settle(hold, bill.cost if bill.answered else 0.0)

    def spec(self, input: ModelCallInput) -> str:
        """The model spec this call uses: the turn's, else its agent's default."""
        return input.model or self._agents.get(input.agent).models.default

    async def call(
        self, input: ModelCallInput, step: Literal["plan", "interpret"]
    ) -> tuple[Reply, ParseOutput | None]:
        """The model's reply, and its calls parsed when the input asks (`parse`)."""
        # Heartbeats from the first moment: all that comes before the request (a
        # backend built on first use, the conversation read back from the turn's
        # record, an MCP server's tool list) takes time, and an attempt silent past
        # HEARTBEAT_TIMEOUT is run again while it goes on, sending its request twice.
        async with heartbeating():
            reply, messages = await self._call(input, step)
            return reply, await self._parsed(input, reply, messages)

    async def _parsed(
        self, input: ModelCallInput, reply: Reply, messages: list[Message]
    ) -> ParseOutput | None:
        """The reply's calls parsed (`parse.parse_calls`), over the conversation this
        call had: what `input.parse.conversation` names. None when not asked, when
        there is nothing the turn will parse (no calls; a value to repair), or when
        parse failed: the turn then runs its parse activity, with its retries, failing
        closed. A failure here never fails the call: its reply is kept, and not asked
        for again."""
        if input.parse is None or not reply.calls or reply.output_error:
            return None
        asked = input.parse.model_copy(update={"calls": reply.calls})
        try:
            return await within(parse_calls(self._agents, asked, messages), AHEAD_TIMEOUT_S)
        except Exception as e:
            activity.logger.warning(
                "parse with the model call failed (%s); the turn parses the calls", type(e).__name__
            )
            return None

    async def _call(
        self, input: ModelCallInput, step: Literal["plan", "interpret"]
    ) -> tuple[Reply, list[Message]]:
        served = self._agents.get(input.agent)
        spec = input.model or served.models.default
        model = await served.models.get(spec)
        messages = await self._conversation(input)
        # A broken conversation is a bug of the turn: say so before a provider's 400 does.
        check(messages)
        tools = await turn_tools(served, input.tools_version, input.tool_lists)
        request = ModelRequest(
            messages=await _resolved(served.sources, messages, input.principal),
            tools=tools.specs_for(input.tools),
            instructions=input.instructions or served.instructions,
            settings=model_settings.merged(served.agent.settings_for(spec), input.settings),
        )
        request.files = await _attached(messages)
        output = _output(input.output) if input.output else served.output
        how = outputs.mode(getattr(model, "native_output", False), output) if output else "tool"
        if output is not None and how == "native":
            strict = outputs.strict_schema(output.spec)
            request.output = output.spec.model_copy(update={"json_schema": strict})
        elif output is not None:
            request.tools = [*request.tools, output.tool()]
            request.final_tool = outputs.OUTPUT_TOOL
        full = _fit(request, model, served.agent.compaction)
        ignored = settings_ignored(model, request)
        async with (
            streams.model_text(input.stream) as sink,
            self.budgeted(input.principal, model, spec, request, input.budget_ok) as bill,
        ):
            with (
                model_span(step, model.provider, model.name) as span,
                metrics.model_call(model.provider, model.name, served.name) as measured,
                server_suggested_delay(),
            ):
                record_settings(span, request.settings, ignored)
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
                bill.paid(cost)
        activity.logger.info(
            "%s %s: %d in / %d out tokens, cost %s",
            model.provider,
            model.name,
            reply.usage.input_tokens,
            reply.usage.output_tokens,
            format_cost(cost),
        )
        _name_calls(reply, messages)
        reply.context_full = full and bool(reply.calls)
        reply.settings, reply.settings_ignored = request.settings, list(ignored)
        # What the model said enters the turn's history here: within its bounds.
        reply = bounded_reply(reply, served.agent.max_calls_per_round)
        if output is not None:
            _read_output(reply, output, how)
        return reply, messages

    async def _conversation(self, input: ModelCallInput) -> list[Message]:
        """The whole conversation: the previous call's, as this worker kept it or as
        the run's record says, with what this call's input brings."""
        info = activity.info()
        if info.is_local:
            # The calls before this one, by number: a local activity has no scheduled
            # event to stop at (its turn's calls are all local, recorded by markers).
            rebuild = functools.partial(recorded_conversation, through=input.call - 1)
        else:
            rebuild = functools.partial(recorded_conversation, before=info.activity_id)
        # The tool results it carries by reference, whole (`conversation.by_reference`).
        messages = await whole(input.messages)
        delta = Delta(call=input.call, since=input.since, messages=messages)
        return await self._transcripts.assemble(turn_key(input.turn), delta, rebuild)


async def _resolved(
    sources: Collection[object], messages: list[Message], asker: Principal | None
) -> list[Message]:
    """The conversation as the model reads it: what a context source recorded by
    reference (a memory, so that forgetting it leaves its words in no turn's history),
    read back here, on every call (`context_sources.KeepsByReference`: few sources keep
    anything deletable)."""
    for source in sources:
        if isinstance(source, KeepsByReference):
            messages = await source.resolved(messages, asker)
    return messages


async def _attached(messages: list[Message]) -> dict[str, bytes]:
    """The bytes of the conversation's attachments, read from the payload store here, in
    the activity: they never travel through the workflow. (The turn's input shields held
    them to the agent's limits: `activities/shield.py`.)"""
    asked = [a for m in messages if isinstance(m, UserMessage) for a in m.attachments]
    return await stored_attachments.load(asked) if asked else {}


def settings_ignored(model: Model, request: ModelRequest) -> dict[str, str]:
    """What of the request's settings the backend does not send, and why; the worker
    says so once per backend and setting (not once per call)."""
    ignored = model_settings.unsupported(model, request)
    if new := model_settings.first_reports(model.provider, model.name, ignored):
        activity.logger.warning(model_settings.ignored_line(model.provider, model.name, new))
    return ignored


def _fit(request: ModelRequest, model: object, policy: compaction.Compaction | None) -> bool:
    """The request's conversation within the model's window (older results shortened:
    `compaction.fit`); whether the turn should summarise before its next call."""
    window = compaction.window_of(model, policy)
    if policy is None or window is None:
        return False
    fixed = compaction.overhead(request.instructions, request.tools)
    fitted = compaction.fit(request.messages, policy, window, fixed)
    if fitted.shortened:
        activity.logger.info(
            "context: %d tool result(s) shortened; about %d of %d tokens",
            fitted.shortened,
            fitted.tokens,
            window,
        )
    request.messages = fitted.messages
    return fitted.full


@functools.lru_cache(maxsize=64)
def _output_of(spec_json: str) -> outputs.Output:
    return outputs.Output.of_spec(OutputSpec.model_validate_json(spec_json))


def _output(spec: OutputSpec) -> outputs.Output:
    """A turn's own output type, checked by its JSON schema (the worker has no type)."""
    try:
        return _output_of(spec.model_dump_json())
    except TypeError as e:
        raise ModelRequestRejected(f"the turn's output type: {e}") from None


def _read_output(reply: Reply, output: outputs.Output, how: outputs.Mode) -> None:
    """The value the reply gives, validated, into `reply.output`; or why it does not fit,
    into `reply.output_error`. A valid value ends the turn: calls made with it are dropped."""
    read = outputs.read(reply.text, reply.calls, output, how)
    if read.value is not None:
        reply.output, reply.calls = read.value, []
    reply.output_error = read.error


def _name_calls(reply: Reply, messages: list[Message]) -> None:
    """Every call needs an id unique in the conversation: its result refers to it.
    Providers always send one, but a model may leave some out or send one twice, or
    reuse one of an earlier round; such a call gets a fresh `call_<n>`. The ids the
    model did give come first: an id-less call never takes one a later call names."""
    earlier = {c.id for m in messages if isinstance(m, AssistantMessage) for c in m.calls}
    taken = earlier | {c.id for c in reply.calls if c.id}
    used = set(earlier)
    n = calls_so_far(messages)
    for call in reply.calls:
        n += 1
        if call.id and call.id not in used:
            used.add(call.id)
            continue
        while f"call_{n}" in taken or f"call_{n}" in used:
            n += 1
        call.id = f"call_{n}"
        used.add(call.id)
