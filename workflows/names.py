"""The workflows' Temporal names and their handlers', as the client side calls them.

The client names a workflow by these strings rather than by its class: the classes'
modules import the activities and the turn's whole machinery, which a CLI process
asking, deciding or listing never runs. `tests/test_imports.py` checks each name
against the definitions the worker registers."""

from __future__ import annotations

__all__ = [
    "ANSWER",
    "ANSWER_LATER",
    "CONVERSATION",
    "DECIDE",
    "DECIDE_LATER",
    "END",
    "EVENT",
    "EVENT_LATER",
    "PROGRESS",
    "SEND",
    "STATE",
    "TURN",
    "WAKE",
    "WAKE_LATER",
]

TURN = "AgentTurn"
"""`AgentTurn`: one turn (`workflows/turn.py`)."""
PROGRESS = "progress"
"""Its query: the steps so far (a `TurnProgress`)."""
ANSWER = "answer"
"""Its update: a person's answer to an MCP server's question (returns the `Question`)."""
ANSWER_LATER = "answer_later"
"""The same as a signal, kept in the history while no worker of its version runs."""
DECIDE = "decide"
"""Its update: a decision on a call awaiting consent (returns an `ApprovalResult`)."""
DECIDE_LATER = "decide_later"
"""The same as a signal."""
EVENT = "event"
"""Its update: an event a `wait_for_event` waits for (returns `Woke`)."""
EVENT_LATER = "event_later"
"""The same as a signal."""
WAKE = "wake"
"""Its update: end the turn's waits early (returns `Woke`)."""
WAKE_LATER = "wake_later"
"""The same as a signal."""

CONVERSATION = "Conversation"
"""`Conversation`: a chat whose messages are each answered by a turn
(`workflows/conversation.py`)."""
SEND = "send"
"""Its update: a message (returns `MessageAccepted`)."""
END = "end"
"""Its signal: end the conversation."""
STATE = "state"
"""Its query: the conversation's state (a `ConversationState`)."""
