"""Tests of the help desk agent with `durable_agent.testing`: copy this file beside your
own agent and change what it asks (docs/testing.md).

    pip install "durable-agent[testing]"
    python -m pytest test_helpdesk.py        # in this folder: a few seconds
    python test_helpdesk.py                  # records the turns in histories/ again

Every test starts a Temporal server of its own (the time-skipping test server; the dev
server where a test says so), a worker serving the agent with a test model instead of
its own, and a client: the turns are real workflows, their waits real timers.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from desk import Desk
from helpdesk import agent

from durable_agent import Principal, TurnLimits
from durable_agent.testing import (
    FunctionModel,
    ModelRequest,
    Reply,
    TestModel,
    ToolCall,
    agent_test,
    check_replays,
    latest_results,
    record_turn,
)

# The `agent_test` fixture: the `agent_test` imported above (used outside tests, below),
# with the worker's own files in each test's temporary folder.
pytest_plugins = ["durable_agent.testing.pytest"]

HISTORIES = Path(__file__).with_name("histories")
NEW_TICKET = "Please open a ticket: my laptop will not boot."


@pytest.fixture(autouse=True)
def desk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Desk:
    """A fresh copy of the help desk's data for each test (the worker opens it)."""
    monkeypatch.setenv("HELPDESK_DB", str(tmp_path / "helpdesk.db"))
    return Desk.open()


# -- TestModel: each tool called once, with arguments valid for its schema ---------------


async def test_the_read_tools_answer(agent_test) -> None:
    model = TestModel(call_tools=["ticket_status", "service_status"])
    async with agent_test(agent, model=model) as t:
        result = await t.client.ask("Is the VPN down? And what about ticket INC-1001?")

    assert result.answered
    assert "service_status: Service: vpn. Status: degraded." in result.answer
    assert "ticket_status: Ticket id: INC-1001. Title: VPN drops every few minutes." in (
        result.answer
    )


async def test_a_ticket_id_nobody_gave_is_blocked_before_the_tool_runs(agent_test) -> None:
    """The model makes one up (TestModel's INC-0000): the offline shield stops the call."""
    async with agent_test(agent, model=TestModel(call_tools=["ticket_status"])) as t:
        result = await t.client.ask("How are my tickets doing?")

    assert "ticket_status: blocked by the offline shield (foreign_id)" in result.answer


# -- FunctionModel: replies from a function of the turn's conversation -------------------


def desk_model(request: ModelRequest) -> Reply:
    """Looks up the ticket or service the question names, then answers with what the
    tool said. It decides from this turn's conversation alone (no state of its own)."""
    results = latest_results(request.messages)
    if results:
        return Reply(text=" ".join(r.text for r in results))
    ticket = re.search(r"\bINC-\d{4}\b", request.question, re.IGNORECASE)
    if ticket:
        call = ToolCall(id="t1", name="ticket_status", arguments={"ticket_id": ticket[0]})
        return Reply(calls=[call])
    for service in ("email", "vpn", "wiki", "payroll"):
        if service in request.question.lower():
            call = ToolCall(id="s1", name="service_status", arguments={"service": service})
            return Reply(calls=[call])
    return Reply(text="Sorry, the help desk can only help with IT tickets and services.")


async def test_a_function_model_looks_up_what_the_question_names(agent_test) -> None:
    async with agent_test(agent, model=FunctionModel(desk_model)) as t:
        result = await t.client.ask("Any news on INC-1002?")

    assert result.answer.startswith("Ticket id: INC-1002. Title: New monitor for desk 4.12.")
    assert [c.name for s in result.steps for c in s.calls if s.kind == "tool_call"] == [
        "ticket_status"
    ]


async def test_turns_at_once_each_see_only_their_own_conversation(agent_test) -> None:
    async with agent_test(agent, model=FunctionModel(desk_model)) as t:
        vpn, email, payroll = await asyncio.gather(
            t.client.ask("Is the VPN down?"),
            t.client.ask("Is email working?"),
            t.client.ask("Is payroll up?"),
        )

    assert vpn.answer.startswith("Service: vpn. Status: degraded.")
    assert email.answer == "Service: email. Status: operational."
    assert payroll.answer.startswith("Service: payroll. Status: maintenance.")


# -- consent: a write waits for a person ------------------------------------------------


async def test_a_new_ticket_is_opened_once_approved(agent_test, desk: Desk) -> None:
    async with agent_test(agent, model=TestModel(call_tools=["open_ticket"])) as t:
        turn = await t.client.start(NEW_TICKET)
        [waiting] = await t.waiting(turn)
        assert waiting.call.name == "open_ticket"
        assert desk.tickets_opened("demo") == 0  # nothing written while it waits
        await turn.approve(waiting.call.id, by="alice")
        result = await turn.result()

    assert "open_ticket: Ticket id: INC-1004." in result.answer
    assert desk.tickets_opened("demo") == 1


