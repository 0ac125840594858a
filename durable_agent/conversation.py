"""The turn's conversation with the model: one provider-neutral shape.

    user       the customer's words
    assistant  the model's own message, as it sent it: its text and/or tool calls, and
               what only its provider reads (`Opaque`: Anthropic's signed thinking)
    tool       one result per call of the assistant message before it, in call order

Every model call of a turn sends the same system prompt and this conversation,
grown only by what really happened: the model's messages and the tools' results.
Nothing else is ever injected, so a provider sees a tool result (never an
instruction) last, a prompt cache keeps hitting, and strict chat templates
(Llama 3, Mistral, Gemma; Bedrock Converse) accept every request. `check` holds
the rules all of them share; the backends map messages 1:1 to their API.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from durable_agent.attachments import Attachment
from durable_agent.errors import InvalidConversation
from durable_agent.types import Exchange, Observation, Tagged, ToolCall, TurnInput


class UserMessage(Tagged):
    role: Literal["user"] = "user"
    text: str
    attachments: list[Attachment] = Field(default_factory=list)
    """Files and images sent with these words, by reference (the model activity reads
    their bytes: `durable_agent/attachments.py`)."""

    @classmethod
    def of(cls, turn: TurnInput) -> UserMessage:
        """A turn's question, with its attachments."""
        return cls(text=turn.question, attachments=list(turn.attachments))


MAX_OPAQUE_CHARS = 200_000
"""The most an `Opaque` part may hold, as JSON (`durable_agent.bounds`): a model's
thinking within its budget fits many times over."""


class Opaque(BaseModel):
    """Parts of an assistant message that no one reads but the provider that wrote
    them, which asks for them back unchanged with the message: Anthropic's thinking
    blocks and their signatures, which must open the model's next request within a
    round of tool use. Only a backend of the same provider and model sends them back;
    every other leaves them out."""

    provider: str
    """`Model.provider` of the backend that wrote them (`anthropic`)."""
    model: str
    """`Model.name`: a signature holds for the model that made it."""
    blocks: list[dict[str, Any]] = Field(default_factory=list)
    """As the provider sent them, in order."""

    def of(self, provider: str, model: str) -> list[dict[str, Any]]:
        """The blocks, for that provider's model; none for any other."""
        return self.blocks if (self.provider, self.model) == (provider, model) else []


class AssistantMessage(Tagged):
    role: Literal["assistant"] = "assistant"
    text: str = ""
    calls: list[ToolCall] = Field(default_factory=list)
    opaque: Opaque | None = None
    """What only its provider reads, sent back to it unchanged (None for most)."""


class ToolResult(Tagged):
    """A call's result (or its error: a rejected call, a failed tool) for the model."""

    role: Literal["tool"] = "tool"
    call_id: str
    tool: str
    ok: bool
    text: str
    digest: str = ""
    """Set: `text` is only the result's start, and the whole of it (`chars` long, of
    this sha256) is in a `dispatch` or `parse_output` result of the turn's history,
    stored there once (`by_reference`); the model activity reads it from there."""
    chars: int = 0

    @classmethod
    def of(cls, observation: Observation) -> ToolResult:
        return cls(
            call_id=observation.call_id,
            tool=observation.tool,
            ok=observation.ok,
            text=observation.text,
        )


Message = Annotated[UserMessage | AssistantMessage | ToolResult, Field(discriminator="role")]


BY_REFERENCE_CHARS = 1024
"""A tool result this long or longer goes to a model call by reference (`by_reference`)."""
REFERENCE_PREVIEW_CHARS = 200


def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def by_reference(messages: Sequence[Message], stored: Collection[str]) -> list[Message]:
    """`messages` with each long tool result whose text is in an activity's result
    (`stored`: their digests) replaced by a reference to it: a model call's input then
    does not store the text a second time."""
    out: list[Message] = []
    for m in messages:
        if isinstance(m, ToolResult) and not m.digest and len(m.text) >= BY_REFERENCE_CHARS:
            digest = digest_of(m.text)
            if digest in stored:
                start = m.text[:REFERENCE_PREVIEW_CHARS]
                m = m.model_copy(update={"text": start, "digest": digest, "chars": len(m.text)})
        out.append(m)
    return out


