"""Long-horizon turns: tool results reach the model whole (up to a per-tool limit),
and the story shows a preview of each."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from pydantic import BaseModel
from temporalio.client import WorkflowHandle

from durable_agent import transcript
from durable_agent.activities import ModelCallInput
from durable_agent.approval import ApprovalPolicy
from durable_agent.model import ModelRequest, Reply
from durable_agent.render import PREVIEW_CHARS, TRUNCATION_MARKER
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.turns import decide, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shields import ShieldRequest, ShieldSettings, Verdict
from durable_agent.shop import TOOLS
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, ToolCall, TurnInput
from tests.conftest import Harness, last_result
from tests.test_approvals import awaiting, until


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


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "rebuilt"])
async def test_a_model_call_carries_only_what_is_new(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    """Each message enters the history once; the activity puts the conversation
    together, from its worker's copy or (none kept) from the run's record."""
    if not kept:
        monkeypatch.setattr(transcript, "MAX_TURNS", 0)
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
        monkeypatch.setattr(transcript, "MAX_TURNS", 0)
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
