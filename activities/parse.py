"""parse (local activity): validate the model's calls against the tool registry.

Pure and fast, so it runs as a local activity. It never fails on bad calls: an
unknown tool or invalid arguments come back as a rejection whose text the
model sees on its next plan.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity

from agent.errors import InvalidCall
from agent.tools import ToolRegistry
from agent.types import ToolCall


class ValidCall(BaseModel):
    call: ToolCall
    """The call with its arguments as validated (normalised) by the tool's model."""
    timeout: timedelta
    max_attempts: int
    side_effects: bool = False


class Rejection(BaseModel):
    call: ToolCall
    error: str


class ParseInput(BaseModel):
    calls: list[ToolCall]


class ParseOutput(BaseModel):
    valid: list[ValidCall]
    rejected: list[Rejection]


class ParseActivity:
    def __init__(self, tools: ToolRegistry) -> None:
        self._tools = tools

    @activity.defn(name="parse")
    async def parse(self, input: ParseInput) -> ParseOutput:
        valid, rejected = [], []
        for call in input.calls:
            try:
                args = self._tools.validate(call)
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
                )
            )
        return ParseOutput(valid=valid, rejected=rejected)
