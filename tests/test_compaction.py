"""Compaction: a long turn's conversation stays within the model's context window.
Older tool results are shortened first; when that is not enough, older exchanges are
summarised by a model call that is a step of the turn; the question and the calls a
person consented to are never lost."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from durable_agent import Agent, Compaction, compaction
from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage, check
from durable_agent.errors import ModelCannotAnswer
from durable_agent.model import ModelRequest, Reply
from durable_agent.runtime.turns import decide, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import TOOLS
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits
from tests.conftest import Harness
from tests.test_approvals import awaiting, until

POLICY = Compaction()


def _round(n: int, text: str) -> list[Message]:
    call = ToolCall(id=f"c{n}", name="read", arguments={"n": n})
    return [
        AssistantMessage(calls=[call]),
        ToolResult(call_id=f"c{n}", tool="read", ok=True, text=text),
    ]


def _conversation(rounds: int, size: int) -> list[Message]:
    messages: list[Message] = [UserMessage(text="read them all")]
    for n in range(1, rounds + 1):
        messages += _round(n, f"start-{n} " + "x" * (size - 20) + f" end-{n}")
    return messages


def test_a_shortened_result_keeps_its_start_and_its_end() -> None:
    text = "start " + "x" * 10_000 + " end"
    cut = compaction.shorten(text, 600)
    assert cut.startswith("start ") and cut.endswith(" end")
    assert "characters left out to fit the model's context" in cut
    assert len(cut) < 700
    assert compaction.shorten("short", 600) == "short"


def test_a_conversation_that_fits_is_sent_as_it_is() -> None:
    messages = _conversation(3, 1_000)
    fitted = compaction.fit(messages, POLICY, 32_000, 100)
    assert fitted.messages == messages and fitted.shortened == 0 and not fitted.full


def test_older_results_are_shortened_oldest_first_in_blocks() -> None:
    messages = _conversation(40, 3_000)  # about 40,000 tokens
    fitted = compaction.fit(messages, POLICY, 32_000, 100)
    check(fitted.messages)
    assert fitted.tokens <= 32_000 - POLICY.reply_tokens
    results = [m.text for m in fitted.messages if isinstance(m, ToolResult)]
    cut = [i for i, t in enumerate(results) if "left out" in t]
    # A whole block of the oldest, never the latest round.
    assert cut == list(range(len(cut))) and len(cut) % compaction.BLOCK == 0
    assert results[-1] == messages[-1].text
    # Each keeps its start and its end; the question is untouched.
    assert all(
        t.startswith(f"start-{i + 1} ") and t.endswith(f"end-{i + 1}")
        for i, t in enumerate(results)
    )
    assert fitted.messages[0] == messages[0]
    # The next call, one round later, keeps the same prefix (a prompt cache still hits).
    later = compaction.fit([*messages, *_round(41, "y" * 3_000)], POLICY, 32_000, 100)
    assert later.messages[: len(messages) - 2] == fitted.messages[: len(messages) - 2]


def test_a_conversation_full_even_when_shortened_asks_for_a_summary() -> None:
    messages = _conversation(200, 3_000)
    fitted = compaction.fit(messages, POLICY, 32_000, 100)
    assert fitted.full and fitted.tokens <= 32_000


def test_a_latest_result_longer_than_the_window_is_shortened_too() -> None:
    messages = _conversation(1, 200_000)
    fitted = compaction.fit(messages, POLICY, 32_000, 100)
    assert fitted.tokens <= 32_000 - POLICY.reply_tokens
    assert fitted.messages[-1].text.endswith("end-1")


def test_a_question_longer_than_the_window_gets_one_clear_error() -> None:
    with pytest.raises(ModelCannotAnswer, match="window is 32,000"):
        compaction.fit([UserMessage(text="q" * 200_000)], POLICY, 32_000, 100)


def test_the_window_comes_from_the_agent_else_the_model() -> None:
    model = ScriptedModel()
    assert compaction.window_of(model, POLICY) == 32_000
    assert compaction.window_of(model, Compaction(window=8_192, reply_tokens=1_000)) == 8_192
    assert compaction.window_of(model, None) is None
    assert compaction.window_of(ScriptedModel(context_window=None), POLICY) is None
    with pytest.raises(ValueError, match="reply_tokens"):
        Compaction(window=4_000)
    with pytest.raises(ValueError, match="compaction must be a Compaction"):
        Agent(name="a", compaction=8_000)  # type: ignore[arg-type]


class Page(BaseModel):
    n: int


PAGE_CHARS = 6_000
QUESTION = "Read the documents; order 123456 came damaged."


@tool
def read_doc(args: Page, ctx: ToolContext[object]) -> str:
    """A 6,000-character document whose last word names it."""
    return "w" * (PAGE_CHARS - 20) + f" end-of-doc-{args.n}"


@tool
def read_note(args: Page, ctx: ToolContext[object]) -> str:
    """A 1,500-character note whose last word names it."""
    return "w" * 1_480 + f" end-of-doc-{args.n}"


class Reader:
    """Reads documents 1..`pages` one a round (the next is the last read's n + 1, so it
    needs no count of the results a summary replaced), starting a return at `write_at`;
    then answers with the last result's last word. It measures every request."""

    provider = "scripted"
    name = "window-reader"

    def __init__(self, pages: int, window: int, write_at: int, tool: str = "read_doc") -> None:
        self.pages, self.context_window, self.write_at = pages, window, write_at
        self.tool = tool
        self.largest = 0
        self.summaries = 0
        self.saw_summary = False
        self.requests: list[ModelRequest] = []

    async def plan(self, request: ModelRequest, stream: object = None) -> Reply:
        return self._next(request)

    async def interpret(self, request: ModelRequest, stream: object = None) -> Reply:
        return self._next(request)

    async def summarise(self, request: ModelRequest, stream: object = None) -> Reply:
        self.summaries += 1
        return Reply(text=compaction.digest(request.question, 2_000))

    def _next(self, request: ModelRequest) -> Reply:
        size = compaction.overhead(request.instructions, request.tools)
        size += sum(compaction.message_tokens(m) for m in request.messages)
        self.largest = max(self.largest, size)
        self.requests.append(request)
        opening = request.messages[1].text if len(request.messages) > 1 else ""
        self.saw_summary |= compaction.SUMMARY_MARK in opening
        reads = [
            c.arguments["n"]
            for m in request.messages
            if isinstance(m, AssistantMessage)
            for c in m.calls
            if c.name == self.tool
        ]
        n = reads[-1] + 1 if reads else 1
        last = request.messages[-1]
        if n == self.write_at and not (
            isinstance(last, ToolResult) and last.tool == "start_return"
        ):
            write = {"order_id": "123456", "reason": "damaged"}
            return Reply(calls=[ToolCall(id="w", name="start_return", arguments=write)])
        if n <= self.pages:
            return Reply(calls=[ToolCall(id=f"c{n}", name=self.tool, arguments={"n": n})])
        return Reply(text=last.text.split()[-1])


