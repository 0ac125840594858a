"""Nobody is asked to approve what cannot happen: a tool's check runs before consent.

The demo shop's `start_return` checks the order first (`shop.tools.can_return`): an
order that has not shipped, one already returned, one with a return open, or another
customer's is answered from the check, with no approval asked and nothing written;
one that can go back is put to the person with what will change.
"""

from __future__ import annotations

import asyncio

import pytest

from durable_agent.model import Reply
from durable_agent.runtime.turns import decide, progress_of, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnOutput
from tests.conftest import Harness, last_result

CANNOT = [
    ("456789", "has not shipped yet, so it cannot be returned"),
    ("345678", "was already returned and refunded (return rtn001)"),
    ("234567", "already has an open return, rtn003 (status: received; Item received on"),
    ("567890", "Order not found. Please check your Order ID."),  # another customer's
]


def returning(order_id: str) -> ScriptedModel:
    call = ToolCall(
        id="c1", name="start_return", arguments={"order_id": order_id, "reason": "too small"}
    )
    return ScriptedModel(
        plans=[Reply(calls=[call])], decisions=[lambda req: Reply(text=last_result(req))]
    )


async def answered(handle: object, seconds: float = 60) -> TurnOutput:
    """The turn's result; a turn that waits for a person instead fails the test."""
    result: TurnOutput = await asyncio.wait_for(handle.result(), seconds)  # type: ignore[attr-defined]
    return result


@pytest.mark.parametrize(("order_id", "says"), CANNOT)
async def test_a_return_that_cannot_happen_asks_no_one_and_writes_nothing(
    harness: Harness, order_id: str, says: str
) -> None:
    before = {o: len(harness.store.returns_for(o)) for o, _ in CANNOT}
    async with harness.worker(returning(order_id)) as tq:
        turn = TurnInput(question=f"Return order {order_id}, too small", model="scripted")
        result = await answered(await start_turn(harness.client, turn, tq))
    assert result.outcome is Outcome.ANSWERED and says in result.answer
    assert not any(s.kind in (StepKind.APPROVAL, StepKind.TOOL_CALL) for s in result.steps)
    assert {o: len(harness.store.returns_for(o)) for o, _ in CANNOT} == before


async def test_the_offline_agent_asks_nobody_to_return_an_unshipped_order(
    harness: Harness,
) -> None:
    async with harness.worker() as tq:
        turn = TurnInput(question="I want to return order 456789, it is the wrong size")
        result = await answered(await start_turn(harness.client, turn, tq))
    assert "has not shipped yet" in result.answer
    assert not any(s.kind is StepKind.APPROVAL for s in result.steps)
    assert harness.store.returns_for("456789") == []


async def test_a_return_that_can_happen_says_what_will_change_where_consent_is_asked(
    harness: Harness,
) -> None:
    before = len(harness.store.returns_for("123456"))
    async with harness.worker(returning("123456")) as tq:
        turn = TurnInput(question="Return order 123456, too small", model="scripted")
        handle = await start_turn(harness.client, turn, tq)
        for _ in range(300):
            if (progress := await progress_of(handle)).pending:
                break
            await asyncio.sleep(0.1)
        (waiting,) = progress.pending
        assert "it will: start a return of order 123456 (2 × Herbal Handsoap, $19.98)" in (
            waiting.why
        )
        assert "because: too small" in waiting.why
        await decide(harness.client, handle.id, None, approved=True, by="customer")
        result = await answered(handle)
    assert len(harness.store.returns_for("123456")) == before + 1
    assert "status: requested" in result.answer or "requested" in result.answer
