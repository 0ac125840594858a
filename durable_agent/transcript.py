"""A turn's conversation, put together where the model is called, from what is new.

A model call's input carries only what changed since the turn's previous call
(`Delta`): the messages from position `since` on; the ones before it are the
conversation as the previous call had it. Each message then enters the turn's
history once, so a turn of N steps writes O(N) bytes, not O(N²) as when every call
carried the whole conversation.

The worker keeps each running turn's conversation (`Transcripts`, a bounded LRU).
A call whose previous one ran on another worker, or before this worker started,
finds no usable copy here: it reads the run's history and replays the deltas
(`rebuild`), which is what the previous calls had, whatever ran them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from durable_agent.conversation import Message

MAX_TURNS = 64
"""Conversations a worker keeps at hand (a running turn's is used again at its next call)."""


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


class Transcripts:
    """The conversations of the turns this worker runs model calls for, by run."""

    def __init__(self, max_turns: int | None = None) -> None:
        self._max = MAX_TURNS if max_turns is None else max_turns
        self._kept: OrderedDict[str, tuple[int, list[Message]]] = OrderedDict()

    async def assemble(self, run: str, delta: Delta, rebuild: Rebuild) -> list[Message]:
        """The whole conversation of `delta`'s call in `run`, kept for the next call."""
        if delta.since is None:
            conversation = list(delta.messages)
        else:
            kept = self._kept.get(run)
            # A copy made at the previous call, or at this one (a retry): both agree on
            # the messages this call keeps. Any older one may differ (compaction).
            usable = kept is not None and kept[0] in (delta.call - 1, delta.call)
            before = kept[1] if usable and kept is not None else await rebuild()
            conversation = delta.apply(before)
        self._kept[run] = (delta.call, conversation)
        self._kept.move_to_end(run)
        while len(self._kept) > self._max:
            self._kept.popitem(last=False)
        return conversation

    def forget(self, run: str) -> None:
        self._kept.pop(run, None)


def replay(base: Sequence[Message], deltas: Sequence[Delta]) -> list[Message]:
    """The conversation after `deltas`, in the order they were sent, from `base`."""
    conversation = list(base)
    for delta in deltas:
        conversation = delta.apply(conversation)
    return conversation
