"""Long-horizon turns: tool results reach the model whole (up to a per-tool limit),
and the story shows a preview of each; activities read the conversation rather than
carry it; a long turn continues as new near Temporal's limits and stays one turn."""

from __future__ import annotations

import asyncio
import hashlib
import re
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio.client import Client, WorkflowHandle, WorkflowHistory

from durable_agent import AgentClient, transcript
from durable_agent.activities import ModelCallInput
from durable_agent.approval import ApprovalPolicy
from durable_agent.conversation import ToolResult
from durable_agent.model import ModelRequest, Reply
from durable_agent.render import PREVIEW_CHARS, TRUNCATION_MARKER
from durable_agent.runtime import turns
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.turns import decide, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shields import ShieldRequest, ShieldSettings, Verdict
from durable_agent.shop import TOOLS
from durable_agent.stream import DoneEvent
from durable_agent.tools import Tool, ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits
from tests.conftest import Harness, last_result
from tests.test_approvals import awaiting, until
from tests.test_store_hardening import files_holding


class Page(BaseModel):
    n: int


class Nothing(BaseModel):
    pass


def _page(n: int, size: int) -> str:
    """A page of `size` characters whose last word names it (no runs of spaces: the
    rendering keeps it as it is)."""
    end = f"end-of-page-{n}"
    words = " ".join(["w" * 9] * (size // 10))[: size - len(end) - 1]
    return words.removesuffix(" ") + "w" * words.endswith(" ") + " " + end


@tool
def read_page(args: Page, ctx: ToolContext[object]) -> str:
    """A 30,000-character page."""
    return _page(args.n, 30_000)


@tool(max_result_chars=1000)
def read_summary(args: Page, ctx: ToolContext[object]) -> str:
    """A page whose tool lets the model read only its first 1,000 characters."""
    return _page(args.n, 30_000)


async def test_a_result_reaches_the_model_whole_up_to_its_tools_limit(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="read_page", arguments={"n": 1})])],
        decisions=[
            Reply(calls=[ToolCall(id="c2", name="read_summary", arguments={"n": 2})]),
            Reply(text="done"),
        ],
    )
    result = await harness.ask("read", model=model, tools=ToolRegistry([read_page, read_summary]))
    assert result.outcome is Outcome.ANSWERED
    [(_, first), (_, second)] = [r for r in model.requests if r[0] == "interpret"]
    assert last_result(first) == _page(1, 30_000)  # whole: far past the old 2,000
    cut = last_result(second)
    assert cut == _page(2, 30_000)[:1000] + TRUNCATION_MARKER.format(n=29_000)
    # The story shows the start of each result, marked as cut.
    shown = [s.observation.text for s in result.steps if s.observation is not None]
    assert [len(t) for t in shown] == [
        PREVIEW_CHARS + len(TRUNCATION_MARKER.format(n=30_000 - PREVIEW_CHARS)),
        len(cut),
    ]


def _reading(pages: int) -> ScriptedModel:
    """Reads pages 1..`pages`, one per round, then answers with the last one's end."""
    calls = [
        Reply(calls=[ToolCall(id=f"c{n}", name="read_page", arguments={"n": n})])
        for n in range(2, pages + 1)
    ]

    def answer(request: ModelRequest) -> Reply:
        return Reply(text=last_result(request).split()[-1])

    return ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="read_page", arguments={"n": 1})])],
        decisions=[*calls, answer],
        context_window=None,  # every call sees the whole conversation (no compaction)
    )


async def _model_inputs(handle: WorkflowHandle) -> list[ModelCallInput]:
    history = await handle.fetch_history()
    inputs = []
    for event in history.events:
        scheduled = event.activity_task_scheduled_event_attributes
        if event.HasField("activity_task_scheduled_event_attributes") and (
            scheduled.activity_type.name in ("plan", "interpret")
        ):
            [arg] = await data_converter().decode(list(scheduled.input.payloads), [ModelCallInput])
            inputs.append(arg)
    return inputs


