"""parse (local activity): validate the model's calls against the tool registry,
and screen the valid ones with the agent's tool-input shields.

Fast, so it runs as a local activity (with the shields' timeout and retries, as
parse_output, which screens results, does). It never fails on bad calls: an
unknown tool or invalid arguments come back as a rejection, whose text is the
call's result for the model. It also says which valid calls must wait for a
person's consent (the tool's declaration, then the worker's `ApprovalPolicy`; a
waiver covers a write built from the customer's own words, once a turn and never in
a fork). Deciding that here, where its result is recorded, means a turn replays
with the decisions it ran with, whatever code replays it (no `workflow.patched`).
Screening here rather than in a shield activity of its own costs a round of tools
one local activity (a history event and a workflow activation) less.

A model call made as a local activity parses its reply's calls itself, with what
the turn would have given parse (`ModelCallInput.parse`, `parse_calls`): a step is
then one local activity, not two. This activity stays for the rest: a turn whose
model calls are activities, histories recorded before, a parse that failed there.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from durable_agent.activities._conversation import Conversations
from durable_agent.activities._tools import turn_tools
from durable_agent.activities.calls import AS_ASKED, ValidCall
from durable_agent.activities.shield import screen
from durable_agent.approval import (
    IN_A_FORK,
    MAX_UNASKED_WRITES,
    REPEATED,
    SUBAGENT_IN_A_FORK,
    ApprovalPolicy,
    digest,
    too_many_unasked,
)
from durable_agent.bounds import MAX_RESULTS_IN_FLIGHT_CHARS
from durable_agent.conversation import Message
from durable_agent.errors import InvalidCall
from durable_agent.provenance import Source, traced
from durable_agent.rewind import schema_digest
from durable_agent.serving import Agents
from durable_agent.shields import ShieldRequest, Verdict
from durable_agent.subagents import SubAgent, view_name
from durable_agent.tools import Tool
from durable_agent.transcript import ConversationRef, context_of, results_of
from durable_agent.types import ToolCall

AHEAD_TIMEOUT_S = 10.0
"""How long a model call gives the parse of its reply (`parse_calls`): what the turn
gives its parse activity (`PARSE_TIMEOUT`). Past it, the turn parses the calls."""


class Rejection(BaseModel):
    call: ToolCall
    error: str


class ParseInput(BaseModel):
    calls: list[ToolCall]
    """The calls to parse (in a model call's `parse`: none; its reply's are parsed)."""
    tools: list[str] | None = None
    """The tools this agent was offered (None: all its top-level tools)."""
    agent: str = ""
    tools_version: str = ""
    """The version of the agent's tools the turn started with (`AgentInfo.tools_version`)."""
    tool_lists: dict[str, str] = {}
    """Its MCP servers' lists, by hash (`AgentInfo.tool_lists`)."""
    said: list[str] = Field(default_factory=list)
    """The customer's own words (this question, the conversation's earlier ones): a
    write whose arguments are not all in them needs consent, waived or not."""
    sources: list[Source] = Field(default_factory=list)
    """What else the model read (earlier answers; tool results unless `conversation`
    says where they are), to say where such an argument came from."""
    context: list[str] = Field(default_factory=list)
    """What a call may draw on (the question, tool results, the conversation), for the
    tool-input shields; read from `conversation` when that is given."""
    customer_id: str = ""
    conversation: ConversationRef | None = None
    """Where the tool results and the rest of the conversation are, when the input
    does not carry them: a local activity's input is not recorded in the history, but
    a payload store writes it, so an input carrying every result so far would make a
    turn of N steps store O(N²) bytes."""
    fork: bool = False
    """The turn is a fork (`client.py rerun` / `replay`): every write asks for consent,
    waived or not (the turn answers the ones its record served without asking)."""
    unasked: list[str] = Field(default_factory=list)
    """The writes this turn ran without asking so far (`approval.digest`, at most
    `MAX_UNASKED_WRITES`): a waived write that repeats one asks."""


class ParseOutput(BaseModel):
    valid: list[ValidCall]
    rejected: list[Rejection] = Field(default_factory=list)
    verdicts: list[list[Verdict]] = Field(default_factory=list)
    """Per valid call, the tool-input shields' verdicts (none: no shields there)."""

    def restored(self, calls: list[ToolCall]) -> ParseOutput:
        """With every valid call's `call` given, from `calls` (the round's, as the
        model made them) where the result left it out."""
        valid = [
            vc.model_copy(update={"call": calls[vc.at]}) if vc.call == AS_ASKED else vc
            for vc in self.valid
        ]
        return self.model_copy(update={"valid": valid})


class ParseActivity:
    def __init__(self, agents: Agents, conversations: Conversations | None = None) -> None:
        self._agents = agents
        self._conversations = conversations or Conversations()

    @activity.defn(name="parse")
    async def parse(self, input: ParseInput) -> ParseOutput:
        return await parse_calls(self._agents, input, _Read(input, self._conversations))


