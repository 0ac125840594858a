"""parse_output (local activity): a tool's result to compact text for the model.

`dispatch` does this itself once its tool has answered (`screened`); a turn runs
parse_output for a result whose dispatch could not (a shield that failed there, to be
retried here without running the tool again) or that comes from the record (a fork).

The text is also screened by the worker's tool-output shields: a result that
carries instruction-like text stays data. It is marked as such for the model,
and the turn asks a person before any write it plans afterwards.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from temporalio import activity

from durable_agent.activities._tools import turn_tools
from durable_agent.activities.shield import judge
from durable_agent.conversation import BY_REFERENCE_CHARS, digest_of
from durable_agent.render import render_result
from durable_agent.serving import Agents, ServedAgent
from durable_agent.shields import DATA_MARK, ShieldRequest, Verdict
from durable_agent.tools import ToolRegistry
from durable_agent.transcript import RESULTS
from durable_agent.types import Observation, ToolCall


class ParseOutputInput(BaseModel):
    call: ToolCall
    result: Any
    customer_id: str = ""
    agent: str = ""
    tools_version: str = ""
    """The version of the agent's tools the turn started with (`AgentInfo.tools_version`)."""
    tool_lists: dict[str, str] = {}
    """Its MCP servers' lists, by hash (`AgentInfo.tool_lists`)."""


class ParseOutputOutput(BaseModel):
    observation: Observation
    verdicts: list[Verdict] = []
    """The tool-output shields' verdicts on the result (none: no shields)."""


class ParseOutputActivity:
    def __init__(self, agents: Agents) -> None:
        self._agents = agents

    @activity.defn(name="parse_output")
    async def parse_output(self, input: ParseOutputInput) -> ParseOutputOutput:
        served = self._agents.get(input.agent)
        tools = await turn_tools(served, input.tools_version, input.tool_lists)
        return await screened(served, tools, input.call, input.result, input.customer_id)


async def screened(
    served: ServedAgent,
    tools: ToolRegistry,
    call: ToolCall,
    result: Any,
    customer_id: str,
    rendered: bool = False,
) -> ParseOutputOutput:
    """The result as the model reads it, within the tool's limit, after the tool-output
    shields (`dispatch` runs this once its tool has answered, so most results need no
    `parse_output` of their own). `rendered`: `result` is that text already."""
    text = result if rendered else render_result(result, served.result_limit(call.name, tools))
    request = ShieldRequest(position="tool_output", text=text, call=call, customer_id=customer_id)
    verdicts = await judge(served.shields, request)
    if any(not v.allowed for v in verdicts):
        text = f"{DATA_MARK} {text}"
    observation = Observation(call_id=call.id, tool=call.name, ok=True, text=text)
    if len(text) >= BY_REFERENCE_CHARS:
        # At hand for the turn's next model call, which gets it by reference.
        RESULTS.add(activity.info().workflow_id or "", digest_of(text), text)
    return ParseOutputOutput(observation=observation, verdicts=verdicts)
