"""Agents as tools: a tool whose call is answered by another agent's own turn.

Two ways to make one. Another agent, whole (its own instructions, tools, model,
shields and dependencies; the worker serves it with the agent that uses it):

    policy_expert = Agent(name="policy-expert", instructions="...", tools=[search_policies])
    support = Agent(name="support", tools=[order_status, policy_expert.as_tool()])

Or a narrower view of the same agent: some of its tools under other instructions,
sharing its dependencies and guards:

    expert = agent_tool(
        "policy_expert",
        "Answers questions about the store's policies: returns, refunds, shipping, ...",
        tools=["search_policies"],
        instructions="You are the store's policy expert. Answer from the policy documents.",
    )

The model calls it like any tool (`policy_expert(question=...)`). The turn does
not dispatch it as an activity: it runs an `AgentTurn` child workflow (under
Relationships in the Web UI) for the sub-agent, with the customer of the parent
turn and what is left of the parent's step, time and token budget; the child's
answer is the call's result and its usage counts towards the parent's. A crash
during the child loses nothing: it is a workflow of its own.

Tools meant only for sub-agents are kept from the agent that owns them with
`@tool(top_level=False)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from durable_agent.errors import ToolError
from durable_agent.tools import Tool, ToolContext
from durable_agent.types import MAX_QUESTION_CHARS

if TYPE_CHECKING:
    from durable_agent.agents import Agent


class SubAgent(BaseModel):
    """Who answers an agent tool's calls (it travels in `parse`'s output: names only)."""

    agent: str = ""
    """The served agent that answers (its turn names it); empty: a view of the agent
    that owns the tool, below."""
    tools: list[str] = Field(default_factory=list)
    """A view's tools (by name, from its agent's)."""
    model: str = ""
    """Its model spec; empty: the parent turn's."""
    instructions: str = ""
    """A view's system prompt for chat models (turns started before agents were named
    carried it; new turns resolve it by the sub-agent's name)."""
    shares_context: bool = True
    """Its turns get the parent turn's context (`TurnInput.context`)."""


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
    share_context: bool = True,
) -> Tool:
    """A tool answered by a view of its own agent: only `tools`, and `instructions`
    (empty: the agent's own) and `model` (empty: the turn's). `share_context=False`:
    its turns do not get the parent turn's context."""
    if not tools:
        raise ValueError(f"agent tool {name}: give the sub-agent at least one tool")
    return Tool(
        name=name,
        description=description,
        args_model=AgentQuestion,
        fn=_runs_as_a_child,
        examples=tuple(examples),
        agent=SubAgent(
            tools=list(tools),
            model=model,
            instructions=instructions,
            shares_context=share_context,
        ),
    )


def delegate_to(agent: Agent, name: str, description: str = "", share_context: bool = True) -> Tool:
    """`agent` as a tool named `name` (see `Agent.as_tool`)."""
    about = description or agent.description or f"Ask {agent.shown_name} a question."
    return Tool(
        name=name,
        description=about,
        args_model=AgentQuestion,
        fn=_runs_as_a_child,
        examples=tuple(agent.examples),
        agent=SubAgent(agent=agent.name, shares_context=share_context),
        delegate=agent,
    )


def view_name(owner: str, tool: str) -> str:
    """The served name of an `agent_tool` view: `<owner>.<tool>`."""
    return f"{owner}.{tool}"
