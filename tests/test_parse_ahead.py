"""A model call made as a local activity parses its reply's calls itself
(`ModelCallInput.parse`): on a real server, a turn records what a turn that parses
in an activity of its own records, with one local activity a step fewer; a parse
that fails there costs the reply nothing (the turn parses the calls itself, failing
closed as before); and a reply the turn will not parse is not parsed."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.history.v1 import HistoryEvent

from durable_agent.activities import parse
from durable_agent.activities._common import within
from durable_agent.activities._conversation import local_result
from durable_agent.agents import Agent
from durable_agent.errors import AgentError
from durable_agent.model import Reply
from durable_agent.runtime.turns import start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shields import ShieldRequest, Verdict
from durable_agent.shop import ShopStore
from durable_agent.types import Outcome, StepKind, TurnInput, TurnLimits
from durable_agent.workflows.policies import PARSE_TIMEOUT
from tests.conftest import Harness
from tests.test_rewind import LOOKUP, QUESTION, TOOLS_AND_STOCK, WAIVED, three_steps
from tests.test_shields_turn import Keyword, at


def locals_run(events: list[HistoryEvent]) -> list[str]:
    """The local activities a history records, in order."""
    return [found[0] for e in events if (found := local_result(e)) is not None]


def recorded(result: Any) -> list[tuple[int, StepKind, str]]:
    return [(s.iteration, s.kind, s.text) for s in result.steps]


def agent_of(harness: Harness, how: str, shield: object, db: Path) -> Agent:
    agent = harness.agent(TOOLS_AND_STOCK, approvals=WAIVED, shields=at("tool_input", shield))
    return replace(agent, model_calls=how, deps=ShopStore(db))


async def test_a_local_call_parses_its_reply_and_the_turn_records_the_same(
    harness: Harness, tmp_path: Path
) -> None:
    """The same three steps (a lookup, a waived write, a read the shield blocks),
    model calls as activities (parse runs on its own) and as local activities (each
    parses its reply): the same steps, shield verdicts and consent decisions."""
    seen = {}
    for how in ("activity", "local"):
        model, shield = three_steps(), Keyword(r"^stock\(")
        agent = agent_of(harness, how, shield, tmp_path / f"{how}.db")
        async with harness.worker(model, agents=[agent]) as task_queue:
            turn = TurnInput(question=QUESTION, model="scripted")
            handle = await start_turn(harness.client, turn, task_queue)
            result = await handle.result()
        events = list((await handle.fetch_history()).events)
        seen[how] = result, model, shield, events
    (theirs, their_model, their_shield, their_events) = seen["activity"]
    (result, model, shield, events) = seen["local"]
    assert result.outcome is Outcome.ANSWERED and result.answer == theirs.answer
    assert recorded(result) == recorded(theirs)
    assert any(s.kind is StepKind.SHIELD and "matched" in s.text for s in result.steps)
    assert [r.messages for _, r in model.requests] == [r.messages for _, r in their_model.requests]
    assert [(r.text, r.context) for r in shield.seen] == [
        (r.text, r.context) for r in their_shield.seen
    ]
    # Three rounds: parsed as its own local activity each time, or not once.
    assert locals_run(their_events).count("parse") == 3
    assert "parse" not in locals_run(events)
    assert locals_run(events).count("plan") + locals_run(events).count("interpret") == 4
    assert len(events) < len(their_events)


class FailsOnce:
    """A tool-input shield whose first check fails (its own bug: not retried)."""

    name = "fails_once"

    def __init__(self) -> None:
        self.checks = 0

    async def check(self, request: ShieldRequest) -> Verdict:
        self.checks += 1
        if self.checks == 1:
            raise AgentError("the shield's own bug, once")
        return Verdict(shield=self.name)


async def test_a_parse_that_fails_in_the_model_call_keeps_the_reply(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The model call returns its reply all the same (it is not made again), and the
    turn parses the calls in its own activity, which screens them."""
    model = ScriptedModel(plans=[Reply(calls=[LOOKUP])], decisions=[Reply(text="Shipped.")])
    shield = FailsOnce()
    agent = agent_of(harness, "local", shield, tmp_path / "shop.db")
    async with harness.worker(model, agents=[agent]) as task_queue:
        turn = TurnInput(question=QUESTION, model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        result = await handle.result()
    events = list((await handle.fetch_history()).events)
    assert result.outcome is Outcome.ANSWERED and result.answer == "Shipped."
    assert len(model.requests) == 2  # plan once, interpret once: no call made twice
    assert locals_run(events) == ["shield", "plan", "parse", "dispatch", "interpret", "shield"]
    assert shield.checks == 2
    assert [s.text for s in result.steps if s.kind is StepKind.SHIELD] == [
        "tool_input order_status(order_id='123456'): allowed by fails_once"
    ]
    assert "parse with the model call failed (AgentError)" in caplog.text


async def test_a_reply_past_the_step_limit_is_not_parsed(harness: Harness, tmp_path: Path) -> None:
    """The turn stops before parsing calls past `max_steps`: their model call does not
    screen them either."""
    model = ScriptedModel(plans=[Reply(calls=[LOOKUP])], decisions=[Reply(calls=[LOOKUP])])
    shield = Keyword("nothing matches this")
    agent = agent_of(harness, "local", shield, tmp_path / "shop.db")
    async with harness.worker(model, agents=[agent]) as task_queue:
        turn = TurnInput(question=QUESTION, model="scripted", limits=TurnLimits(max_steps=1))
        result = await (await start_turn(harness.client, turn, task_queue)).result()
    assert result.outcome is Outcome.STEP_LIMIT
    assert len(model.requests) == 2
    assert len(shield.seen) == 1  # the plan's call only


def test_a_model_call_gives_parse_the_turns_parse_timeout() -> None:
    assert PARSE_TIMEOUT.total_seconds() == parse.AHEAD_TIMEOUT_S


async def test_the_parse_with_the_model_call_is_timed_in_the_calls_own_task() -> None:
    """`within` (the timeout of the parse with the model call, and of a result's screen
    in dispatch) returns what it waits for and ends it past its time; where Python has
    `asyncio.timeout`, it waits in the activity's own task: no task, no hop through the
    worker's event loop."""

    async def whose() -> asyncio.Task[Any] | None:
        await asyncio.sleep(0)
        return asyncio.current_task()

    waited = await within(whose(), 1.0)
    if sys.version_info >= (3, 11):
        assert waited is asyncio.current_task()
    with pytest.raises(asyncio.TimeoutError):
        await within(asyncio.sleep(5), 0.05)