def referenced(messages: Sequence[Message]) -> set[str]:
    """The digests of the results `messages` carry by reference."""
    return {m.digest for m in messages if isinstance(m, ToolResult) and m.digest}


def resolved(messages: Sequence[Message], texts: Mapping[str, str]) -> list[Message]:
    """`messages` with the results they carry by reference whole again, from `texts`
    (by digest); one whose text is not there keeps its start (the caller says so)."""
    out: list[Message] = []
    for m in messages:
        if isinstance(m, ToolResult) and m.digest in texts:
            m = m.model_copy(update={"text": texts[m.digest], "digest": "", "chars": 0})
        out.append(m)
    return out


def prior(exchanges: Sequence[Exchange]) -> list[Message]:
    """Earlier exchanges of a conversation, as the messages that open a turn's."""
    messages: list[Message] = []
    for e in exchanges:
        asked = UserMessage(text=e.question, attachments=list(e.attachments))
        messages += [asked, AssistantMessage(text=e.answer)]
    return messages


def question(messages: Sequence[Message]) -> str:
    """The customer's latest words: what this turn is about."""
    return next((m.text for m in reversed(messages) if isinstance(m, UserMessage)), "")


def latest_results(messages: Sequence[Message]) -> list[ToolResult]:
    """The results that answer the model's last message, in call order."""
    results: list[ToolResult] = []
    for m in reversed(messages):
        if not isinstance(m, ToolResult):
            break
        results.append(m)
    return results[::-1]


def calls_so_far(messages: Sequence[Message]) -> int:
    return sum(len(m.calls) for m in messages if isinstance(m, AssistantMessage))


# Who speaks next, after a message of each role (tool results precede the model's reply).
_NEXT_SPEAKER = {None: "user", "user": "assistant", "assistant": "user", "tool": "assistant"}


def check(messages: Sequence[Message]) -> None:
    """Raise `InvalidConversation` unless every provider would accept `messages`.

    The rules: the customer speaks first; user and assistant alternate (tool
    results belong to the assistant message they answer); an assistant message
    says something or calls something; every call has a unique id and is
    answered by exactly one result, right after its message and before anything
    else; the model is asked to speak after a user message or tool results.
    """
    if not messages:
        raise InvalidConversation("the conversation is empty")
    if not isinstance(messages[0], UserMessage):
        raise InvalidConversation("the conversation must start with the customer's message")
    seen_ids: set[str] = set()
    pending: list[str] = []
    previous: Message | None = None
    for i, m in enumerate(messages):
        if isinstance(m, ToolResult):
            if m.call_id not in pending:
                raise InvalidConversation(
                    f"message {i}: result for call {m.call_id!r}, which is not awaiting one"
                )
            pending.remove(m.call_id)
        else:
            if pending:
                raise InvalidConversation(
                    f"message {i}: calls {', '.join(pending)} have no result before it"
                )
            speaker = _NEXT_SPEAKER[previous.role if previous else None]
            if m.role != speaker:
                raise InvalidConversation(f"message {i}: expected {speaker}, got {m.role}")
            if isinstance(m, AssistantMessage):
                if not m.calls and not m.text.strip():
                    raise InvalidConversation(f"message {i}: an empty assistant message")
                for call in m.calls:
                    if not call.id or call.id in seen_ids:
                        raise InvalidConversation(
                            f"message {i}: call ids must be unique and non-empty"
                        )
                    seen_ids.add(call.id)
                    pending.append(call.id)
        previous = m
    if pending:
        raise InvalidConversation(f"calls {', '.join(pending)} have no result")
    if isinstance(messages[-1], AssistantMessage):
        raise InvalidConversation("the model must not be asked to answer its own message")