async def test_a_long_turn_compacts_and_the_model_never_sees_more_than_its_window(
    harness: Harness,
) -> None:
    """60 rounds of 6 KB documents through a model with a 16,000-token window (the
    documents alone are 120,000): older results are shortened, then summarised in steps
    of the turn's own; the model never got more than its window, the answer uses the
    last result, and the write a person approved stands word for word in the summary."""
    pages, window = 60, 16_000
    model = Reader(pages, window, write_at=3)
    tools = ToolRegistry([read_doc, *TOOLS.tools.values()])
    before = len(harness.store.returns_for("123456"))
    limits = TurnLimits(max_steps=pages + 5, max_duration=timedelta(minutes=10))
    async with harness.worker(model, tools) as tq:
        turn = TurnInput(question=QUESTION, model="scripted", limits=limits)
        handle = await start_turn(harness.client, turn, tq)
        await until(handle, awaiting)
        await decide(harness.client, handle.id, None, approved=True, by="operator")
        result = await handle.result()
    assert result.outcome is Outcome.ANSWERED, result.answer
    assert result.answer == f"end-of-doc-{pages}"
    assert model.largest <= window - Compaction().reply_tokens
    compacted = [s for s in result.steps if s.kind is StepKind.COMPACT]
    assert compacted and model.summaries == len(compacted) and model.saw_summary
    assert all("earlier messages summarised" in s.text for s in compacted)
    assert len(harness.store.returns_for("123456")) == before + 1
    # The question opens every request; the approved write is kept word for word.
    assert all(r.messages[0] == UserMessage(text=QUESTION) for r in model.requests)
    last = model.requests[-1].messages[1].text
    assert compaction.SUMMARY_MARK in last
    assert "Calls made with a person's consent:" in last and "start_return(" in last
    # The summary call is a step of its own in the history: an activity, recorded.
    history = await handle.fetch_history()
    kinds = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert kinds.count("compact") == len(compacted)


async def test_compaction_can_be_switched_off(harness: Harness) -> None:
    """With no compaction the conversation goes as it is, past the model's window."""
    model = Reader(12, 12_000, write_at=0)
    agent = Agent(
        name="reader",
        tools=ToolRegistry([read_doc]),
        model="scripted",
        compaction=None,
    )
    async with harness.worker(model, agents=[agent]) as tq:
        limits = TurnLimits(max_steps=20)
        turn = TurnInput(question="Read", model="scripted", agent="reader", limits=limits)
        handle = await start_turn(harness.client, turn, tq)
        result = await handle.result()
    assert result.outcome is Outcome.ANSWERED and result.answer == "end-of-doc-12"
    assert model.largest > 12_000 and model.summaries == 0


def test_consented_calls_stay_in_every_summary_within_a_bound() -> None:
    """A consented call's result, however long or many-lined, is one bounded line;
    a later summary keeps what an earlier one kept; the block keeps its latest calls."""
    write = ToolCall(id="w1", name="start_return", arguments={"order_id": "123456"})
    older: list[Message] = [
        AssistantMessage(calls=[write]),
        ToolResult(call_id="w1", tool="start_return", ok=True, text="Return rtn005\n" * 5_000),
    ]
    block = compaction.consented(older, ["w1"])
    [line] = block.splitlines()[1:]
    assert line.startswith('- start_return({"order_id": "123456"}) → Return rtn005')
    assert len(line) < compaction.CONSENTED_RESULT_CHARS + 200
    later = [AssistantMessage(text=compaction.opening("summary", block), calls=[write])]
    assert compaction.consented(later, ["w1"]).splitlines()[1] == line
    many = [
        m
        for n in range(200)
        for m in (
            AssistantMessage(calls=[write.model_copy(update={"id": f"w{n}"})]),
            ToolResult(call_id=f"w{n}", tool="start_return", ok=True, text=f"r{n} " + "x" * 900),
        )
    ]
    bounded = compaction.consented(many, [f"w{n}" for n in range(200)])
    assert len(bounded) <= compaction.CONSENTED_CHARS + 100
    assert bounded.splitlines()[-1].startswith('- start_return({"order_id": "123456"}) → r199 ')
