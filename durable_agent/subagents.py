"""Agents as tools: a tool whose call is answered by another agent's own turn.

    policy_expert = agent_tool(
        "policy_expert",
        "Answers questions about the store's policies: returns, refunds, shipping, ...",
        tools=["search_policies"],
        instructions="You are the store's policy expert. Answer from the policy documents.",
    )

The model calls it like any tool (`policy_expert(question=...)`). The turn does
not dispatch it as an activity: it runs an `AgentTurn` child workflow (under
Relationships in the Web UI) with only the named tools, its own instructions
and model, the customer of the parent turn, and what is left of the parent's
step, time and token budget; the child's answer is the call's result and its
usage counts towards the parent's. A crash during the child loses nothing: it
is a workflow of its own.

Tools named only by agent tools can be kept from the top-level agent with
`@tool(top_level=False)` (or `ToolRegistry.for_subagents`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from durable_agent.errors import ToolError
from durable_agent.tools import Tool, ToolContext
from durable_agent.types import MAX_QUESTION_CHARS


class SubAgent(BaseModel):
    """Who answers an agent tool's calls."""

    tools: list[str]
    """The tools it may call (by name, from the worker's registry)."""
    model: str = ""
    """Its model spec; empty: the parent turn's."""
    instructions: str = ""
    """Its system prompt for chat models; empty: the default one."""


class AgentQuestion(BaseModel):
    question: str = Field(
        min_length=3,
        max_length=MAX_QUESTION_CHARS,
        description="the question for the expert, complete in itself (it sees nothing else)",
    )


def _runs_as_a_child(args: AgentQuestion, ctx: ToolContext[object]) -> None:
    raise ToolError("an agent tool runs as a child workflow of the turn, never as an activity")


def agent_tool(
    name: str,
    description: str,
    *,
    tools: Sequence[str],
    model: str = "",
    instructions: str = "",
    examples: Sequence[str] = (),
) -> Tool:
    """A tool answered by a sub-agent with `tools`, `model` and `instructions`."""
    if not tools:
        raise ValueError(f"agent tool {name}: give the sub-agent at least one tool")
    return Tool(
        name=name,
        description=description,
        args_model=AgentQuestion,
        fn=_runs_as_a_child,
        examples=tuple(examples),
        agent=SubAgent(tools=list(tools), model=model, instructions=instructions),
    )
