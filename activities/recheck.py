"""recheck (local activity): the calls a fork's record holds, against its agent's tools
as served now.

A fork on the agent as served now (`client.py rerun --current`, `Fork.current`) runs
it first, once: for each call the original ran, whether its tool is still offered,
the hash of that tool's schema now, and whether the call's arguments still validate.
The workflow compares that with what the original recorded (`rewind.changes`), says
each change in a step of its own, and stops where its conversation holds a call the
agent can no longer take. A read of the worker's definitions only: nothing runs.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from durable_agent.activities._tools import turn_tools
from durable_agent.errors import InvalidCall
from durable_agent.rewind import ToolNow, schema_digest
from durable_agent.serving import Agents
from durable_agent.types import ToolCall


class RecheckInput(BaseModel):
    calls: list[ToolCall]
    """The record's calls, as they ran (`Fork.calls`)."""
    tools: list[str] | None = None
    """The tools the fork's agent is offered (None: all its top-level tools)."""
    agent: str = ""
    tools_version: str = ""
    """The version of the agent's tools the fork started with (`AgentInfo.tools_version`)."""
    tool_lists: dict[str, str] = {}
    """Its MCP servers' lists, by hash (`AgentInfo.tool_lists`)."""


class RecheckOutput(BaseModel):
    calls: list[ToolNow]
    """Per call of the input, in order, how the agent takes it now."""


class RecheckActivity:
    def __init__(self, agents: Agents) -> None:
        self._agents = agents

    @activity.defn(name="recheck")
    async def recheck(self, input: RecheckInput) -> RecheckOutput:
        served = self._agents.get(input.agent)
        tools = await turn_tools(served, input.tools_version, input.tool_lists)
        offered = set(tools.offered(input.tools))
        taken = []
        for call in input.calls:
            if call.name not in offered:
                taken.append(ToolNow(offered=False))
                continue
            schema = schema_digest(tools[call.name].parameters)
            try:
                args = tools.validate(call, input.tools)
            except InvalidCall as e:
                taken.append(ToolNow(tool_schema=schema, error=str(e)))
                continue
            # As parse makes a call's arguments: a fork's calls are matched so.
            as_json = args.model_dump(mode="json") if isinstance(args, BaseModel) else args
            changed = as_json if as_json != call.arguments else None
            taken.append(ToolNow(tool_schema=schema, arguments=changed))
        return RecheckOutput(calls=taken)
