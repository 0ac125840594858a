"""parse (local activity): validate the model's calls against the tool registry.

Pure and fast, so it runs as a local activity. It never fails on bad calls: an
unknown tool or invalid arguments come back as a rejection, whose text is the
call's result for the model. It also says which valid calls must wait for a
person's consent (the tool's declaration, then the worker's `ApprovalPolicy`).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity

from durable_agent.approval import ApprovalPolicy
from durable_agent.errors import InvalidCall
from durable_agent.subagents import SubAgent
from durable_agent.tools import Tool, ToolRegistry
from durable_agent.types import ToolCall


class ValidCall(BaseModel):
    call: ToolCall
    """The call with its arguments as validated (normalised) by the tool's model."""
    timeout: timedelta
    max_attempts: int
    side_effects: bool = False
    quick: bool = False
    """A quick read: dispatched as a local activity."""
    approval: str = ""
    """Why the call needs a person's consent before it runs; empty when it does not."""
    return_direct: bool = False
    """Its result is the turn's answer (no interpret)."""
    agent: SubAgent | None = None
    """An agent tool: the turn runs the sub-agent's own turn as a child workflow."""


class Rejection(BaseModel):
    call: ToolCall
    error: str


class ParseInput(BaseModel):
    calls: list[ToolCall]
    tools: list[str] | None = None
    """The tools this agent was offered (None: the top-level agent's)."""


class ParseOutput(BaseModel):
    valid: list[ValidCall]
    rejected: list[Rejection]


class ParseActivity:
    def __init__(self, tools: ToolRegistry, approvals: ApprovalPolicy | None = None) -> None:
        self._tools = tools
        self._approvals = approvals or ApprovalPolicy()

    @activity.defn(name="parse")
    async def parse(self, input: ParseInput) -> ParseOutput:
        valid, rejected = [], []
        for call in input.calls:
            try:
                args = self._tools.validate(call, self._tools.offered(input.tools))
            except InvalidCall as e:
                rejected.append(Rejection(call=call, error=str(e)))
                continue
            tool = self._tools[call.name]
            normalised = call.model_copy(update={"arguments": args.model_dump(mode="json")})
            valid.append(
                ValidCall(
                    call=normalised,
                    timeout=tool.timeout,
                    max_attempts=tool.max_attempts,
                    side_effects=tool.side_effects,
                    quick=tool.quick,
                    approval=self._why_approval(tool),
                    return_direct=tool.return_direct,
                    agent=tool.agent,
                )
            )
        return ParseOutput(valid=valid, rejected=rejected)

    def _why_approval(self, tool: Tool) -> str:
        if not self._approvals.needs_approval(tool.name, tool.needs_approval):
            return ""
        if tool.side_effects:
            what = " ".join(tool.description.split()).split(". ")[0].rstrip(".")
            return f"it writes: {what}"
        return f"this worker asks for consent before every {tool.name} call"
