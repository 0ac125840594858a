"""Temporal workflows: one turn of the agent is one `AgentTurn`; a chat is a
`Conversation` whose messages are each answered by an `AgentTurn` child.

The workflows' classes load on first use: the client side reads the light modules
beside them (`search`, `carry`, `policies`) and names the workflows by their Temporal
names, so a CLI process never loads the turn's definition and, through it, the
activities."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from temporalio import workflow

if TYPE_CHECKING or workflow.unsafe.in_sandbox():
    # Temporal's sandbox imports this package afresh for each workflow run: there it
    # loads the definitions as it always did (the conversation's module, which takes the
    # turn's from the worker, so the classes a turn makes are the ones the rest of the
    # worker knows; a turn's module of the sandbox's own made a fork's `Served` a class
    # its carry refused).
    from durable_agent.workflows.conversation import Conversation, UnversionedConversation
    from durable_agent.workflows.turn import AgentTurn

__all__ = ["AgentTurn", "Conversation", "UnversionedConversation"]


def __getattr__(name: str) -> Any:
    # Import statements, not `importlib`: inside Temporal's sandbox they go through its
    # importer, as the eager imports did.
    if name == "AgentTurn":
        from durable_agent.workflows import turn

        return turn.AgentTurn
    if name in ("Conversation", "UnversionedConversation"):
        from durable_agent.workflows import conversation

        return getattr(conversation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
