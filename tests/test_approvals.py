"""Consent before side effects, on real servers: a call that writes waits, durably,
for a person's decision; approved it runs exactly once, declined or expired it
never runs and the model is told; the wait survives a killed worker and a
restarted server, and costs the turn's `max_duration` nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.approval import ApprovalPolicy
from durable_agent.model import Reply
from durable_agent.runtime import turns
from durable_agent.runtime.codec import LEAN_DATA_CONVERTER
from durable_agent.runtime.server import EmbeddedServer, free_port
from durable_agent.runtime.turns import (
    AgentClientError,
    decide,
    find_turns,
    pending,
    progress_of,
    start_turn,
)
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import ShopStore
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits, TurnProgress
from durable_agent.workflows import AgentTurn, search
from tests.conftest import Harness, connect_when_ready, kinds, last_result, story

ROOT = Path(__file__).resolve().parent.parent
RETURN = ToolCall(
    id="c1", name="start_return", arguments={"order_id": "123456", "reason": "arrived damaged"}
)
LOOKUP = ToolCall(id="c2", name="order_status", arguments={"order_id": "234567"})


def model(*calls: ToolCall) -> ScriptedModel:
    """Asks for `calls` at once, then answers with the last result it got."""
    return ScriptedModel(
        plans=[Reply(calls=list(calls))], decisions=[lambda req: Reply(text=last_result(req))]
    )


async def until(handle: WorkflowHandle, ready, timeout: float = 30) -> TurnProgress:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        progress = await progress_of(handle)
        if ready(progress):
            return progress
        assert time.monotonic() < deadline, [s.render() for s in progress.steps]
        await asyncio.sleep(0.1)


def awaiting(progress: TurnProgress) -> bool:
    return bool(progress.pending)


def new_returns(store: ShopStore) -> list[str]:
    return [r.return_id for r in store.returns_for("123456")]


async def test_approved_call_runs_exactly_once(harness: Harness) -> None:
    scripted = model(RETURN)
    async with harness.worker(scripted) as task_queue:
        turn = TurnInput(question="Return order 123456, it arrived damaged.", model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        progress = await until(handle, awaiting)
        (waiting,) = progress.pending
        assert waiting.call.render() == RETURN.render()
        assert waiting.why == (
            "it writes: Start (create) a return for a shipped or delivered order, with the "
            "reason the customer wants to send the item back; it will: start a return of "
            "order 123456 (2 × Herbal Handsoap, $19.98) because: arrived damaged"
        )
        assert new_returns(harness.store) == []  # nothing written while it waits

        decided = await decide(harness.client, handle.id, None, approved=True, by="alice")
        assert decided.approved and decided.tool == "start_return"
        result = await handle.result()

    assert result.outcome is Outcome.ANSWERED
    assert kinds(result) == ["plan", "approval", "decision", "tool_call", "observation", "answer"]
    assert story(result)[2].text == "start_return: approved by alice"
    (created,) = new_returns(harness.store)
    assert created in result.answer


async def test_declined_call_never_runs_and_the_model_is_told(harness: Harness) -> None:
    scripted = model(RETURN)
    async with harness.worker(scripted) as task_queue:
        turn = TurnInput(question="Return order 123456.", model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        await until(handle, awaiting)
        await decide(
            harness.client, handle.id, "c1", approved=False, by="bob", reason="keeps the soap"
        )
        result = await handle.result()

    assert result.outcome is Outcome.ANSWERED
    assert new_returns(harness.store) == []
    told = last_result(scripted.requests[-1][1])
    assert told.startswith("Not done: start_return(order_id='123456', reason='arrived damaged')")
    assert "declined by bob: keeps the soap" in told
    assert "dispatch" not in [s.kind.value for s in result.steps]
    assert "tool_call" not in kinds(result)


async def test_other_calls_are_not_held_up(harness: Harness) -> None:
    async with harness.worker(model(RETURN, LOOKUP)) as task_queue:
        turn = TurnInput(question="Return 123456; and order 234567?", model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        # The lookup beside the waiting write has run and answered.
        progress = await until(
            handle, lambda p: p.pending and StepKind.OBSERVATION in [s.kind for s in p.steps]
        )
        assert [s.observation.tool for s in progress.steps if s.observation] == ["order_status"]
        await decide(harness.client, handle.id, None, approved=True, by="alice")
        result = await handle.result()
    assert len(new_returns(harness.store)) == 1
    assert result.outcome is Outcome.ANSWERED


async def test_a_decision_for_a_call_not_waiting_is_refused(harness: Harness) -> None:
    async with harness.worker(model(RETURN)) as task_queue:
        turn = TurnInput(question="Return order 123456.", model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        await until(handle, awaiting)
        with pytest.raises(AgentClientError, match=r"call 'c9' is not awaiting approval.*c1"):
            await decide(harness.client, handle.id, "c9", approved=True, by="alice")
        await decide(harness.client, handle.id, "c1", approved=True, by="alice")
        with pytest.raises(AgentClientError, match="not awaiting approval"):
            await decide(harness.client, handle.id, "c1", approved=False, by="mallory")
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.outcome is Outcome.ANSWERED and len(new_returns(harness.store)) == 1
    # Refused updates leave no trace: one accepted update in the whole history.
    accepted = [
        e
        for e in history.events
        if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    assert len(accepted) == 1


async def test_no_call_waiting(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        handle = await start_turn(
            harness.client, TurnInput(question="Has order 123456 shipped?"), task_queue
        )
        await handle.result()
    with pytest.raises(AgentClientError, match=f"turn {handle.id} is completed: no call awaits"):
        await decide(harness.client, handle.id, None, approved=True, by="alice")
    with pytest.raises(AgentClientError, match="no turn with workflow id 'turn-nobody-0'"):
        await decide(harness.client, "turn-nobody-0", None, approved=True, by="alice")


async def test_waiting_turns_are_found_by_customer_and_status(harness: Harness) -> None:
    # A lookup that needs consent here: the customer owns no order, and a write's check
    # would answer that before anyone is asked.
    asks = ApprovalPolicy(required=frozenset({"order_status"}))
    async with harness.worker(model(LOOKUP), approvals=asks) as task_queue:
        turn = TurnInput(
            question="Has order 234567 shipped?", model="scripted", customer_id="cust-9"
        )
        handle = await start_turn(harness.client, turn, task_queue)
        await until(handle, awaiting)

        async def listed() -> list[str]:
            rows = await find_turns(harness.client, customer_id="cust-9", awaiting_approval=True)
            return [r.workflow_id for r in rows]

        deadline = time.monotonic() + 10  # visibility is eventually consistent
        while handle.id not in await listed():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        waiting = await pending(harness.client, "cust-9")
        assert [(w.workflow_id, w.approval.call.id) for w in waiting] == [(handle.id, "c2")]

        await decide(harness.client, handle.id, None, approved=False, by="alice")
        await handle.result()
    deadline = time.monotonic() + 10
    while True:
        rows = await find_turns(harness.client, customer_id="cust-9", outcome="answered")
        if rows and rows[0].workflow_id == handle.id:
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    assert rows[0].status == search.DONE and rows[0].tools == []  # the write never ran
    assert rows[0].model == "scripted"  # the spec the worker used
    assert rows[0].question == "Has order 234567 shipped?"


async def test_a_trusted_worker_can_waive_approval(harness: Harness) -> None:
    async with harness.worker(model(RETURN), approvals=ApprovalPolicy(waived=frozenset("*"))) as tq:
        handle = await start_turn(
            harness.client,
            TurnInput(question="Return order 123456, it arrived damaged.", model="scripted"),
            tq,
        )
        result = await handle.result()
    assert "approval" not in kinds(result) and len(new_returns(harness.store)) == 1


async def test_a_worker_can_require_approval_for_more_tools(harness: Harness) -> None:
    policy = ApprovalPolicy(required=frozenset({"order_status"}))
    async with harness.worker(model(LOOKUP), approvals=policy) as task_queue:
        handle = await start_turn(
            harness.client, TurnInput(question="Order 234567?", model="scripted"), task_queue
        )
        (waiting,) = (await until(handle, awaiting)).pending
        assert "asks for consent before every order_status call" in waiting.why
        await decide(harness.client, handle.id, None, approved=True, by="alice")
        assert (await handle.result()).outcome is Outcome.ANSWERED


def test_approval_settings_naming_unknown_tools_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown tools: start_retrun"):
        ApprovalPolicy(waived=frozenset({"start_retrun"})).check(["start_return"])


async def test_nobody_decides_in_time(skipping_harness: Harness) -> None:
    """An hour's wait on the time-skipping server: longer than max_duration (2 min),
    which does not run while a person decides; then the call is dropped."""
    scripted = model(RETURN)
    limits = TurnLimits(approval_timeout=timedelta(hours=1), max_duration=timedelta(minutes=2))
    result = await skipping_harness.ask("Return order 123456.", model=scripted, limits=limits)

    assert result.outcome is Outcome.ANSWERED
    assert new_returns(skipping_harness.store) == []
    assert "nobody approved start_return" in last_result(scripted.requests[-1][1])
    assert "within 1 h" in last_result(scripted.requests[-1][1])
    assert [s.text for s in result.steps if s.kind is StepKind.DECISION] == [
        "start_return: no decision in time"
    ]


def spawn_worker(address: str, task_queue: str, db: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent.bench.worker", address, task_queue, str(db)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def test_approval_survives_a_killed_worker_and_a_restarted_server(tmp_path: Path) -> None:
    """Wait for consent on worker A; SIGKILL A; restart the server; decide; a new worker
    runs the approved call: exactly one return."""
    server = EmbeddedServer(tmp_path / "temporal.db", port=free_port(), ui_port=free_port())
    server.start()
    db = tmp_path / "shop.db"
    ShopStore(db)
    task_queue = "approval-crash"
    workers: list[subprocess.Popen[str]] = []
    try:
        client = await connect_when_ready(server.address, data_converter=LEAN_DATA_CONVERTER)
        workers.append(spawn_worker(server.address, task_queue, db))
        turn = TurnInput(question="I want to return order 123456, it arrived damaged.")
        handle = await start_turn(client, turn, task_queue)
        await until(handle, awaiting)

        workers[0].kill()
        workers[0].wait()
        server.stop()
        server.start()
        client = await connect_when_ready(server.address, data_converter=LEAN_DATA_CONVERTER)
        handle = client.get_workflow_handle_for(AgentTurn.run, handle.id)

        # A new worker rebuilds the waiting turn from its history, then takes the decision.
        workers.append(spawn_worker(server.address, task_queue, db))
        await decide(client, handle.id, None, approved=True, by="alice")
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        server.stop()

    assert result.outcome is Outcome.ANSWERED
    assert len(ShopStore(db).returns_for("123456")) == 1


async def test_a_decision_the_worker_let_go_unprocessed_is_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A busy worker can complete a workflow task without the update it carried; the
    server then fails the update as unprocessed (nothing of it ran). The decision is
    sent again with the same update id; a refusal by the turn is not."""
    monkeypatch.setattr(turns, "UNPROCESSED_RETRIES", (0.01, 0.01, 0.01))
    unprocessed = ApplicationError(
        "Workflow Update is rejected because it wasn't processed by worker.",
        type=turns.UNPROCESSED,
        non_retryable=True,
    )
    sent: list[str] = []

    async def flaky(update_id: str) -> str:
        sent.append(update_id)
        if len(sent) < 3:
            raise WorkflowUpdateFailedError(unprocessed)
        return "decided"

    assert await turns._update(flaky) == "decided"
    assert len(sent) == 3 and len(set(sent)) == 1

    async def never(update_id: str) -> str:
        sent.append(update_id)
        raise WorkflowUpdateFailedError(unprocessed)

    sent.clear()
    with pytest.raises(AgentClientError, match="wasn't processed by worker"):
        await turns._update(never)
    assert len(sent) == 4

    async def refused(update_id: str) -> str:
        sent.append(update_id)
        raise WorkflowUpdateFailedError(ApplicationError("call 'c9' is not awaiting approval"))

    sent.clear()
    with pytest.raises(AgentClientError, match="not awaiting approval"):
        await turns._update(refused)
    assert len(sent) == 1


async def test_a_decision_waits_for_a_worker_that_is_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Right after a server restart, or while the only worker starts, the server refuses
    updates ("no poller seen"): the decision is sent again, with the same id, and if no
    worker comes, the person reads what to do."""
    monkeypatch.setattr(turns, "UNPROCESSED_RETRIES", (0.01, 0.01, 0.01))
    no_poller = RPCError(
        "no poller seen for task queue recently, worker may be down",
        RPCStatusCode.FAILED_PRECONDITION,
        b"",
    )
    sent: list[str] = []

    async def starting(update_id: str) -> str:
        sent.append(update_id)
        if len(sent) < 3:
            raise no_poller
        return "decided"

    assert await turns._update(starting) == "decided"
    assert len(sent) == 3 and len(set(sent)) == 1

    async def down(update_id: str) -> str:
        raise no_poller

    with pytest.raises(AgentClientError, match="no worker serves this task queue"):
        await turns._update(down)
