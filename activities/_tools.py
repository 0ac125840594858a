"""The tools a turn's step uses: the version its turn started with (MCP servers).

An agent whose MCP servers may change their tool lists is served in versions
(`ServedAgent.tools_at`): each turn's first step records the version it is offered
(`AgentInfo.tools_version`) and what each server listed for it (`AgentInfo.offered`),
in the shield's result, once. A worker that saw that version serves it from memory.
One that never did — started since the list changed, or after the worker that began
the turn died — reads the turn's record from its history (once per version, then
kept) and serves that version through its own connections, so every step of a turn
uses the tools it started with, whichever worker runs it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from temporalio import activity

from durable_agent.serving import ServedAgent
from durable_agent.tools import ToolRegistry

log = logging.getLogger("durable_agent.activities")

FIRST_STEP = "shield"
"""The activity whose result records the turn's agent, and so its tools' version."""


async def turn_tools(served: ServedAgent, version: str) -> ToolRegistry:
    """The tools of `version` (a turn's `tools_version`; empty: the agent's only ones)."""
    if served.knows(version):
        return served.tools_at(version)
    try:
        recorded = await _recorded(version)
    except Exception as e:  # noqa: BLE001 - the record is a help, not a must
        log.warning("tools version %s: could not read the turn's record: %s", version, e)
        recorded = None
    if recorded is not None:
        tools = served.recall(version, recorded)
        if tools is not None:
            return tools
    return served.tools_at(version)  # what the servers offer now, with a warning


async def _recorded(version: str) -> dict[str, Any] | None:
    """What the running turn recorded of its tools (`AgentInfo.offered`), if it was
    `version`: read from its history, where the first step's result is a marker."""
    from durable_agent.activities.shield import ShieldOutput

    info = activity.info()
    if not info.workflow_id:
        return None
    client = activity.client()
    handle = client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
    async for event in handle.fetch_history_events():
        marker = event.marker_recorded_event_attributes
        if not event.HasField("marker_recorded_event_attributes") or "result" not in marker.details:
            continue
        data = marker.details["data"].payloads
        if not data or json.loads(data[0].data).get("activity_type") != FIRST_STEP:
            continue
        [output] = await client.data_converter.decode(
            list(marker.details["result"].payloads), [ShieldOutput]
        )
        agent = output.agent
        if agent is not None and agent.tools_version:
            return dict(agent.offered) if agent.tools_version == version else None
    return None
