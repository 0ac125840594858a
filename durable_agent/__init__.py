"""durable-agent: tool-using LLM agents whose every turn is a durable Temporal workflow.

The public API:

    Agent, Refusals            define an agent (`durable_agent.agents`)
    tool, Tool, ToolContext    its tools (`durable_agent.tools`)
    agent_tool                 a narrower view of an agent, as a tool (`durable_agent.subagents`)
    ApprovalPolicy             who needs consent, and who may give it (`durable_agent.approval`)
    Principal                  who asks or decides: tenant, user, roles (`durable_agent.principal`)
    Compaction                 how a long turn stays within the model's context window
                               (`durable_agent.compaction`)
    ShieldSettings             which shields run where (`durable_agent.shields`)
    TurnLimits                 steps, time, tokens, cost and approval timeout of a turn
    AttachmentLimits           the files and images an agent's questions may carry
                               (`durable_agent.attachments`)
    ModelSettings              how its models are asked: temperature, output limit, stop
                               sequences, ... (`durable_agent.model_settings`)
    Settings                   a worker's settings (`durable_agent.settings`)
    AgentPlugin, build_worker  serve agents in a Temporal worker (`durable_agent.plugin`)
    AgentClient, TurnResult    ask agents, follow and decide their turns from your own
                               code (`durable_agent.client`)
    NotFound, NotAllowed, ToolError, ToolUnavailable   what tools raise
    Secret                     a context value kept out of histories: tools read it in
                               clear, nothing records it (`durable_agent.secret`)

Everything else is the machinery behind them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from temporalio import workflow

# The workflows are `durable_agent.workflows`: Temporal's sandbox, importing one afresh,
# imports this package first. What it imports here is the host's own (as the workflows'
# imports are), so a value the sandboxed workflow makes is of the classes the rest of
# the worker knows. Outside a sandbox this is a plain import.
with workflow.unsafe.imports_passed_through():
    from durable_agent.agents import Agent, Refusals
    from durable_agent.approval import ApprovalPolicy
    from durable_agent.attachments import AttachmentLimits
    from durable_agent.compaction import Compaction
    from durable_agent.errors import NotAllowed, NotFound, ToolError, ToolUnavailable
    from durable_agent.model_settings import ModelSettings
    from durable_agent.principal import Principal
    from durable_agent.secret import Secret
    from durable_agent.settings import Settings
    from durable_agent.shields import ShieldSettings
    from durable_agent.subagents import agent_tool
    from durable_agent.tools import Tool, ToolContext, ToolRegistry, tool
    from durable_agent.types import TurnLimits

if TYPE_CHECKING:
    from durable_agent.client import AgentClient, TurnResult
    from durable_agent.plugin import AgentPlugin, build_worker

__all__ = [
    "Agent",
    "AgentClient",
    "AgentPlugin",
    "ApprovalPolicy",
    "AttachmentLimits",
    "Compaction",
    "ModelSettings",
    "NotAllowed",
    "NotFound",
    "Principal",
    "Refusals",
    "Secret",
    "Settings",
    "ShieldSettings",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolUnavailable",
    "TurnLimits",
    "TurnResult",
    "agent_tool",
    "build_worker",
    "tool",
]


def __getattr__(name: str) -> Any:
    # The worker and client sides import the workflows, which import this package:
    # loaded on first use, so `from durable_agent import Agent` stays light.
    if name in ("AgentPlugin", "build_worker"):
        from durable_agent import plugin

        return getattr(plugin, name)
    if name in ("AgentClient", "TurnResult"):
        from durable_agent import client

        return getattr(client, name)
    raise AttributeError(f"module 'durable_agent' has no attribute {name!r}")
