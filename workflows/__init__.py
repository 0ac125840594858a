"""Temporal workflows: one turn of the agent is one `AgentTurn`; a chat is a
`Conversation` whose messages are each answered by an `AgentTurn` child."""

from durable_agent.workflows.conversation import Conversation, UnversionedConversation
from durable_agent.workflows.turn import AgentTurn

__all__ = ["AgentTurn", "Conversation", "UnversionedConversation"]