def forget_every_conversation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers keep no copy of any conversation, nor of any tool result: every activity
    reads the turn's record."""
    monkeypatch.setattr(transcript, "MAX_TURNS", 0)
    monkeypatch.setattr(transcript, "HOLD_S", 0)
    monkeypatch.setattr(transcript.RESULTS, "max_chars", 0)
    transcript.RESULTS.clear()


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "rebuilt"])
async def test_a_model_call_carries_only_what_is_new(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    """Each message enters the history once; the activity puts the conversation
    together, from its worker's copy or (none kept) from the run's record."""
    if not kept:
        forget_every_conversation(monkeypatch)
    model = _reading(4)
    result, handle = await harness.ask_with_handle(
        "read", model=model, tools=ToolRegistry([read_page])
    )
    assert result.outcome is Outcome.ANSWERED and result.answer == "end-of-page-4"
    seen = [r.messages for _, r in model.requests]
    # Every call saw the whole conversation: the question, then 2 messages a round.
    assert [len(m) for m in seen] == [1, 3, 5, 7, 9]
    assert all(later[: len(m)] == m for m, later in zip(seen, seen[1:], strict=False))
    inputs = await _model_inputs(handle)
    assert [(i.call, i.since, len(i.messages)) for i in inputs] == [
        (1, 0, 1),
        (2, 1, 2),
        (3, 3, 2),
        (4, 5, 2),
        (5, 7, 2),
    ]


def test_a_result_limit_stays_within_what_one_payload_can_carry() -> None:
    from durable_agent import Agent
    from durable_agent.render import MAX_RESULT_CHARS_LIMIT

    with pytest.raises(TypeError, match="max_result_chars must be from 1 to 250,000"):
        tool(max_result_chars=MAX_RESULT_CHARS_LIMIT + 1)(read_page.fn)
    with pytest.raises(ValueError, match="max_result_chars must be from 1 to 250,000"):
        Agent(name="reader", tools=[read_page], max_result_chars=10_000_000)
    assert tool(max_result_chars=MAX_RESULT_CHARS_LIMIT)(read_page.fn).max_result_chars


class _ForeignIds:
    """Flags an order id the request's context does not hold."""

    name = "ids"

    async def check(self, request: ShieldRequest) -> Verdict:
        context = " ".join(request.context)
        foreign = [i for i in re.findall(r"\b\d{6}\b", request.text) if i not in context]
        return Verdict(shield=self.name, allowed=not foreign, category="foreign_id")


@tool
def notes(args: Nothing, ctx: ToolContext[object]) -> str:
    """The customer's notes on file."""
    return "The parcel of order 123456 arrived broken."


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "rebuilt"])
async def test_the_checks_read_the_conversation_they_are_not_given(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    """Parse (where a write's arguments came from, the tool-input shields' context) and
    the answer's screen read the tool results from the conversation, by reference:
    from their worker's copy, or (none kept) from the turn's record."""
    if not kept:
        forget_every_conversation(monkeypatch)
    write = ToolCall(
        id="c2", name="start_return", arguments={"order_id": "123456", "reason": "broken"}
    )
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="notes")])],
        decisions=[Reply(calls=[write]), Reply(text="Order 123456 was not returned.")],
    )
    shields = replace(ShieldSettings.none(), tool_input=(_ForeignIds(),), output=(_ForeignIds(),))
    tools = ToolRegistry([notes, *TOOLS.tools.values()])
    waived = ApprovalPolicy(waived=frozenset({"*"}))
    async with harness.worker(model, tools, shields=shields, approvals=waived) as tq:
        turn = TurnInput(question="Q", model="scripted")
        handle = await start_turn(harness.client, turn, tq)
        (pending,) = (await until(handle, awaiting)).pending
        # The id came from a tool result: the write asks, though writes are waived.
        assert "from a result of notes" in pending.why
        await decide(harness.client, handle.id, None, approved=False, by="operator")
        result = await handle.result()
    # Both screens found the id in what the model read: the call and the answer passed.
    assert result.outcome is Outcome.ANSWERED, result.answer
    assert result.answer == "Order 123456 was not returned."


LONG_PAGES = 300
LONG_PAGE_CHARS = 50_000
KEYS: list[str] = []
"""The idempotency keys the long turn's tool was given, in order."""


@tool
def read_long_page(args: Page, ctx: ToolContext[object]) -> str:
    """A 50,000-character page."""
    KEYS.append(ctx.idempotency_key)
    return _page(args.n, LONG_PAGE_CHARS)


