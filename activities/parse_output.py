"""parse_output (local activity): a tool's result to compact text for the model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from temporalio import activity

from agent.render import render_result
from agent.types import Observation, ToolCall


class ParseOutputInput(BaseModel):
    call: ToolCall
    result: Any


class ParseOutputOutput(BaseModel):
    observation: Observation


@activity.defn(name="parse_output")
async def parse_output(input: ParseOutputInput) -> ParseOutputOutput:
    return ParseOutputOutput(
        observation=Observation(
            call_id=input.call.id,
            tool=input.call.name,
            ok=True,
            text=render_result(input.result),
        )
    )
