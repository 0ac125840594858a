"""The tools a turn's step uses: the version its turn started with (MCP servers).

An agent whose MCP servers may change their tool lists is served in versions
(`ServedAgent.tools_at`): each turn's first step records the version it is offered
(`AgentInfo.tools_version`) and the hash of what each server listed for it
(`AgentInfo.tool_lists`), and keeps the lists in the tool-list store
(`durable_agent/runtime/tool_lists.py`). Every later step names both. A worker that
saw that version serves it from memory. One that never did (started since the list
changed, or taking the turn over from a worker that died) finds each list by its
hash, in its own listings or in the store, and serves that version through its own
connections, so every step of a turn uses the tools it started with, whichever
worker runs it. A list it cannot find, or one the store holds changed, ends the
step with `ToolListUnavailable`, one line naming the server and the store.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from temporalio import activity

from durable_agent import redact
from durable_agent.errors import ToolListUnavailable
from durable_agent.runtime.storage import STORE_ENV
from durable_agent.serving import ServedAgent
from durable_agent.tools import ToolRegistry

log = logging.getLogger("durable_agent.activities")

FIRST_STEP = "shield"
"""The activity whose result records the turn's agent, and so its tools' version."""


async def turn_tools(
    served: ServedAgent, version: str, lists: Mapping[str, str] | None = None
) -> ToolRegistry:
    """The tools of `version` (a turn's `tools_version`; empty: the agent's only ones),
    whose MCP servers listed the lists of hashes `lists` (`AgentInfo.tool_lists`)."""
    if served.knows(version):
        return served.tools_at(version)
    if lists:
        return await _by_hash(served, version, lists)
    # A turn recorded before its lists were kept by hash: they are in its history.
    try:
        recorded = await _recorded(version)
    except Exception as e:  # noqa: BLE001 - the record is a help, not a must
        log.warning(
            "tools version %s: could not read the turn's record: %s", version, redact.mask(str(e))
        )
        recorded = None
    if recorded is not None:
        tools = served.recall(version, recorded)
        if tools is not None:
            return tools
    return served.tools_at(version)  # what the servers offer now, with a warning


async def _by_hash(served: ServedAgent, version: str, lists: Mapping[str, str]) -> ToolRegistry:
    recorded: dict[str, Any] = {}
    for server, digest in lists.items():
        found = served.listed_as(digest) or await served.tool_lists.get(digest)
        if found is None:
            raise ToolListUnavailable(
                f"agent {served.name!r}: the tool list of MCP server {server!r} this turn "
                f"started with ({digest[:12]}) is not in the tool-list store "
                f"({served.tool_lists}), and the server lists other tools to this worker "
                f"now: give every worker the same store ({STORE_ENV}=s3://BUCKET or "
                "local:/a/shared/folder)"
            )
        recorded[server] = found
    tools = served.recall(version, recorded)
    if tools is None:
        raise ToolListUnavailable(
            f"agent {served.name!r}: this worker cannot serve the tools this turn started "
            f"with (version {version}, MCP servers {', '.join(lists)}): its agent or its "
            "servers are not the ones that listed them; serve the turn with the agent's "
            "definition and servers that started it"
        )
    return tools


async def _recorded(version: str) -> dict[str, Any] | None:
    """What a turn recorded before lists were kept by hash (`AgentInfo.offered`), if it
    was `version`: read from its history, where the first step's result is a marker."""
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
