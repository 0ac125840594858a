"""parse_output (local activity): a tool's result to compact text for the model.

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
from durable_agent.render import render_result
from durable_agent.serving import Agents
from durable_agent.shields import DATA_MARK, ShieldRequest, Verdict
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
        limit = served.result_limit(input.call.name, tools)
        text = render_result(input.result, limit)
        request = ShieldRequest(
            position="tool_output", text=text, call=input.call, customer_id=input.customer_id
        )
        verdicts = await judge(served.shields, request)
        if any(not v.allowed for v in verdicts):
            text = f"{DATA_MARK} {text}"
        observation = Observation(call_id=input.call.id, tool=input.call.name, ok=True, text=text)
        return ParseOutputOutput(observation=observation, verdicts=verdicts)
