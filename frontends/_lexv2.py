"""The Amazon Lex V2 Lambda wire format: the event Lex sends, the answer it expects.

    event   sessionId, inputTranscript, invocationSource,
            sessionState { intent, sessionAttributes, activeContexts, ... }
    answer  sessionState { dialogAction: {type: Close},
                           intent: <the event's intent, state Fulfilled | Failed>,
                           sessionAttributes: {str: str}, activeContexts }
            messages [{contentType: PlainText, content: <1-1024 characters>}]

`Close` tells Lex the intent is done and nothing more is expected of this turn;
the next utterance is matched anew (and, being free text, lands in the fallback
intent again). In Lex V2 the intent's fulfilment is `sessionState.intent.state`,
not a `fulfillmentState` beside the dialog action as in V1.

Lex replaces the session's attributes with the ones the answer carries, so an
answer always returns all of them, and every value must be a string. Lex may add
fields to its events without a new `messageVersion`; unknown fields are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FALLBACK_INTENT = "FallbackIntent"
MAX_MESSAGE_CHARS = 1000
"""Lex accepts up to 1,024 characters per message; longer text is split."""


class BadEvent(ValueError):
    """The event is not a Lex V2 Lambda event this handler can answer."""


@dataclass(frozen=True)
class LexEvent:
    """What the handler reads from a Lex V2 event."""

    session_id: str
    text: str
    """What the user typed, or what Lex heard (`inputTranscript`)."""
    intent: dict[str, Any] = field(default_factory=lambda: {"name": FALLBACK_INTENT})
    attributes: dict[str, str] = field(default_factory=dict)
    active_contexts: list[Any] | None = None

    @classmethod
    def parse(cls, event: object) -> LexEvent:
        if not isinstance(event, dict):
            raise BadEvent(f"the event is a {type(event).__name__}, not a Lex V2 event object")
        state = event.get("sessionState")
        if not isinstance(state, dict):
            raise BadEvent(
                "the event has no sessionState: not a Lex V2 event (a Lex V1 bot sends "
                "currentIntent and userId); attach this function to a Lex V2 bot alias"
            )
        session_id = event.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            raise BadEvent("the event has no sessionId")
        text = event.get("inputTranscript")
        if not isinstance(text, str):
            raise BadEvent("the event has no inputTranscript")
        return cls(
            session_id=session_id,
            text=text,
            intent=intent_of(event),
            attributes=attributes_of(event),
            active_contexts=state.get("activeContexts"),
        )


def intent_of(event: object) -> dict[str, Any]:
    """The event's intent, echoed back in the answer (Lex expects the one it sent)."""
    state = event.get("sessionState") if isinstance(event, dict) else None
    intent = state.get("intent") if isinstance(state, dict) else None
    if isinstance(intent, dict) and isinstance(intent.get("name"), str):
        return dict(intent)
    return {"name": FALLBACK_INTENT}


def attributes_of(event: object) -> dict[str, str]:
    """The session attributes, kept as strings (Lex sends and accepts nothing else)."""
    state = event.get("sessionState") if isinstance(event, dict) else None
    attrs = state.get("sessionAttributes") if isinstance(state, dict) else None
    if not isinstance(attrs, dict):
        return {}
    return {str(k): str(v) for k, v in attrs.items() if k and v is not None}


def close(
    intent: dict[str, Any],
    attributes: dict[str, str],
    texts: list[str],
    *,
    fulfilled: bool,
    active_contexts: list[Any] | None = None,
) -> dict[str, Any]:
    """A `Close` answer: the intent is done (Fulfilled, or Failed), these messages
    are said, and these attributes are the session's from now on."""
    state: dict[str, Any] = {
        "dialogAction": {"type": "Close"},
        "intent": {**intent, "state": "Fulfilled" if fulfilled else "Failed"},
        "sessionAttributes": {str(k): str(v) for k, v in attributes.items()},
    }
    if active_contexts is not None:
        state["activeContexts"] = active_contexts
    return {
        "sessionState": state,
        "messages": [
            {"contentType": "PlainText", "content": part} for text in texts for part in chunks(text)
        ],
    }


def chunks(text: str, size: int = MAX_MESSAGE_CHARS) -> list[str]:
    """`text` in pieces Lex accepts, split between words where possible."""
    text = text.strip()
    parts = []
    while len(text) > size:
        cut = max(text.rfind(" ", 0, size + 1), text.rfind("\n", 0, size + 1))
        cut = cut if cut > 0 else size
        parts.append(text[:cut].rstrip())
        text = text[cut:].strip()
    return [*parts, text] if text else parts
