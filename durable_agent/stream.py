"""What turns and conversations publish as they run, for whoever watches them.

Every `AgentTurn` hosts a stream (Temporal's Workflow Streams) on topic `TURN_TOPIC`:

    StepEvent     each step as the turn records it (plan, tool call, observation,
                  approval, decision, shield, answer, limit): the turn's story
    TokensEvent   a batch of the text a model is writing, while it writes it
    DoneEvent     the turn's outcome and final answer: the last event

Every `Conversation` hosts one on topic `CHAT_TOPIC`:

    TurnStarted   a message is being answered, by turn `turn_id`
    TurnAnswered  that turn's answer
    ChatEnded     the conversation is over

A reader of a conversation follows its stream and, for each turn it starts, that
turn's stream. Items are offset-addressed: a reader that comes back with the next
offset it had not read gets exactly what it missed.

Tokens are a draft. A model call that fails and is retried starts its text again:
each batch names its model call and attempt, and a reader that sees a later
attempt replaces that call's text (`Drafts`). The answer the turn records (its
`answer` step, then `DoneEvent`) is what counts: it replaces the draft, so an
answer that an output shield refused is replaced by the refusal.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter
from temporalio.contrib.workflow_streams import WorkflowStreamState

from durable_agent.types import Outcome, Step, Tagged, Usage

TURN_TOPIC = "turn"
CHAT_TOPIC = "chat"

CARRIED_BYTES = 256 * 1024
"""The most of a stream's recent events a workflow carries into its next run, as
bytes: a payload is at most 2 MB, and an answer may be long."""


def carried(
    state: WorkflowStreamState, items: int, size: int = CARRIED_BYTES
) -> WorkflowStreamState:
    """A stream's state for the workflow's next run (continue-as-new): its latest
    events, at most `items` of them and `size` bytes, at the offsets they had. A reader
    further behind reads on from the oldest kept; one event larger than `size` is not
    carried (what it said is also in the turn's or conversation's own record)."""
    kept, total = 0, 0
    for item in reversed(state.log[-items:] if items > 0 else []):
        total += len(item.data) + len(item.topic)
        if total > size:
            break
        kept += 1
    dropped = len(state.log) - kept
    return replace(state, log=state.log[dropped:], base_offset=state.base_offset + dropped)


TextSink = Callable[[str], None]
"""Where a model writes its text as it comes (each call gets the next piece)."""


class StepEvent(Tagged):
    type: Literal["step"] = "step"
    step: Step


class TokensEvent(Tagged):
    type: Literal["tokens"] = "tokens"
    call: str
    """Which model call of the turn wrote them (its activity id)."""
    attempt: int = 1
    """The call's attempt: a later attempt's text replaces an earlier one's."""
    text: str
    """The next piece of the call's text."""


class DoneEvent(Tagged):
    type: Literal["done"] = "done"
    outcome: Outcome
    answer: str
    usage: Usage = Field(default_factory=Usage)
    output: Any = None
    """A typed turn's value, as JSON (`answer` is its text); None for a turn in words."""


TurnEvent = Annotated[StepEvent | TokensEvent | DoneEvent, Field(discriminator="type")]
TURN_EVENT: TypeAdapter[TurnEvent] = TypeAdapter(TurnEvent)


class TurnStarted(Tagged):
    type: Literal["turn"] = "turn"
    turn_id: str
    question: str
    files: list[str] = []
    """The names of the message's files (their bytes are the conversation's payloads)."""


class TurnAnswered(Tagged):
    type: Literal["answered"] = "answered"
    turn_id: str
    outcome: Outcome
    answer: str


class ChatEnded(Tagged):
    type: Literal["ended"] = "ended"
    reason: str
    """`customer` (they said goodbye) or `idle` (nothing said for the idle timeout)."""


ChatEvent = Annotated[TurnStarted | TurnAnswered | ChatEnded, Field(discriminator="type")]
CHAT_EVENT: TypeAdapter[ChatEvent] = TypeAdapter(ChatEvent)


DraftChange = Literal["started", "continued", "restarted", "stale"]


class Drafts:
    """A reader's view of the text models are writing: one draft per model call,
    restarted when a retried attempt starts writing again."""

    def __init__(self) -> None:
        self._attempts: dict[str, int] = {}
        self._text: dict[str, str] = {}

    def add(self, event: TokensEvent) -> DraftChange:
        """Take a batch, and say what it did to its call's draft."""
        seen = self._attempts.get(event.call)
        if seen is not None and event.attempt < seen:
            return "stale"  # a late batch of an attempt already replaced
        change: DraftChange = (
            "started" if seen is None else "restarted" if event.attempt > seen else "continued"
        )
        if change != "continued":
            self._attempts[event.call], self._text[event.call] = event.attempt, ""
        self._text[event.call] += event.text
        return change

    def text(self, call: str) -> str:
        return self._text.get(call, "")


class TokenBatcher:
    """Collects a model's text into batches bounded in size and time, so a long
    answer adds a bounded number of publishes (and history events) to its turn.

    `add` takes the next piece and returns the batches due now: pieces of
    `max_chars` at once when the text is long, and the rest once `interval_s` has
    passed since the last batch. `tick` (called by a timer) returns the rest when
    it has waited long enough; `flush` returns whatever is left. The clock is
    passed in, which keeps this testable without sleeping."""

    def __init__(self, interval_s: float = 0.1, max_chars: int = 2000) -> None:
        if interval_s <= 0 or max_chars <= 0:
            raise ValueError("interval_s and max_chars must be positive")
        self.interval_s = interval_s
        self.max_chars = max_chars
        self._buffer = ""
        self._last: float | None = None

    def add(self, text: str, now: float) -> list[str]:
        if self._last is None:
            self._last = now
        self._buffer += text
        due: list[str] = []
        while len(self._buffer) >= self.max_chars:
            due.append(self._buffer[: self.max_chars])
            self._buffer = self._buffer[self.max_chars :]
            self._last = now
        return due + self.tick(now)

    def tick(self, now: float) -> list[str]:
        if not self._buffer or self._last is None or now - self._last < self.interval_s:
            return []
        self._last = now
        return [self.flush()]

    def flush(self) -> str:
        text, self._buffer = self._buffer, ""
        return text


async def write_out(text: str, sink: TextSink | None, per_word_s: float = 0.02) -> None:
    """Write `text` to `sink` a word at a time, as a streaming model would (for
    models that compute their answer at once but should look like the others)."""
    if sink is None:
        return
    for word in re.findall(r"\S+\s*|\s+", text):
        sink(word)
        await asyncio.sleep(per_word_s)
