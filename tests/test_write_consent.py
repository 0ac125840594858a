"""A waiver of consent covers one write, once: in a fork or a replay (`rerun`, `replay`)
every write its record did not serve asks (a new one, a further copy of one it served,
one in a world of its own), and in any turn a waived write that repeats one the turn
ran without asking (same tool, same arguments) asks, within a reply, across rounds and
across a continue-as-new. Real effects are counted in the tool's own store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from pydantic import BaseModel

from durable_agent import Agent, AgentClient
from durable_agent.approval import (
    IN_A_FORK,
    REPEATED,
    SUBAGENT_IN_A_FORK,
    ApprovalPolicy,
    digest,
    too_many_unasked,
)
from durable_agent.client import TurnHandle
from durable_agent.model import Reply
from durable_agent.scripted import ScriptedModel
from durable_agent.shields import ShieldSettings
from durable_agent.shop import TOOLS_WITH_POLICY_EXPERT
from durable_agent.tools import ToolContext, tool
from durable_agent.types import Outcome, PendingApproval, StepKind, ToolCall, TurnLimits
from tests.conftest import Harness, last_result
from tests.test_rewind import Forking

QUESTION = "Please refund 12.50 for order 654321, and 7.25 for order 765432"
ARGUMENTS = {"order_id": "654321", "amount": 12.5}
OTHER = {"order_id": "765432", "amount": 7.25}


class Refunds:
    """The refund tool's own store: one refund per idempotency key, as a payment
    system keeps them (a retried activity is not a second refund)."""

    def __init__(self) -> None:
        self.made: dict[str, dict[str, object]] = {}

    def count(self, arguments: dict[str, object] = ARGUMENTS) -> int:
        return sum(r == arguments for r in self.made.values())


class RefundArgs(BaseModel):
    order_id: str
    amount: float


@tool(side_effects=True)
def refund(args: RefundArgs, ctx: ToolContext[Refunds]) -> str:
    """Refund an amount for an order."""
    ctx.deps.made.setdefault(ctx.idempotency_key, args.model_dump())
    return f"Refunded {args.amount:.2f} for order {args.order_id}."


def refunds_agent(store: Refunds, waived: bool = True) -> Agent:
    """Refunds waived (and no shields): a refund of the customer's own words runs unasked."""
    return Agent(
        name="refunds",
        tools=[refund],
        deps=store,
        approvals=ApprovalPolicy(waived=frozenset({"refund"}) if waived else frozenset()),
        shields=ShieldSettings.none(),
    )


def refund_call(call_id: str, arguments: dict[str, object] = ARGUMENTS) -> ToolCall:
    return ToolCall(id=call_id, name="refund", arguments=dict(arguments))


def reversed_keys(arguments: dict[str, object]) -> dict[str, object]:
    """The same arguments, keys in another order: the same write."""
    return dict(reversed(list(arguments.items())))


def refunding_once() -> ScriptedModel:
    return ScriptedModel(plans=[Reply(calls=[refund_call("r1")])], decisions=[Reply(text="Done.")])


async def waiting(turn: TurnHandle, ready: Callable[[list[PendingApproval]], bool]):  # type: ignore[no-untyped-def]
    """The turn's calls awaiting a decision, once `ready` holds of them."""
    deadline = time.monotonic() + 60
    while not ready(pending := await turn.pending()):
        assert time.monotonic() < deadline, [p.call.render() for p in pending]
        await asyncio.sleep(0.1)
    return pending


async def until_count(store: Refunds, n: int) -> None:
    deadline = time.monotonic() + 60
    while store.count() < n:
        assert time.monotonic() < deadline, store.made
        await asyncio.sleep(0.05)


