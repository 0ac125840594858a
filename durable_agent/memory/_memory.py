"""`Memory`: what a customer told an agent, kept across conversations (a `ContextSource`)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, Field

from durable_agent.context_sources import MAX_PASSAGES, Passage, render_passages
from durable_agent.conversation import Message, ToolResult
from durable_agent.errors import NotAllowed, NotFound
from durable_agent.memory._store import (
    MEMORY_ID,
    MemoryFull,
    MemoryStore,
    Remembered,
    in_state_folder,
    memory_id,
)
from durable_agent.principal import Principal
from durable_agent.tools import Tool, ToolContext, tool

REMEMBER_TOOL = "remember"
FORGET_TOOL = "forget"
RECALL_TOOL = "recall"
MAX_FACT_CHARS_LIMIT = 2_000
MAX_FACTS_LIMIT = 10_000
MAX_RECALL_CHARS_LIMIT = 20_000


@dataclass(frozen=True)
class MemorySettings:
    """How an agent remembers (`Agent(memory=MemorySettings(...))`; `memory=True`: these
    defaults).

        MemorySettings(recall=5, max_fact_chars=500, max_facts=200)
    """

    recall: int = 5
    """How many of the customer's memories each turn starts with (the retrieval step),
    the most relevant to the question first; 0: none (the model calls `recall`)."""
    recall_chars: int = 2_000
    """The most characters of memories one recall gives the model, in all."""
    max_fact_chars: int = 500
    """The longest fact `remember` stores."""
    max_facts: int = 200
    """The most memories one customer may have: past it, `remember` refuses until some
    are forgotten."""
    name: str = "memory"
    """Names the file, `<state folder>/memory/<name>.sqlite3`: agents of one folder with
    the same name share a customer's memories."""
    store: Callable[[], MemoryStore] | None = None
    """Another store than that file (`MemoryStore`): made once per worker."""

    def __post_init__(self) -> None:
        bounds = (
            ("recall", self.recall, 0, MAX_PASSAGES),
            ("recall_chars", self.recall_chars, 100, MAX_RECALL_CHARS_LIMIT),
            ("max_fact_chars", self.max_fact_chars, 10, MAX_FACT_CHARS_LIMIT),
            ("max_facts", self.max_facts, 1, MAX_FACTS_LIMIT),
        )
        for field, value, low, high in bounds:
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"memory: {field} must be from {low} to {high:,}, not {value!r}")
        if not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"memory name {self.name!r}: use letters, digits, '-' and '_'")


class Fact(BaseModel):
    fact: str = Field(
        min_length=1,
        max_length=MAX_FACT_CHARS_LIMIT,
        description="The fact to keep, in the customer's own words",
    )


class MemoryRef(BaseModel):
    memory_id: str = Field(pattern=f"^{MEMORY_ID}$", description="The memory's id, mem_...")


class RecallQuery(BaseModel):
    query: str = Field(min_length=1, max_length=500, description="What to look for")


class Memory:
    """A customer's memories for an agent: `remember(fact)` and `forget(memory_id)`
    writes, a `recall(query)` read, and (with `recall` above 0) the retrieval step's
    recall before each turn. Every one is scoped to the turn's principal (tenant and
    customer), never to anything the model writes."""

    def __init__(self, settings: MemorySettings | None = None) -> None:
        self.settings = settings or MemorySettings()
        self.name = self.settings.name
        self.retrieve = self.settings.recall
        self._store: MemoryStore | None = None
        self._tools = [_remember_tool(self), _forget_tool(self), _recall_tool(self)]

    # -- the ContextSource protocol --------------------------------------------------

    def tools(self) -> Sequence[Tool]:
        return self._tools

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Memory]:
        await asyncio.to_thread(lambda: self.store)  # a store that cannot open stops the worker
        try:
            yield self
        finally:
            store, self._store = self._store, None
            if store is not None:
                store.close()

    async def passages(
        self, question: str, limit: int, asker: Principal | None = None
    ) -> list[Passage]:
        if asker is None:
            return []  # no one to recall for: nothing (never someone else's)
        found = await asyncio.to_thread(
            self.store.search, asker.tenant, asker.user, question, min(limit, MAX_PASSAGES)
        )
        return self._bounded(found)

    async def resolved(self, messages: list[Message], asker: Principal | None) -> list[Message]:
        """The conversation as the model reads it: each memory the recall step recorded
        by reference (`[memory mem_…]`), in its words, read from the store now, of the
        turn's own customer only; a memory forgotten since reads `[forgotten memory
        mem_…]`. The turn's record keeps the references: forgetting a memory leaves its
        words in no turn that recalled it."""
        if not any(isinstance(m, ToolResult) and "[memory mem_" in m.text for m in messages):
            return messages
        theirs: dict[str, Remembered] = {}
        if asker is not None:
            found = await asyncio.to_thread(self.store.list, asker.tenant, asker.user)
            theirs = {m.id: m for m in found}
        return [
            m.model_copy(update={"text": resolved(m.text, theirs)})
            if isinstance(m, ToolResult)
            else m
            for m in messages
        ]

    def recorded(self, tool: str, text: str) -> str:
        """A `recall` call's result as the turn's record keeps it (screened already): each
        memory by reference, as the recall step's. Other tools' results as they are."""
        if tool != RECALL_TOOL:
            return text

        def reference(match: re.Match[str]) -> str:
            words = match[3]
            cut = f", first {len(words) - len(CUT)} characters" if words.endswith(CUT) else ""
            return f"{match[1]}[memory {match[2]}{cut}]"

        return _RENDERED.sub(reference, text)

    # -- plain Python ------------------------------------------------------------------

    @property
    def store(self) -> MemoryStore:
        if self._store is None:
            if self.settings.store is not None:
                self._store = self.settings.store()
            else:
                self._store = in_state_folder(self.name)
        return self._store

    def _bounded(self, found: list[Remembered]) -> list[Passage]:
        """As passages, within `recall_chars` in all (the last one cut to fit)."""
        left = self.settings.recall_chars
        passages = []
        for memory in found:
            if left <= 0:
                break
            passages.append(_passage(memory, left if len(memory.text) > left else None))
            left -= len(memory.text)
        return passages

    def remember(self, asker: Principal, fact: str, key: str = "") -> tuple[Remembered, bool]:
        """Stores `fact` for `asker` once per `key` (a call's idempotency key); the stored
        memory and whether this call stored it. `NotAllowed` in one line when it cannot."""
        fact = " ".join(fact.split())
        if not fact:
            raise NotAllowed("remember: give the fact to keep, in the customer's words")
        if len(fact) > self.settings.max_fact_chars:
            raise NotAllowed(
                f"remember: a fact is at most {self.settings.max_fact_chars} characters, "
                f"not {len(fact):,}; keep a shorter one"
            )
        key = key or uuid.uuid4().hex
        memory = Remembered(
            id=memory_id(asker.tenant, asker.user, key),
            tenant=asker.tenant,
            customer_id=asker.user,
            text=fact,
            created=time.time(),
            turn=key.split("/")[0] if "/" in key else "",
        )
        try:
            return self.store.add(memory, self.settings.max_facts)
        except MemoryFull:
            raise NotAllowed(
                f"remember: this customer has {self.settings.max_facts} memories, the most "
                "kept; forget one that no longer holds first"
            ) from None

    def __repr__(self) -> str:
        return f"Memory(name={self.name!r}, recall={self.retrieve})"


