"""instructions (local activity): an agent's instructions for one turn, from the turn's
context and the agent's deps (`Agent(instructions=fn)`).

The workflow runs it once, before the turn's first model call, and only for an agent
whose instructions are a function: a plain text costs a turn nothing. Its result is
recorded in the history (a marker), so a turn that is replayed (a worker picked it up
after a crash) reads the text it got, and the function is not called again. Like every
local activity it may run again if its worker dies before the result is recorded,
which is why the function should only read. The fingerprint it returns covers the
text: a turn whose instructions differ from another's shows it.

A fork of such a turn (`client.py rerun`, `replay`) gives it the text its parent's
function gave (`Fork.instructions`): the function is not called, and the fingerprint
of that text with the tools served now tells whether the fork runs the agent its
parent ran.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from temporalio import activity

from durable_agent.activities._tools import turn_tools
from durable_agent.bounds import MAX_INSTRUCTIONS_CHARS
from durable_agent.errors import AgentDefinitionError
from durable_agent.principal import Principal, of_customer
from durable_agent.runtime import secret_refs
from durable_agent.secret import masked
from durable_agent.serving import Agents
from durable_agent.types import DEFAULT_CUSTOMER


class InstructionsInput(BaseModel):
    agent: str = ""
    """The turn's agent (empty: the worker's first)."""
    context: dict[str, Any] = {}
    """The turn's context (`TurnInput.context`)."""
    customer_id: str = ""
    """Whom the turn serves: its secrets are read for them only (`runtime/secret_refs.py`)."""
    tools_version: str = ""
    """The version of the agent's tools the turn started with (its fingerprint covers them)."""
    tool_lists: dict[str, str] = {}
    """Its MCP servers' lists, by hash (`AgentInfo.tool_lists`)."""
    text: str = ""
    """A fork's: the text its parent's function gave, taken as it is (empty: call the
    function)."""
    principal: Principal | None = None
    """Who asks (`TurnInput.asker`), for a function that takes a `principal` parameter."""


class InstructionsOutput(BaseModel):
    text: str
    """The instructions every model call of the turn is sent."""
    fingerprint: str = ""
    """A hash of them and of the turn's tools (`Agent.fingerprint`)."""


class InstructionsActivity:
    def __init__(self, agents: Agents) -> None:
        self._agents = agents

    @activity.defn(name="instructions")
    async def instructions(self, input: InstructionsInput) -> InstructionsOutput:
        served = self._agents.get(input.agent)
        fn = served.dynamic
        text: Any
        secrets: dict[str, Any] = {}
        if input.text:
            text = input.text
        elif fn is None:  # served as text now (a worker of another definition)
            text = served.instructions
        else:
            # The turn's secrets in clear, here only: the text is masked before it is
            # recorded (and sent to every model call).
            context, secrets = await secret_refs.revealed(input.context, input.customer_id)
            if inspect.iscoroutinefunction(fn):
                text = await fn(context, served.deps, **_whom(fn, input))
            else:
                # A plain function (a database read) runs in a thread, so the worker's
                # event loop keeps serving other turns meanwhile.
                text = await asyncio.to_thread(
                    functools.partial(fn, **_whom(fn, input)), context, served.deps
                )
                if inspect.isawaitable(text):
                    text = await text
            text = masked(text, secrets)
        if not isinstance(text, str) or not text.strip():
            raise AgentDefinitionError(
                f"agent {served.name!r}: its instructions function returned "
                f"{_shown(text)}; return the instructions as text"
            )
        if len(text) > MAX_INSTRUCTIONS_CHARS:
            raise AgentDefinitionError(
                f"agent {served.name!r}: its instructions function returned {len(text):,} "
                f"characters, over the {MAX_INSTRUCTIONS_CHARS:,} a turn carries; return "
                "shorter instructions (a large reference is a tool's to read)"
            )
        tools = await turn_tools(served, input.tools_version, input.tool_lists)
        return InstructionsOutput(text=text, fingerprint=served.fingerprint_with(text, tools))


def _whom(fn: Callable[..., Any], input: InstructionsInput) -> dict[str, Principal]:
    """`principal=` for a function that takes it (`def instructions(context, deps, *,
    principal)`); nothing for one of two parameters, as functions were written before."""
    try:
        takes = "principal" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        return {}
    return {"principal": input.principal or of_customer(DEFAULT_CUSTOMER)}


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return "empty text"
    shown = repr(value)
    return f"{shown[:60]}… ({type(value).__name__})" if len(shown) > 60 else shown