async def parse_calls(
    agents: Agents, input: ParseInput, read: _Read | list[Message]
) -> ParseOutput:
    """Validate and screen `input.calls`: the parse activity's work, and a local model
    call's on its reply (`read`: the conversation that call had, which `input.conversation`
    names)."""
    if not isinstance(read, _Read):
        read = _Read(input, None, read)
    served = agents.get(input.agent)
    tools = await turn_tools(served, input.tools_version, input.tool_lists)
    valid, rejected, normalised_calls = [], [], []
    unasked = _Unasked(input.unasked)
    # Quick reads run as local activities, whose results the turn's next workflow
    # task records all at once: only as many as fit one task's budget run so.
    quick_left = MAX_RESULTS_IN_FLIGHT_CHARS
    for at, call in enumerate(input.calls):
        try:
            args = tools.validate(call, tools.offered(input.tools))
        except InvalidCall as e:
            rejected.append(Rejection(call=call, error=str(e)))
            continue
        tool = tools[call.name]
        as_json = args.model_dump(mode="json") if isinstance(args, BaseModel) else args
        normalised = call.model_copy(update={"arguments": as_json})
        foreign = []
        if tool.side_effects:
            # Nothing said (no question recorded): nothing is theirs, all asks. The
            # roles: what the agent's tools call the things they take, which a value
            # the customer labelled ("order 123456") may not be used outside of.
            sources = await read.sources()
            foreign = traced(normalised, tool.parameters, input.said, sources, tools.roles)
        normalised_calls.append(normalised)
        limit = served.result_limit(call.name, tools)
        quick = tool.quick and limit <= quick_left
        if quick:
            quick_left -= limit
        valid.append(
            ValidCall(
                call=AS_ASKED if normalised == call else normalised,
                at=at,
                timeout=tool.timeout,
                max_attempts=tool.max_attempts,
                side_effects=tool.side_effects,
                quick=quick,
                result_chars=limit,
                approval=unasked.why(
                    normalised, tool, _why_approval(tool, served.approvals, foreign, input.fork)
                ),
                approvers=served.approvals.approvers_of(tool.name),
                return_direct=tool.return_direct,
                agent=_answered_by(tool, served.name),
                checked=tool.check is not None,
                tool_schema=schema_digest(tool.parameters),
                in_workflow=tool.in_workflow,
            )
        )
    # Only shields that are there read the context (the conversation, maybe rebuilt).
    context = await read.context() if served.shields.at("tool_input") else input.context
    requests = [
        ShieldRequest(
            position="tool_input",
            text=call.render(),
            call=call,
            context=context,
            customer_id=input.customer_id,
        )
        for call in normalised_calls
    ]
    verdicts = await screen(served, requests)
    return ParseOutput(valid=valid, rejected=rejected, verdicts=verdicts)


class _Read:
    """What parse reads of the conversation, read once, and only if it is needed."""

    def __init__(
        self,
        input: ParseInput,
        conversations: Conversations | None,
        messages: list[Message] | None = None,
    ) -> None:
        """`messages`: the conversation `input.conversation` names, already at hand
        (a model call's own); else `conversations` reads it."""
        self._input = input
        self._conversations = conversations or Conversations()
        self._messages: list[Message] | None = messages

    async def _conversation(self, ref: ConversationRef) -> list[Message]:
        if self._messages is None:
            self._messages = await self._conversations.of(ref)
        return self._messages

    async def sources(self) -> list[Source]:
        ref = self._input.conversation
        if ref is None:
            return self._input.sources
        return [*results_of(await self._conversation(ref)), *self._input.sources]

    async def context(self) -> list[str]:
        ref = self._input.conversation
        if ref is None:
            return self._input.context
        return context_of(await self._conversation(ref))


def _answered_by(tool: Tool, owner: str) -> SubAgent | None:
    """Who answers an agent tool's calls, by served name (a view is `<owner>.<tool>`)."""
    if tool.agent is None:
        return None
    if tool.agent.agent:
        return tool.agent
    return SubAgent(
        agent=view_name(owner, tool.name),
        model=tool.agent.model,
        shares_context=tool.agent.shares_context,
    )


def _why_approval(
    tool: Tool, approvals: ApprovalPolicy, foreign: list[str], fork: bool = False
) -> str:
    """Why the call needs consent (empty: it does not). A write with arguments the
    customer did not write needs it even where writes are waived, and so does any
    write in a fork, and a sub-agent's call there (its turn may write)."""
    why = _why_asked(tool, approvals, foreign)
    in_a_fork = IN_A_FORK if tool.side_effects else SUBAGENT_IN_A_FORK if tool.agent else ""
    if fork and in_a_fork:
        return f"{why}; {in_a_fork}" if why else in_a_fork
    return why


def _why_asked(tool: Tool, approvals: ApprovalPolicy, foreign: list[str]) -> str:
    source = f"; not the customer's words: {', '.join(foreign)}" if foreign else ""
    if not approvals.needs_approval(tool.name, tool.needs_approval):
        if not foreign:
            return ""
        return f"it writes, and its arguments are not all the customer's own{source}"
    if tool.side_effects:
        what = " ".join(tool.description.split()).split(". ")[0].rstrip(".")
        return f"it writes: {what}{source}"
    return f"this worker asks for consent before every {tool.name} call"


class _Unasked:
    """The writes that run without asking: once each per turn. The turn says which ran
    in its earlier rounds; a copy of one of them, or of one before it in this round
    (which runs first), asks instead."""

    def __init__(self, ran: list[str]) -> None:
        self.ran = set(ran)

    def why(self, call: ToolCall, tool: Tool, why: str) -> str:
        if why or not tool.side_effects or tool.repeats:
            return why
        key = digest(call)
        if key in self.ran:
            return REPEATED
        if len(self.ran) >= MAX_UNASKED_WRITES:
            return too_many_unasked(MAX_UNASKED_WRITES)
        self.ran.add(key)
        return ""
