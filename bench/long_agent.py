"""The long turn's agent, defined as anyone defines theirs: an `Agent`, its tools and
a scripted model (`bench.long_script` decides; no network).

    read_doc          one document, whole (a regular activity: not a quick read)
    save_checkpoint   a write, keyed by its call's idempotency key, into a SQLite file
                      outside the worker: the benchmark counts what was written
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel, Field

from durable_agent import Agent, ToolContext, TurnLimits, compaction, tool
from durable_agent.bench import long_script
from durable_agent.bench.long_script import READ, WRITE, Scenario
from durable_agent.conversation import AssistantMessage, ToolResult
from durable_agent.model import ModelRequest, Reply
from durable_agent.stream import TextSink
from durable_agent.types import ToolCall

NAME = "long_reader"
MODEL_KIND = "long-reader"
MAX_DURATION = timedelta(hours=6)
"""Far above what 1,000 steps take: the benchmark's own budget ends it first."""


class Library:
    """The documents, and the checkpoints' file. Tools run in threads: one lock.

    `hang_after_write`: a file to touch right after a checkpoint is first written, the
    call then hanging until the benchmark kills the worker: Temporal never hears the
    call succeeded, and runs it again on the next worker."""

    def __init__(self, doc_chars: int, effects: Path, hang_after_write: Path | None = None) -> None:
        self.doc_chars = doc_chars
        self.hang_after_write = hang_after_write
        self._db = sqlite3.connect(effects, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.executescript(CHECKPOINTS_SCHEMA)

    def read(self, n: int) -> str:
        return long_script.doc(n, self.doc_chars)

    def checkpoint(self, key: str) -> str:
        """Written once per key: a call run again (its worker was killed after the
        write) finds its row and writes nothing. Every attempt is logged, so the
        benchmark sees which ones ran again."""
        with self._lock:
            self._db.execute("INSERT INTO attempts VALUES (?, ?)", (key, time.time()))
            cur = self._db.execute(
                "INSERT OR IGNORE INTO checkpoints VALUES (?, ?)", (key, time.time())
            )
        if cur.rowcount and self.hang_after_write:
            self.hang_after_write.touch()
            threading.Event().wait()
        return "saved" if cur.rowcount else "saved before"

    def close(self) -> None:
        self._db.close()


CHECKPOINTS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS checkpoints (key TEXT PRIMARY KEY, at REAL);"
    "CREATE TABLE IF NOT EXISTS attempts (key TEXT, at REAL);"
)


class Doc(BaseModel):
    n: int = Field(ge=1, description="the document's number")


class NoArgs(BaseModel):
    pass


@tool
def read_doc(args: Doc, ctx: ToolContext[Library]) -> str:
    """One document, whole, by its number."""
    return ctx.deps.read(args.n)


# A write with no arguments: nothing in it comes from a tool result, so waiving consent
# (approval=False) leaves nothing for a person to check; and every call is a new
# checkpoint, so the same call again is no repeated effect (repeats=True).
@tool(side_effects=True, approval=False, repeats=True)
def save_checkpoint(args: NoArgs, ctx: ToolContext[Library]) -> str:
    """Record how far the reading has got."""
    return ctx.deps.checkpoint(ctx.idempotency_key)


class LongReader:
    """The scenario's reader as a model: the next document after its own last read
    call, a checkpoint where the scenario says, then an answer quoting the last
    result's last word. It decides from the request alone and keeps nothing."""

    provider = "scripted"

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.context_window = scenario.window
        """The scenario's (gpt-4o's 128,000 by default): the turn keeps its conversation
        within it, older results shortened and older exchanges summarised
        (`durable_agent.compaction`)."""
        self.name = f"{MODEL_KIND}-{scenario.spec()}"

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return self.next(request)

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return self.next(request)

    async def summarise(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        """What a long turn asks when its conversation fills the window: a digest."""
        return Reply(text=compaction.digest(request.question, 4_000))

    def next(self, request: ModelRequest) -> Reply:
        n = self.scenario.next_doc(last_read(request))
        if n is None:
            return Reply(text=long_script.answer(last_result(request)))
        calls = [ToolCall(id=f"r{n}", name=READ, arguments={"n": n})]
        if self.scenario.writes_at(n):
            calls.append(ToolCall(id=f"w{n}", name=WRITE))
        return Reply(calls=calls)


def last_read(request: ModelRequest) -> int | None:
    """The document the model's latest read call asked for."""
    for m in reversed(request.messages):
        if isinstance(m, AssistantMessage):
            for call in reversed(m.calls):
                if call.name == READ:
                    return int(call.arguments["n"])
    return None


def last_result(request: ModelRequest) -> str:
    return next(
        (
            m.text
            for m in reversed(request.messages)
            if isinstance(m, ToolResult) and m.tool == READ
        ),
        "",
    )


def long_agent(doc_chars: int, effects: Path, hang_after_write: Path | None = None) -> Agent:
    return Agent(
        name=NAME,
        title="Long reader",
        description="reads documents one by one",
        tools=[read_doc, save_checkpoint],
        model=MODEL_KIND,
        models={MODEL_KIND: lambda spec: LongReader(Scenario.from_spec(spec or "1000:100"))},
        limits=TurnLimits(max_steps=10_000, max_duration=MAX_DURATION),
        deps=lambda: closing(Library(doc_chars, effects, hang_after_write)),
    )