async def refunded_once(agents: AgentClient, store: Refunds) -> str:
    """The original turn: one waived refund, nobody asked."""
    first = await agents.ask(QUESTION, model="scripted")
    assert first.outcome is Outcome.ANSWERED, first.answer
    assert store.count() == 1
    assert not [s for s in first.steps if s.kind is StepKind.APPROVAL]
    return first.workflow_id


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "declined"])
@pytest.mark.parametrize("how", ["rerun", "replay"])
async def test_a_fork_that_repeats_a_recorded_write_asks_before_the_second_copy(
    harness: Harness, how: str, approved: bool
) -> None:
    """The original refunded once, waived. Its fork's model refunds twice (a rerun: twice
    in one reply; a replay: once in order, then again): the first copy comes from the
    record, the second waits for consent and runs only once approved."""
    store = Refunds()
    model = Forking(refunding_once())
    async with harness.worker(model, agents=[refunds_agent(store)]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        parent = await refunded_once(agents, store)
        if how == "rerun":
            twice = Reply(calls=[refund_call("n1"), refund_call("n2", reversed_keys(ARGUMENTS))])
            model.then(ScriptedModel(plans=[twice], decisions=[Reply(text="Done.")]))
            fork = await agents.rerun(parent, from_step=1)
        else:
            again = [Reply(calls=[refund_call("n2")]), Reply(text="Done.")]
            model.then(ScriptedModel(plans=[Reply(calls=[refund_call("n1")])], decisions=again))
            fork = await agents.replay(parent)
        (asked,) = await waiting(fork, bool)
        assert asked.call.id == "n2" and IN_A_FORK in asked.why
        assert store.count() == 1  # nothing ran meanwhile
        await fork.decide("n2", approved=approved, by="operator")
        result = await fork.result()

    assert store.count() == (2 if approved else 1)
    served = [s for s in result.steps if s.kind is StepKind.RECORDED]
    assert [s.calls[0].id for s in served] == ["n1"]
    done = f"already done in {parent} (step 1); its recorded result, not run again"
    assert served[0].text.endswith(done)
    (approval,) = [s for s in result.steps if s.kind is StepKind.APPROVAL]
    assert approval.calls[0].id == "n2"
    assert approval.text.endswith(f"awaits approval: {IN_A_FORK}")
    ran = [s.calls[0].id for s in result.steps if s.kind is StepKind.TOOL_CALL]
    assert ran == (["n2"] if approved else [])


@pytest.mark.parametrize("how", ["rerun", "replay", "own_world"])
async def test_a_new_waived_write_in_a_fork_asks(harness: Harness, how: str) -> None:
    """The fork's model refunds the customer's other order, which the original never
    did: waived in any turn, it asks here. A replay in a world of its own too: the
    turn cannot tell that its tools write only to a copy (these write to their one
    store)."""
    store = Refunds()
    model = Forking(refunding_once())
    async with harness.worker(model, agents=[refunds_agent(store)]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        parent = await refunded_once(agents, store)
        new = Reply(calls=[refund_call("n1", OTHER)])
        model.then(ScriptedModel(plans=[new], decisions=[lambda r: Reply(text=last_result(r))]))
        if how == "rerun":
            fork = await agents.rerun(parent, from_step=1)
        else:
            fork = await agents.replay(parent, own_world=how == "own_world")
        (asked,) = await waiting(fork, bool)
        assert asked.why == IN_A_FORK
        assert store.count(OTHER) == 0
        await fork.reject("n1", by="operator", reason="only looking")
        result = await fork.result()

    assert store.count(OTHER) == 0 and store.count() == 1
    assert result.answer.startswith("Not done: refund(")
    assert "declined by operator: only looking" in result.answer


async def test_a_sub_agents_call_in_a_fork_asks(harness: Harness) -> None:
    """A sub-agent's turn is no fork: whatever it writes would be real. So its call, which
    the fork's record did not serve, asks; declined, no sub-agent's turn starts."""
    model = Forking(ScriptedModel(plans=[Reply(text="We ship to Canada.")]))
    async with harness.worker(model, TOOLS_WITH_POLICY_EXPERT) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        parent = (await agents.ask("Do you ship to Canada?", model="scripted")).workflow_id
        ask = ToolCall(id="n1", name="policy_expert", arguments={"question": "Canada?"})
        reply = [lambda r: Reply(text=last_result(r))]
        model.then(ScriptedModel(plans=[Reply(calls=[ask])], decisions=reply))
        fork = await agents.rerun(parent, from_step=1)
        (asked,) = await waiting(fork, bool)
        assert asked.why == SUBAGENT_IN_A_FORK
        await fork.reject("n1", by="operator")
        result = await fork.result()
    assert result.answer.startswith("Not done: policy_expert(")
    assert not [s for s in result.steps if s.kind is StepKind.TOOL_CALL]


@pytest.mark.parametrize("copies", [3, 1000])
async def test_identical_waived_writes_in_one_reply_run_once_until_someone_approves_more(
    harness: Harness, copies: int
) -> None:
    """One reply with `copies` identical waived refunds (keys in any order): the first
    runs, unasked; every other copy that runs (the first 64 of a reply do) asks, saying
    why. Approved, one more runs; declined, none."""
    store = Refunds()
    calls = [
        refund_call(f"r{i}", ARGUMENTS if i % 2 else reversed_keys(ARGUMENTS))
        for i in range(copies)
    ]
    model = ScriptedModel(plans=[Reply(calls=calls)], decisions=[Reply(text="Done.")])
    asking = min(copies, 64) - 1
    async with harness.worker(model, agents=[refunds_agent(store)]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        turn = await agents.start(QUESTION, model="scripted")
        pending = await waiting(turn, lambda p: len(p) == asking)
        await until_count(store, 1)  # the first copy's dispatch may still be under way
        assert {p.why for p in pending} == {REPEATED}
        assert "r0" not in {p.call.id for p in pending}  # the first ran
        first, *rest = pending
        await turn.approve(first.call.id, by="operator")
        await until_count(store, 2)
        for p in rest:
            await turn.reject(p.call.id, by="operator")
        result = await turn.result()

    assert store.count() == 2
    assert result.outcome is Outcome.ANSWERED
    approvals = [s for s in result.steps if s.kind is StepKind.APPROVAL]
    assert len(approvals) == asking
    assert all(s.text.endswith(f"awaits approval: {REPEATED}") for s in approvals)


@pytest.mark.parametrize(
    "limits",
    [None, TurnLimits(continue_after_events=10)],
    ids=["across-rounds", "across-continue-as-new"],
)
async def test_a_waived_write_repeated_in_a_later_round_asks(
    harness: Harness, limits: TurnLimits | None
) -> None:
    """Round 1 refunds, waived; round 2 refunds the same again (in the turn's next run,
    when it continues as new at every safe point): it asks, and declined it never runs."""
    store = Refunds()
    model = ScriptedModel(
        plans=[Reply(calls=[refund_call("r1")])],
        decisions=[
            Reply(calls=[refund_call("r2", reversed_keys(ARGUMENTS))]),
            lambda r: Reply(text=last_result(r)),
        ],
    )
    async with harness.worker(model, agents=[refunds_agent(store)]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        turn = await agents.start(QUESTION, model="scripted", limits=limits)
        (asked,) = await waiting(turn, bool)
        assert asked.call.id == "r2" and asked.why == REPEATED
        assert store.count() == 1
        await turn.reject("r2", by="operator")
        result = await turn.result()

    assert store.count() == 1
    assert result.answer.startswith("Not done: refund(")
    if limits is not None:
        assert result.runs >= 2  # r2 asked in a run after the one r1 ran in


async def test_past_the_writes_a_turn_remembers_every_waived_write_asks(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn remembers a bounded number of writes it ran unasked (1,000; two here):
    past them it cannot tell a repeat from a new write, so every write asks."""
    monkeypatch.setattr("durable_agent.activities.parse.MAX_UNASKED_WRITES", 2)
    store = Refunds()
    third = {"order_id": "654321", "amount": 7.25}
    calls = [refund_call("r1"), refund_call("r2", OTHER), refund_call("r3", third)]
    model = ScriptedModel(plans=[Reply(calls=calls)], decisions=[Reply(text="Done.")])
    async with harness.worker(model, agents=[refunds_agent(store)]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        turn = await agents.start(QUESTION, model="scripted")
        (asked,) = await waiting(turn, bool)
        assert asked.call.id == "r3" and asked.why == too_many_unasked(2)
        await turn.reject("r3", by="operator")
        await turn.result()
    assert (store.count(), store.count(OTHER), store.count(third)) == (1, 1, 0)


async def test_writes_that_need_consent_anyway_each_ask(harness: Harness) -> None:
    """Not waived: both copies ask, for the reason they always did; both approved, both
    run."""
    store = Refunds()
    calls = [refund_call("r1"), refund_call("r2")]
    model = ScriptedModel(plans=[Reply(calls=calls)], decisions=[Reply(text="Done.")])
    async with harness.worker(model, agents=[refunds_agent(store, waived=False)]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        turn = await agents.start(QUESTION, model="scripted")
        pending = await waiting(turn, lambda p: len(p) == 2)
        assert {p.why for p in pending} == {"it writes: Refund an amount for an order"}
        for p in pending:
            await turn.approve(p.call.id, by="operator")
        await turn.result()
    assert store.count() == 2


def test_a_write_is_compared_by_its_tool_and_canonical_arguments() -> None:
    same = digest(refund_call("a")) == digest(refund_call("b", reversed_keys(ARGUMENTS)))
    assert same and len(digest(refund_call("a"))) == 32
    assert digest(refund_call("a")) != digest(refund_call("a", OTHER))
    assert digest(refund_call("a")) != digest(ToolCall(id="a", name="other", arguments=ARGUMENTS))


class NoArgs(BaseModel):
    pass


@tool(side_effects=True, repeats=True)
def log_line(args: NoArgs, ctx: ToolContext[Refunds]) -> str:
    """Log that the customer called."""
    ctx.deps.made.setdefault(ctx.idempotency_key, {})
    return "Logged."


async def test_a_write_declared_to_repeat_runs_unasked_each_time(
    harness: Harness,
) -> None:
    """`@tool(repeats=True)`: each call a new, harmless effect (a checkpoint, a log
    line). Waived, the same call three times in a reply and once more in the next
    round runs four times, nobody asked."""
    store = Refunds()
    agent = Agent(
        name="logger",
        tools=[log_line],
        deps=store,
        approvals=ApprovalPolicy(waived=frozenset({"log_line"})),
        shields=ShieldSettings.none(),
    )
    calls = [ToolCall(id=f"l{i}", name="log_line", arguments={}) for i in range(3)]
    model = ScriptedModel(
        plans=[Reply(calls=calls)],
        decisions=[
            Reply(calls=[ToolCall(id="l3", name="log_line", arguments={})]),
            Reply(text="Logged four times."),
        ],
    )
    async with harness.worker(model, agents=[agent]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        result = await agents.ask("Log my call.", model="scripted")
    assert result.outcome is Outcome.ANSWERED
    assert len(store.made) == 4
    assert not [s for s in result.steps if s.kind is StepKind.APPROVAL]


def test_only_a_write_may_be_declared_to_repeat() -> None:
    with pytest.raises(TypeError, match="repeats=True is for a write"):

        @tool(repeats=True)
        def look(args: NoArgs, ctx: ToolContext[None]) -> str:
            """Look something up."""
            return ""