def _passage(memory: Remembered, keep: int | None = None) -> Passage:
    """The memory as a passage, its first `keep` characters only if given; with the
    reference the turn's record keeps instead of its words."""
    day = datetime.fromtimestamp(memory.created, tz=timezone.utc).date().isoformat()
    text = memory.text if keep is None else memory.text[:keep] + CUT
    ref = f"[memory {memory.id}" + ("" if keep is None else f", first {keep} characters") + "]"
    return Passage(id=memory.id, source="memory", location=f"told {day}", text=text, ref=ref)


def resolved(text: str, memories: dict[str, Remembered]) -> str:
    """`text` with each reference to a memory (`[memory mem_…]`, as the recall step
    records it) replaced by the memory's words, or by `[forgotten memory mem_…]` when
    `memories` (its owner's) has none of that id: deleted since."""

    def words(match: re.Match[str]) -> str:
        memory = memories.get(match[1])
        if memory is None:
            return f"[forgotten memory {match[1]}]"
        if match[2]:
            return memory.text[: int(match[2])] + CUT
        return memory.text

    return _REFERENCE.sub(words, text)


CUT = " [...]"
_RENDERED = re.compile(
    # A memory as `render_passages` gives it: its header, then its words up to the
    # next memory's header or the end.
    rf"(\[({MEMORY_ID})\] \(memory › told [0-9-]+\): )(.+?)(?= \[{MEMORY_ID}\] \(memory › |$)"
)
_REFERENCE = re.compile(rf"\[memory ({MEMORY_ID})(?:, first (\d{{1,5}}) characters)?\]")


def _remember_tool(memory: Memory) -> Tool:
    async def remember(args: Fact, ctx: ToolContext[Any]) -> str:
        stored, _ = await asyncio.to_thread(
            memory.remember, ctx.principal, args.fact, ctx.idempotency_key
        )
        # By reference, as the recall step's: the model reads the words (`resolved`),
        # the turn's record keeps only the id.
        return f"remembered [{stored.id}]: [memory {stored.id}]"

    remember.__doc__ = (
        "Remember a fact the customer told you (a preference, a detail about them) for "
        "their later conversations, in their own words. Only when they ask you to, or "
        "tell you something they will want kept."
    )
    # A write, waived by default: it runs unasked only when every word of the fact is
    # the customer's own (the provenance rules), else a person is asked, as for any
    # write. The agent's approval policy (`required`) can ask for every one.
    made: Tool = tool(remember, name=REMEMBER_TOOL, side_effects=True, approval=False)
    return made


def _forget_tool(memory: Memory) -> Tool:
    async def forget(args: MemoryRef, ctx: ToolContext[Any]) -> str:
        who = ctx.principal
        gone = await asyncio.to_thread(memory.store.forget, who.tenant, who.user, args.memory_id)
        if not gone:
            raise NotFound(f"forget: this customer has no memory {args.memory_id}")
        return f"forgot {args.memory_id}"

    forget.__doc__ = (
        "Forget one of the customer's memories, by its id (mem_...), when they ask you to "
        "or it no longer holds."
    )
    made: Tool = tool(forget, name=FORGET_TOOL, side_effects=True, approval=False)
    return made


def _recall_tool(memory: Memory) -> Tool:
    async def recall(args: RecallQuery, ctx: ToolContext[Any]) -> str:
        found = await memory.passages(args.query, MAX_PASSAGES, ctx.principal)
        return render_passages(found, f"The customer's memories about {args.query!r}")

    recall.__doc__ = (
        "Look up what this customer told you in earlier conversations (their memories), "
        "each with its id (mem_...)."
    )
    made: Tool = tool(recall, name=RECALL_TOOL, quick=True)
    return made
