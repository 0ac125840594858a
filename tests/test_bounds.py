"""What a model's reply and a round of results may bring into a turn: a reply of
thousands of calls, a megabyte of arguments and a round of large results each end
their step gracefully, and the turn answers (nothing wedges its workflow task)."""

from __future__ import annotations

import json
import random

from pydantic import BaseModel

from durable_agent.bounds import (
    MAX_ARGUMENTS_CHARS,
    MAX_ROUND_RESULTS_CHARS,
    MEMO_CALL_CHARS,
    bounded_reply,
    fit_round,
    for_memo,
)
from durable_agent.conversation import latest_results
from durable_agent.model import ModelRequest, Reply
from durable_agent.render import TRUNCATION_MARKER
from durable_agent.scripted import ScriptedModel
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Observation, Outcome, PendingApproval, StepKind, ToolCall
from tests.conftest import Harness


class Page(BaseModel):
    n: int


class Note(BaseModel):
    text: str


def count(calls: int) -> list[ToolCall]:
    return [ToolCall(id=f"c{i}", name="page", arguments={"n": i}) for i in range(calls)]


def test_calls_past_the_cap_get_one_refusal() -> None:
    bounded = bounded_reply(Reply(calls=count(10_000)), max_calls=64)
    assert [c.id for c in bounded.calls] == [f"c{i}" for i in range(65)]
    assert all(c.error is None for c in bounded.calls[:64])
    last = bounded.calls[64]
    assert last.arguments == {} and last.error is not None
    assert "made 10,000 tool calls" in last.error and "the 9,935 after it" in last.error


def test_a_call_over_its_argument_bound_is_refused_and_the_others_kept() -> None:
    big = ToolCall(id="big", name="note", arguments={"text": "x" * (MAX_ARGUMENTS_CHARS + 1)})
    small = ToolCall(id="small", name="note", arguments={"text": "hello"})
    bounded = bounded_reply(Reply(text="two notes", calls=[big, small]))
    assert bounded.calls[0].arguments == {} and "over the 100,000" in str(bounded.calls[0].error)
    assert bounded.calls[1] == small
    # Within bounds: the very same reply.
    within = Reply(calls=[small])
    assert bounded_reply(within) is within


def test_a_round_of_results_fits_its_budget_fairly() -> None:
    rng = random.Random(7)
    for _ in range(200):
        sizes = [rng.choice([10, 5_000, 90_000, 250_000]) for _ in range(rng.randint(1, 40))]
        results = {
            f"c{i}": Observation(call_id=f"c{i}", tool="t", ok=True, text="y" * n)
            for i, n in enumerate(sizes)
        }
        fitted = fit_round(results, budget=MAX_ROUND_RESULTS_CHARS)
        marker = len(TRUNCATION_MARKER.format(n=10**6))
        assert sum(len(o.text) for o in fitted.values()) <= MAX_ROUND_RESULTS_CHARS + marker * len(
            sizes
        )
        # Results smaller than every cut one are whole; a cut one says it was cut.
        cut = [k for k in results if fitted[k].text != results[k].text]
        if cut:
            smallest_cut = min(len(results[k].text) for k in cut)
            whole = [k for k in results if len(results[k].text) < smallest_cut]
            assert all(fitted[k] == results[k] for k in whole)
            assert all("[truncated" in fitted[k].text for k in cut)
        else:
            assert sum(sizes) <= MAX_ROUND_RESULTS_CHARS


@tool(quick=True)
def page(args: Page, ctx: ToolContext[object]) -> str:
    """One page of a long document."""
    return f"page {args.n}: " + "z" * 90_000


@tool(quick=True)
def note(args: Note, ctx: ToolContext[object]) -> str:
    """Keep a note."""
    return f"noted {len(args.text)} characters"


async def test_a_reply_of_ten_thousand_calls_ends_its_round_and_the_turn_answers(
    harness: Harness,
) -> None:
    def after(request: ModelRequest) -> Reply:
        results = latest_results(request.messages)
        return Reply(text=f"{len(results)} results; last: {results[-1].text[:120]}")

    model = ScriptedModel(plans=[Reply(calls=count(10_000))], decisions=[after])
    result = await harness.ask("read everything", model=model, tools=ToolRegistry([page]))
    assert result.outcome is Outcome.ANSWERED
    assert result.answer.startswith("65 results; last: ")
    assert "this reply made 10,000 tool calls" in result.answer
    rejected = [s for s in result.steps if s.kind is StepKind.REJECTED]
    assert len(rejected) == 1
    # 64 results of 90 KB: the model read them within the round's budget, each cut alike.
    (_, request) = model.requests[-1]
    texts = [r.text for r in latest_results(request.messages)]
    assert sum(len(t) for t in texts) < MAX_ROUND_RESULTS_CHARS + 65 * 40
    assert all("[truncated" in t for t in texts[:64])


async def test_a_megabyte_argument_is_refused_and_the_model_goes_on(harness: Harness) -> None:
    huge = ToolCall(id="c1", name="note", arguments={"text": "q" * 1_048_576})
    retry = ToolCall(id="c2", name="note", arguments={"text": "a short note"})
    model = ScriptedModel(
        plans=[Reply(calls=[huge]), Reply(calls=[retry])],
        decisions=[lambda r: Reply(text=latest_results(r.messages)[-1].text)],
    )
    result = await harness.ask("keep this note", model=model, tools=ToolRegistry([note]))
    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "noted 12 characters"
    rejected = [s.text for s in result.steps if s.kind is StepKind.REJECTED]
    assert len(rejected) == 1 and "1,048," in rejected[0] and "over the 100,000" in rejected[0]


@tool()
def dump(args: Page, ctx: ToolContext[object]) -> str:
    """A tool whose result is far over every limit (a whole database, say)."""
    return "d" * 3_000_000


async def test_a_result_of_megabytes_reaches_the_model_cut_and_the_turn_answers(
    harness: Harness,
) -> None:
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="dump", arguments={"n": 1})])],
        decisions=[lambda r: Reply(text=f"read {len(latest_results(r.messages)[-1].text)}")],
        context_window=None,  # the agent's result limit, not a window, cuts it here
    )
    result = await harness.ask("dump it all", model=model, tools=ToolRegistry([dump]))
    assert result.outcome is Outcome.ANSWERED
    shown = int(result.answer.split()[1])
    assert 100_000 <= shown < 100_100  # the agent's limit, and the truncation marker


def test_a_call_awaiting_a_decision_is_bounded_in_the_memo() -> None:
    """The memo lists every call of a round awaiting consent: each stays small, so 512
    of them with 100,000-character arguments are one payload well under 2 MB."""
    from datetime import datetime, timezone

    big = ToolCall(id="c1", name="note", arguments={"text": "x" * 100_000})
    waiting = PendingApproval(call=big, why="w" * 5_000, since=datetime.now(timezone.utc))
    memo = for_memo(waiting)
    assert memo["call"]["id"] == "c1" and memo["call"]["name"] == "note"  # type: ignore[index]
    assert len(json.dumps(memo)) < 3 * MEMO_CALL_CHARS
    assert "[truncated" in memo["call"]["arguments"]["arguments"]  # type: ignore[index]
    small = PendingApproval(
        call=ToolCall(id="c2", name="note", arguments={"text": "hi"}),
        why="it writes",
        since=waiting.since,
    )
    assert PendingApproval.model_validate(for_memo(small)) == small
