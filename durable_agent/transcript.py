"""A turn's conversation, put together where the model is called, from what is new.

A model call's input carries only what changed since the turn's previous call
(`Delta`): the messages from position `since` on; the ones before it are the
conversation as the previous call had it. Each message then enters the turn's
history once, so a turn of N steps writes O(N) bytes, not O(N²) as when every call
carried the whole conversation.

The worker keeps each running turn's conversation (`Transcripts`, a bounded LRU),
by turn: a turn that continued as new keeps its conversation and numbers its calls
on. A call whose previous one ran on another worker, or before this worker started,
finds no usable copy here: it reads the turn's history (its runs') and replays the
deltas (`rebuild`), which is what the previous calls had, whatever ran them.

Other activities that read the conversation (parse's checks of where a call's
arguments came from, the shields' context) are given a `ConversationRef` instead of
the conversation: it names the call whose conversation they read, from the same copy.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from durable_agent.conversation import AssistantMessage, Message, ToolResult, question
from durable_agent.provenance import Source

MAX_TURNS = 64
"""Conversations a worker keeps at hand (a running turn's is used again at its next call)."""
HOLD_S = 10.0
"""Beyond `MAX_TURNS`, a conversation used within this many seconds is kept still: the
local activities of one workflow task read what its model call made, before the
history records it (`Agent.model_calls`), however many turns run at once..."""
MAX_HELD = 1024
"""...up to this many conversations in all."""


@dataclass(frozen=True)
class Delta:
    """What one model call carries of the conversation."""

    call: int
    """The call's number in its run (1, 2, ...)."""
    since: int | None
    """How many messages of the previous call's conversation this one keeps; the rest
    are `messages`. None: `messages` is the whole conversation (turns recorded before
    calls carried deltas)."""
    messages: Sequence[Message]

    def apply(self, before: Sequence[Message]) -> list[Message]:
        if self.since is None:
            return list(self.messages)
        if self.since > len(before):
            raise ValueError(
                f"call {self.call} keeps {self.since} messages of a conversation of "
                f"{len(before)}: the previous calls' record is incomplete"
            )
        return [*before[: self.since], *self.messages]


Rebuild = Callable[[], Awaitable[list[Message]]]
"""The conversation as the call before this one had it, read from the run's record."""


class ConversationRef(BaseModel):
    """The turn's conversation, for an activity that reads it without carrying it: as
    the turn's model call number `call` had it, then `after`. Its input then grows with
    what is new only, not with the whole conversation at every step."""

    turn: str
    """The turn's first run id: with the workflow id, which turn (across its runs)."""
    call: int
    """The model call (numbered from 1 across the turn's runs) whose conversation it is."""
    after: list[Message] = Field(default_factory=list)
    """What the conversation gained since that call (a round answered directly)."""


def context_of(messages: Sequence[Message]) -> list[str]:
    """What an answer or a call may draw on: the question first, then the tool results
    and the conversation's earlier questions and answers (those answers passed the
    output shields when they were given)."""
    asked = question(messages)
    rest = [
        m.text
        for m in messages
        if not (isinstance(m, AssistantMessage) and m.calls) and m.text != asked
    ]
    return [asked, *rest]


def results_of(messages: Sequence[Message]) -> list[Source]:
    """The tool results the model read: text the customer did not write."""
    return [
        Source(what=f"a result of {m.tool}", text=m.text)
        for m in messages
        if isinstance(m, ToolResult)
    ]


class Transcripts:
    """The conversations of the turns this worker runs activities for, by turn."""

    def __init__(self, max_turns: int | None = None) -> None:
        self._max = MAX_TURNS if max_turns is None else max_turns
        self._kept: OrderedDict[str, tuple[int, list[Message]]] = OrderedDict()
        self._used: dict[str, float] = {}

    async def assemble(self, run: str, delta: Delta, rebuild: Rebuild) -> list[Message]:
        """The whole conversation of `delta`'s call in turn `run`, kept for the next call."""
        if not delta.since:
            # The whole conversation (a turn's first call, or one after compaction).
            conversation = list(delta.messages)
        else:
            kept = self._kept.get(run)
            # A copy made at the previous call, or at this one (a retry): both agree on
            # the messages this call keeps. Any older one may differ (compaction).
            usable = kept is not None and kept[0] in (delta.call - 1, delta.call)
            before = kept[1] if usable and kept is not None else await rebuild()
            conversation = delta.apply(before)
        self._keep(run, delta.call, conversation)
        return conversation

    async def at(self, run: str, call: int, rebuild: Rebuild) -> list[Message]:
        """The conversation of turn `run` as its call number `call` had it (`rebuild`
        reads it from the turn's record when no copy of it is kept here)."""
        kept = self._kept.get(run)
        if kept is not None and kept[0] == call:
            self._kept.move_to_end(run)
            self._used[run] = time.monotonic()
            return kept[1]
        conversation = await rebuild()
        self._keep(run, call, conversation)
        return conversation

    def _keep(self, run: str, call: int, conversation: list[Message]) -> None:
        now = time.monotonic()
        self._kept[run] = (call, conversation)
        self._kept.move_to_end(run)
        self._used[run] = now
        while len(self._kept) > self._max:
            oldest = next(iter(self._kept))
            if len(self._kept) <= MAX_HELD and now - self._used[oldest] < HOLD_S:
                break
            self._kept.popitem(last=False)
            del self._used[oldest]

    def forget(self, run: str) -> None:
        self._kept.pop(run, None)
        self._used.pop(run, None)


MAX_RESULT_CHARS = 64 * 1024 * 1024
"""The most text `ResultTexts` keeps, in all."""


class ResultTexts:
    """Tool results' texts by turn and digest, as this worker's activities screened them
    (`screened`), for the model calls that carry them by reference
    (`conversation.by_reference`): a bounded LRU; a text not here is read from the
    turn's history. A turn finds only its own (its workflow id is the key's first part)."""

    def __init__(self, max_chars: int = MAX_RESULT_CHARS) -> None:
        self.max_chars = max_chars
        self._texts: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._chars = 0

    def clear(self) -> None:
        self._texts.clear()
        self._chars = 0

    def add(self, workflow_id: str, digest: str, text: str) -> None:
        key = (workflow_id, digest)
        if key in self._texts:
            self._texts.move_to_end(key)
            return
        self._texts[key] = text
        self._chars += len(text)
        while self._chars > self.max_chars and self._texts:
            _, dropped = self._texts.popitem(last=False)
            self._chars -= len(dropped)

    def found(self, workflow_id: str, digests: Iterable[str]) -> dict[str, str]:
        """The texts of `digests` that are here for the turn `workflow_id`."""
        found = {
            d: self._texts[(workflow_id, d)] for d in digests if (workflow_id, d) in self._texts
        }
        for d in found:
            self._texts.move_to_end((workflow_id, d))
        return found


RESULTS = ResultTexts()
"""The process's, shared by its workers."""


def replay(base: Sequence[Message], deltas: Sequence[Delta]) -> list[Message]:
    """The conversation after `deltas`, in the order they were sent, from `base`."""
    conversation = list(base)
    for delta in deltas:
        conversation = delta.apply(conversation)
    return conversation