class Reader:
    """Reads pages 1..`pages`, one a round, then answers with the last one's last word.
    Its reply depends on the conversation only (a retried call gets the same), and it
    keeps nothing of it (the scripted model's memo of every request would cost the
    test time quadratic in the pages)."""

    provider = "scripted"
    name = "reader"

    def __init__(self, pages: int, tool: str = "read_long_page") -> None:
        self.pages = pages
        self.tool = tool
        self.longest = 0
        """The most messages one request held."""
        self.read: list[str] = []
        """The texts of the results the last request held."""

    async def plan(self, request: ModelRequest, stream: object = None) -> Reply:
        return self._next(request)

    async def interpret(self, request: ModelRequest, stream: object = None) -> Reply:
        return self._next(request)

    def _next(self, request: ModelRequest) -> Reply:
        self.longest = max(self.longest, len(request.messages))
        results = [m for m in request.messages if isinstance(m, ToolResult)]
        self.read = [m.text for m in results]
        if len(results) < self.pages:
            n = len(results) + 1
            return Reply(calls=[ToolCall(id=f"c{n}", name=self.tool, arguments={"n": n})])
        return Reply(text=results[-1].text.split()[-1])


def _history_sizes(histories: list[WorkflowHistory]) -> tuple[int, int]:
    """Bytes (as JSON, as the Web UI and `temporal workflow show` give them) and events."""
    return sum(len(h.to_json()) for h in histories), sum(len(h.events) for h in histories)


async def _histories(handle: WorkflowHandle) -> list[WorkflowHistory]:
    """The histories of every run of the turn, oldest first."""
    chain = await turns.runs(handle)
    client = handle._client
    return [await client.get_workflow_handle(handle.id, run_id=r).fetch_history() for r, _ in chain]


