"""parse (local activity): validate the model's calls against the tool registry,
and screen the valid ones with the agent's tool-input shields.

Fast, so it runs as a local activity (with the shields' timeout and retries, as
parse_output, which screens results, does). It never fails on bad calls: an
unknown tool or invalid arguments come back as a rejection, whose text is the
call's result for the model. It also says which valid calls must wait for a
person's consent (the tool's declaration, then the worker's `ApprovalPolicy`).
Screening here rather than in a shield activity of its own costs a round of tools
one local activity (a history event and a workflow activation) less.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import activity

from durable_agent.activities._tools import turn_tools
from durable_agent.activities.shield import screen
from durable_agent.approval import ApprovalPolicy
from durable_agent.errors import InvalidCall
from durable_agent.provenance import Source, roles_of, traced
from durable_agent.serving import Agents
from durable_agent.shields import ShieldRequest, Verdict
from durable_agent.subagents import SubAgent, view_name
from durable_agent.tools import Tool
from durable_agent.types import ToolCall

AS_ASKED = ToolCall(id="", name="")
"""A valid call's `call` when it stands as the model made it (see `ValidCall.call`)."""


class ValidCall(BaseModel):
    call: ToolCall = AS_ASKED
    """The call with its arguments as validated (normalised) by the tool's model;
    `AS_ASKED` when that is the round's `at`-th call as the model made it, which the
    result then leaves out (the turn has it): `ParseOutput.restored` puts it back."""
    at: int = 0
    timeout: timedelta
    max_attempts: int
    side_effects: bool = False
    quick: bool = False
    """A quick read: dispatched as a local activity."""
    approval: str = ""
    """Why the call needs a person's consent before it runs; empty when it does not."""
    return_direct: bool = False
    """Its result is the turn's answer (no interpret)."""
    checked: bool = False
    """The tool checks a call before consent is asked (`Tool.check`)."""
    agent: SubAgent | None = None
    """An agent tool: the turn runs the sub-agent's own turn as a child workflow."""


class Rejection(BaseModel):
    call: ToolCall
    error: str


class ParseInput(BaseModel):
    calls: list[ToolCall]
    tools: list[str] | None = None
    """The tools this agent was offered (None: all its top-level tools)."""
    agent: str = ""
    tools_version: str = ""
    """The version of the agent's tools the turn started with (`AgentInfo.tools_version`)."""
    said: list[str] = Field(default_factory=list)
    """The customer's own words (this question, the conversation's earlier ones): a
    write whose arguments are not all in them needs consent, waived or not."""
    sources: list[Source] = Field(default_factory=list)
    """What else the model read (tool results, earlier answers), to say where such an
    argument came from. A local activity's input is not recorded: this costs no history."""
    context: list[str] = Field(default_factory=list)
    """What a call may draw on (the question, tool results, the conversation), for the
    tool-input shields."""
    customer_id: str = ""


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
    def __init__(self, agents: Agents) -> None:
        self._agents = agents

    @activity.defn(name="parse")
    async def parse(self, input: ParseInput) -> ParseOutput:
        served = self._agents.get(input.agent)
        tools = await turn_tools(served, input.tools_version)
        valid, rejected, normalised_calls = [], [], []
        roles: frozenset[str] | None = None
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
                # What the agent's tools call the things they take: the roles a value
                # the customer labelled ("order 123456") may not be used outside of.
                if roles is None:
                    roles = roles_of(t.spec.parameters for t in tools.tools.values())
                # Nothing said (no question recorded): nothing is theirs, all asks.
                foreign = traced(normalised, tool.spec.parameters, input.said, input.sources, roles)
            normalised_calls.append(normalised)
            valid.append(
                ValidCall(
                    call=AS_ASKED if normalised == call else normalised,
                    at=at,
                    timeout=tool.timeout,
                    max_attempts=tool.max_attempts,
                    side_effects=tool.side_effects,
                    quick=tool.quick,
                    approval=_why_approval(tool, served.approvals, foreign),
                    return_direct=tool.return_direct,
                    agent=_answered_by(tool, served.name),
                    checked=tool.check is not None,
                )
            )
        requests = [
            ShieldRequest(
                position="tool_input",
                text=call.render(),
                call=call,
                context=input.context,
                customer_id=input.customer_id,
            )
            for call in normalised_calls
        ]
        verdicts = await screen(served, requests)
        return ParseOutput(valid=valid, rejected=rejected, verdicts=verdicts)


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


def _why_approval(tool: Tool, approvals: ApprovalPolicy, foreign: list[str]) -> str:
    """Why the call needs consent (empty: it does not). A write with arguments the
    customer did not write needs it even where writes are waived."""
    source = f"; not the customer's words: {', '.join(foreign)}" if foreign else ""
    if not approvals.needs_approval(tool.name, tool.needs_approval):
        if not foreign:
            return ""
        return f"it writes, and its arguments are not all the customer's own{source}"
    if tool.side_effects:
        what = " ".join(tool.description.split()).split(". ")[0].rstrip(".")
        return f"it writes: {what}{source}"
    return f"this worker asks for consent before every {tool.name} call"