async def test_a_declined_ticket_is_not_opened(agent_test, desk: Desk) -> None:
    async with agent_test(agent, model=TestModel(call_tools=["open_ticket"])) as t:
        turn = await t.client.start(NEW_TICKET)
        [waiting] = await t.waiting(turn)
        await turn.reject(waiting.call.id, by="alice", reason="use the self-service portal")
        result = await turn.result()

    assert "declined" in result.answer and "use the self-service portal" in result.answer
    assert desk.tickets_opened("demo") == 0


async def test_nobody_decides_within_three_days(agent_test, desk: Desk) -> None:
    """The turn waits 3 days of workflow time for a decision: the time-skipping server
    skips them while the test waits for the result."""
    limits = TurnLimits(approval_timeout=timedelta(days=3))
    async with agent_test(agent, model=TestModel(call_tools=["open_ticket"])) as t:
        turn = await t.client.start(NEW_TICKET, limits=limits)
        await t.waiting(turn)
        result = await turn.result()
        took = await t.workflow_time(turn)

    assert "nobody approved open_ticket" in result.answer and "within 72 h" in result.answer
    assert took >= timedelta(days=3)
    assert desk.tickets_opened("demo") == 0


async def test_the_waiting_ticket_is_listed_for_the_people_who_decide(agent_test) -> None:
    # Every turn's waiting calls are listed by the server's visibility store: the dev
    # server's (the time-skipping one has none).
    model = TestModel(call_tools=["open_ticket"])
    async with agent_test(agent, model=model, server="dev") as t:
        turn = await t.client.start(NEW_TICKET)
        await t.waiting(turn)
        listed = await t.client.pending()
        for _ in range(100):  # the server's visibility store lists it a moment later
            if listed:
                break
            await asyncio.sleep(0.1)
            listed = await t.client.pending()
        await turn.reject(by="test")

    assert [(p.workflow_id, p.approval.call.name) for p in listed] == [(turn.id, "open_ticket")]


def refund_model(request: ModelRequest) -> Reply:
    """Refunds the amount and charge the question names, then says what the tool said."""
    results = latest_results(request.messages)
    if results:
        return Reply(text=" ".join(r.text for r in results))
    asked = re.search(r"refund (\d+\.\d\d) of (CHG-\d{4})", request.question)
    assert asked is not None, request.question
    arguments = {"charge_id": asked[2], "amount": asked[1], "reason": "it broke"}
    return Reply(calls=[ToolCall(id="r1", name="refund", arguments=arguments)])


async def test_a_refund_is_bounded_by_the_charge_and_only_of_ones_own(
    agent_test, desk: Desk
) -> None:
    """Ada's headset cost 89.00: 45.00 back, then 60.00 more is refused (44.00 is left),
    and another person's charge reads as no charge at all."""
    ada = Principal(tenant="acme", user="ada")
    said = []
    async with agent_test(agent, model=FunctionModel(refund_model)) as t:
        for question in (
            "Please refund 45.00 of CHG-5002.",
            "Please refund 60.00 of CHG-5002.",
            "Please refund 10.00 of CHG-5001.",  # demo's
        ):
            turn = await t.client.start(question, principal=ada)
            [waiting] = await t.waiting(turn)
            await turn.approve(waiting.call.id, by="lee")
            said.append((await turn.result()).answer)

    assert said[0].startswith("Charge id: CHG-5002. Refunded: 45.00. Charge: 89.00. Left: 44.00.")
    assert said[1] == (
        "Cannot refund 60.00 of CHG-5002: 44.00 of its 89.00 is left to refund, and one "
        "refund is at most 200.00."
    )
    assert said[2] == "No charge CHG-5001 of yours. Please check its id."
    assert desk.refunds("CHG-5002") == [4500] and desk.refunds("CHG-5001") == []


# -- the replay gate: recorded turns continue on the code installed now ------------------


async def record_scenarios(folder: Path) -> None:
    """The turns the gate keeps: a lookup, and a ticket opened with consent."""
    async with agent_test(agent, model=TestModel(call_tools=["service_status"])) as t:
        vpn = await t.client.start("Is the VPN down?")
        await vpn.result()
        await record_turn(vpn, folder, "vpn_status")
    async with agent_test(agent, model=TestModel(call_tools=["open_ticket"])) as t:
        ticket = await t.client.start(NEW_TICKET)
        [waiting] = await t.waiting(ticket)
        await ticket.approve(waiting.call.id, by="recorder")
        await ticket.result()
        await record_turn(ticket, folder, "ticket_approved")


async def test_the_stored_turns_replay_on_this_code() -> None:
    await check_replays(HISTORIES, agent)


async def test_turns_recorded_now_replay(tmp_path: Path) -> None:
    await record_scenarios(tmp_path / "histories")
    replayed = await check_replays(tmp_path / "histories", agent)
    assert [p.name for p in replayed] == ["ticket_approved.json", "vpn_status.json"]


if __name__ == "__main__":  # record histories/ again (then commit it)
    os.environ.setdefault("HELPDESK_DB", str(Path(tempfile.mkdtemp()) / "helpdesk.db"))
    asyncio.run(record_scenarios(HISTORIES))