async def test_a_long_turn_continues_as_new_and_its_history_grows_with_its_steps(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 rounds, each reading a 50 KB page, with the payload store: the turn moves to
    a new run when its history nears the limit it is given, the client sees one turn
    and its whole story, the answer uses the last page, no write key repeats, and what
    the turn wrote (histories and store) grows with the rounds, not their square."""
    store = tmp_path / "payloads"
    monkeypatch.setenv("AGENT_PAYLOAD_STORE", f"local:{store}")
    config = harness.client.config()
    config["data_converter"] = data_converter()
    harness = Harness(Client(**config), harness.store)
    KEYS.clear()
    model = Reader(LONG_PAGES)
    limits = TurnLimits(
        max_steps=LONG_PAGES + 1,
        max_duration=timedelta(minutes=30),
        continue_after_events=1000,
    )
    output, handle = await harness.ask_with_handle(
        "read", model=model, tools=ToolRegistry([read_long_page]), limits=limits
    )
    assert output.outcome is Outcome.ANSWERED
    assert output.answer == f"end-of-page-{LONG_PAGES}"  # the last result, read whole
    assert model.longest == 1 + 2 * LONG_PAGES  # the question, then each round
    # It continued as new, and each run stayed near the events it was allowed.
    histories = await _histories(handle)
    assert output.runs == len(histories) >= 4
    assert all(len(h.events) <= limits.continue_after_events + 50 for h in histories)
    # The client sees one turn: its id, its whole story, every round once.
    result = await AgentClient(harness.client).turn(handle.id).result()
    assert result.workflow_id == handle.id and result.answer == output.answer
    read = [s for s in result.steps if s.kind is StepKind.OBSERVATION]
    assert [s.iteration for s in read] == list(range(1, LONG_PAGES + 1))
    assert result.earlier_steps == 0 and len(result.steps) > len(output.steps)
    assert result.usage.model_calls == LONG_PAGES + 1
    # Idempotency keys are built from the step: each round's is its own.
    assert len(KEYS) == len(set(KEYS)) == LONG_PAGES
    # Linear: the pages are 15 MB; the histories hold references, the store each
    # page a few times (the tool's result, its text, the model call carrying it).
    pages = LONG_PAGES * LONG_PAGE_CHARS
    size, events = _history_sizes(histories)
    assert size < 6_000_000 and events < 20 * LONG_PAGES
    stored = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    assert stored < 5 * pages


DOCUMENTS = 30
DOCUMENT_CHARS = 20_000


def _document(n: int) -> str:
    """Document `n`: 20,000 characters unlike any other's (nothing a store could share)."""
    words = (hashlib.sha256(f"{n}/{i}".encode()).hexdigest()[:9] for i in range(2000))
    return " ".join(words)[: DOCUMENT_CHARS - 12] + f" end-of-{n:04d}"


@tool
def read_document(args: Page, ctx: ToolContext[object]) -> str:
    """A document of 20,000 characters."""
    return _document(args.n)


@tool(quick=True)
def read_document_quickly(args: Page, ctx: ToolContext[object]) -> str:
    """A document of 20,000 characters, read as a local activity."""
    return _document(args.n)


@pytest.mark.parametrize(
    ("kept", "reader"),
    [(True, read_document), (False, read_document), (False, read_document_quickly)],
    ids=["kept", "rebuilt", "rebuilt-quick"],
)
async def test_a_long_turn_stores_each_result_once(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: bool, reader: Tool
) -> None:
    """30 rounds, each reading a distinct 20 KB document, with the payload store: the
    store holds each result once (the read's result; the model call that carries it
    next names it there), the history holds references only, and the model reads every
    result whole, from its worker's copy or (none kept) from the turn's record: an
    activity's result, or a quick read's local activity's marker."""
    if not kept:
        forget_every_conversation(monkeypatch)
    store = tmp_path / "payloads"
    monkeypatch.setenv("AGENT_PAYLOAD_STORE", f"local:{store}")
    config = harness.client.config()
    config["data_converter"] = data_converter()
    harness = Harness(Client(**config), harness.store)
    model = Reader(DOCUMENTS, reader.name)
    limits = TurnLimits(max_steps=DOCUMENTS + 1)
    output, handle = await harness.ask_with_handle(
        "read", model=model, tools=ToolRegistry([reader]), limits=limits
    )
    assert output.outcome is Outcome.ANSWERED
    assert output.answer == f"end-of-{DOCUMENTS:04d}"
    assert model.read == [_document(n) for n in range(1, DOCUMENTS + 1)]  # each whole
    documents = DOCUMENTS * DOCUMENT_CHARS
    stored = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    assert stored < 1.3 * documents, f"{stored:,} bytes stored for {documents:,}"
    # A step's events only (some 11 KB as JSON), never a document's text.
    size, _ = _history_sizes(await _histories(handle))
    assert size < 15_000 * DOCUMENTS, f"{size:,} bytes of history for {DOCUMENTS} steps"


async def test_a_fork_reads_the_results_its_parent_named_whole(harness: Harness) -> None:
    """A fork of a turn whose model calls named long results by reference: the
    conversation before its step and the result served from the record are the whole
    documents, never their starts."""
    model = Reader(4, "read_document")
    async with harness.worker(model, ToolRegistry([read_document])) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await agents.start("read", model="scripted", limits=TurnLimits(max_steps=5))
        assert (await first.result()).answer == "end-of-0004"
        fork = await agents.rerun(first.id, from_step=3)
        result = await fork.result()
    assert result.outcome is Outcome.ANSWERED and result.answer == "end-of-0004"
    assert any(s.kind is StepKind.RECORDED and s.iteration == 3 for s in result.steps)
    assert model.read == [_document(n) for n in range(1, 5)]  # each whole


LOST: list[Path] = []
"""The payload store whose copy of document 1 `read_and_lose` deletes."""


@tool
def read_and_lose(args: Page, ctx: ToolContext[object]) -> str:
    """Document `n`; reading document 3 deletes the stored result that holds document 1."""
    if args.n == 3:
        for path in files_holding(LOST[0], b"end-of-0001"):
            path.unlink()
    return _document(args.n)


async def test_a_result_lost_from_the_store_ends_the_turn_not_a_loop(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model call that carries results by reference, on a worker that has none of them,
    reads them from the turn's record: one of them deleted from the store, the turn
    ends at once, `payload_unavailable`, its step saying which payload and store."""
    forget_every_conversation(monkeypatch)
    store = tmp_path / "payloads"
    monkeypatch.setenv("AGENT_PAYLOAD_STORE", f"local:{store}")
    monkeypatch.setattr(sys.modules[__name__], "LOST", [store])
    config = harness.client.config()
    config["data_converter"] = data_converter()
    harness = Harness(Client(**config), harness.store)
    model = Reader(5, "read_and_lose")
    output, _ = await harness.ask_with_handle(
        "read", model=model, tools=ToolRegistry([read_and_lose]), limits=TurnLimits(max_steps=6)
    )
    assert output.outcome is Outcome.PAYLOAD_UNAVAILABLE, output.answer
    assert len(model.read) == 2  # the calls before the loss only
    limits = [s.text for s in output.steps if s.kind is StepKind.LIMIT]
    said = [t for t in limits if t.startswith("payload store: ")]
    assert said and "is not in the payload store" in said[0] and str(store) in said[0], limits


@tool
def read_any_page(args: Page, ctx: ToolContext[object]) -> str:
    """Page 1 is short; any other, 100,000 characters. Not a quick read: a local
    activity's result enters the history as its workflow task ends, after the turn
    looked at the history's size, and a turn waiting for a person runs no other task."""
    return _page(args.n, 1000 if args.n == 1 else 100_000)


async def test_a_call_waits_for_consent_across_a_continue_as_new_and_runs_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round reads a long page and asks to write: the page pushes the history past
    the turn's threshold while the write waits for a person, so the turn continues as
    new with the write still waiting. Approved in the new run, it runs once."""
    monkeypatch.setenv("AGENT_PAYLOAD_STORE", "off")  # the page in the history, as before
    config = harness.client.config()
    config["data_converter"] = data_converter()
    harness = Harness(Client(**config), harness.store)
    write = ToolCall(
        id="w", name="start_return", arguments={"order_id": "123456", "reason": "damaged"}
    )
    page = ToolCall(id="p2", name="read_any_page", arguments={"n": 2})
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="p1", name="read_any_page", arguments={"n": 1})])],
        decisions=[Reply(calls=[page, write]), lambda req: Reply(text=last_result(req))],
    )
    limits = TurnLimits(continue_after_bytes=100_000)
    tools = ToolRegistry([read_any_page, *TOOLS.tools.values()])
    before = len(harness.store.returns_for("123456"))
    agents = AgentClient(harness.client)
    async with harness.worker(model, tools) as tq:
        turn = TurnInput(question="Return order 123456", model="scripted", limits=limits)
        handle = await start_turn(harness.client, turn, tq)
        first_run = (await handle.describe()).run_id
        progress = await until(handle, lambda p: p.pending and p.earlier_steps)
        # Still waiting, in the turn's second run; nothing was written.
        assert (await handle.describe()).run_id != first_run
        assert [p.call.id for p in progress.pending] == ["w"]
        assert len(harness.store.returns_for("123456")) == before
        await agents.turn(handle.id).approve(by="operator")
        result = await agents.turn(handle.id).result()
    assert result.outcome is Outcome.ANSWERED and result.runs == 2
    assert len(harness.store.returns_for("123456")) == before + 1  # once
    assert "rtn" in result.answer
    # One story: asked once (in the first run), decided and run once (in the second),
    # the page's result carried over from the first run.
    kinds = [(s.kind, s.calls[0].id if s.calls else "") for s in result.steps]
    assert kinds.count((StepKind.APPROVAL, "w")) == 1
    assert kinds.count((StepKind.DECISION, "w")) == 1
    assert kinds.count((StepKind.TOOL_CALL, "w")) == 1
    assert [s.iteration for s in result.steps if s.kind is StepKind.OBSERVATION] == [1, 2, 2]


def test_a_turn_may_be_allowed_ten_thousand_steps() -> None:
    assert TurnLimits(max_steps=10_000).max_steps == 10_000
    with pytest.raises(ValueError, match="less than or equal to 10000"):
        TurnLimits(max_steps=10_001)


async def test_a_turn_that_continued_as_new_rebuilds_its_conversation_from_its_runs(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker keeps a copy: every model call and every parse reads the conversation
    from the turn's record, across the runs it took; a reader of its stream sees one
    turn, offsets rising to its outcome."""
    forget_every_conversation(monkeypatch)
    pages = 12
    model = _reading(pages)
    limits = TurnLimits(max_steps=pages + 1, continue_after_events=60)
    async with harness.worker(model, ToolRegistry([read_page])) as tq:
        turn = TurnInput(question="read", model="scripted", limits=limits)
        handle = await start_turn(harness.client, turn, tq)
        seen = [item async for item in AgentClient(harness.client).turn(handle.id).events()]
        output = await handle.result()
    assert output.outcome is Outcome.ANSWERED and output.answer == f"end-of-page-{pages}"
    assert output.runs >= 3
    # Every call saw the whole conversation: the question, then 2 messages a round.
    assert [len(r.messages) for _, r in model.requests] == [1 + 2 * n for n in range(pages + 1)]
    offsets = [item.offset for item in seen]
    assert offsets == sorted(set(offsets))
    assert isinstance(seen[-1].event, DoneEvent) and seen[-1].event.answer == output.answer
    # Listed once, as it ended (its earlier runs are not turns of their own).
    agents = AgentClient(harness.client)
    for _ in range(200):
        rows = [r for r in await agents.find(limit=100) if r.workflow_id == handle.id]
        if [r.outcome for r in rows] == ["answered"]:
            break
        await asyncio.sleep(0.05)
    assert [(r.status, r.outcome) for r in rows] == [("done", "answered")]
