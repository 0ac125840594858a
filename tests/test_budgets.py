"""Budgets through real turns on a worker and the dev server: a tenant's daily budget
stops its turns with `budget_limit` and leaves another tenant's alone; 20 concurrent
turns of one tenant stay within the cap plus one call each, and the ledger agrees with
the turns; a sub-agent's model calls count, and an MCP server's sampling; a ledger
continues as new with its sums; a model with no price cannot be budgeted; a soft line
asks a person once per turn, and approved the turn goes on to the cap, rejected it
stops; a soft line whose cap names its approvers is decided by them alone, listed in
their queue, and the audit shows who let the turn go past it."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

import pytest
from temporalio.common import VersioningBehavior

from durable_agent import Agent, AgentClient, Principal
from durable_agent.budgets import (
    BudgetLedger,
    Budgets,
    BudgetSettingError,
    LedgerInput,
    LedgerState,
    Reserve,
    Settle,
    ledger_id,
    user_key,
)
from durable_agent.client import TurnResult
from durable_agent.errors import NotAnApprover
from durable_agent.mcp import connected
from durable_agent.model import ModelRequest, Reply
from durable_agent.model_settings import ModelSettings
from durable_agent.pricing import SETTING
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.subagents import agent_tool
from durable_agent.tools import Tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnLimits, Usage
from tests import test_mcp_sampling as sampling
from tests.conftest import Harness
from tests.test_fallback import status
from tests.test_mcp import agent_with

PRICE = "scripted=1/100"
"""US dollars per million input / output tokens: a call of 100 in and 100 out costs
$0.0101, and a reservation (the prompt's estimate in, the agent's 100 tokens out) a
little more."""
CALL = Usage(input_tokens=100, output_tokens=100)
CALL_COST = 0.0101
CHECK = ToolCall(id="c1", name="status")
Calls = Literal["activity", "local"]


def agent(model: ScriptedModel, *tools: Tool, calls: Calls = "activity") -> Agent:
    return Agent(
        model_calls=calls,
        name="support",
        tools=[status, *tools],
        model="scripted",
        models={"scripted": lambda _: model},
        settings=ModelSettings(max_tokens=100),
    )


def forever() -> ScriptedModel:
    """Asks for the status, round after round: only a limit stops it."""
    return ScriptedModel(
        plans=[Reply(calls=[CHECK], usage=CALL)], decisions=[Reply(calls=[CHECK], usage=CALL)]
    )


def tenant() -> Principal:
    # A tenant of its own: the dev server outlives the test, and so do its ledgers.
    return Principal(tenant=f"t-{uuid.uuid4().hex[:8]}", user="ada")


async def ledger(harness: Harness, budgets: Budgets, who: Principal) -> LedgerState:
    (held,) = budgets.held(who, datetime.now(timezone.utc))
    handle = harness.client.get_workflow_handle_for(BudgetLedger.run, held.ledger)
    state: LedgerState = await handle.query(BudgetLedger.state)
    return state


@pytest.mark.parametrize("calls", ["activity", "local"])
async def test_a_tenants_daily_budget_stops_its_turns_and_no_other_tenants(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, calls: Calls
) -> None:
    monkeypatch.setenv(SETTING, PRICE)
    budgets = Budgets.parse("tenant=0.035/day")
    acme, other = tenant(), tenant()
    served = agent(forever(), calls=calls)  # model calls as activities, or local ones
    async with harness.worker(agents=[served], budgets=budgets) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        first = await client.ask("Status?", principal=acme)
        second = await client.ask("Status?", principal=acme)
        theirs = await client.ask("Status?", principal=other, limits=TurnLimits(max_steps=1))
        spent = await ledger(harness, budgets, acme)
        spent_other = await ledger(harness, budgets, other)

    tomorrow = f"{datetime.now(timezone.utc):%Y-%m-%d}"
    assert first.outcome is Outcome.BUDGET_LIMIT
    assert first.answer.startswith(
        f"Sorry, I had to stop: the daily budget of tenant {acme.tenant} ($0.035) cannot pay "
        "for another model call"
    )
    assert "resets at " in first.answer and first.answer.endswith(
        "Here is what I found so far: all systems go all systems go all systems go"
    )
    assert tomorrow < first.answer.split("resets at ")[1][:10]
    # Three calls fit ($0.0303 and the fourth's reservation would not).
    assert first.usage.model_calls == 3
    assert first.usage.cost_usd == pytest.approx(3 * CALL_COST)
    assert first.steps[-1].text.startswith("budget_limit: ")
    # The budget is spent for the day: the next turn stops before its first call.
    assert second.outcome is Outcome.BUDGET_LIMIT
    assert second.usage.model_calls == 0
    assert spent.spent == pytest.approx(first.usage.cost_usd) and spent.holds == 0
    # Another tenant's budget is its own.
    assert theirs.outcome is Outcome.STEP_LIMIT
    assert spent_other.spent == pytest.approx(theirs.usage.cost_usd) == 2 * CALL_COST


async def test_twenty_concurrent_turns_of_a_tenant_stay_within_its_budget(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, PRICE)
    cap = 0.1  # about 10 calls; unchecked, the 20 turns would make 80
    budgets = Budgets.parse(f"tenant={cap}/day")
    acme = tenant()
    async with harness.worker(agents=[agent(forever())], budgets=budgets) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        limits = TurnLimits(max_steps=3)
        results = await asyncio.gather(
            *(client.ask("Status?", principal=acme, limits=limits) for _ in range(20))
        )
        state = await ledger(harness, budgets, acme)

    spent = sum(r.usage.cost_usd or 0.0 for r in results)
    assert spent <= cap + 20 * CALL_COST
    assert state.spent == pytest.approx(spent) and state.holds == 0
    assert spent > cap - 2 * CALL_COST  # the budget was used, not refused at once
    outcomes = {r.outcome for r in results}
    assert Outcome.BUDGET_LIMIT in outcomes and outcomes <= {
        Outcome.BUDGET_LIMIT,
        Outcome.STEP_LIMIT,
    }


async def test_a_sub_agents_model_calls_count(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, PRICE)
    budgets = Budgets.parse("tenant=1/day")
    helper = agent_tool("helper", "Checks the status.", tools=["status"], instructions="Check.")

    def plan(request: ModelRequest) -> Reply:
        if [t.name for t in request.tools] == ["status"]:  # the sub-agent
            return Reply(calls=[CHECK], usage=CALL)
        ask = ToolCall(id="h1", name="helper", arguments={"question": "Status?"})
        return Reply(calls=[ask], usage=CALL)

    model = ScriptedModel(plans=[plan], decisions=[Reply(text="All good.", usage=CALL)])
    acme = tenant()
    async with harness.worker(agents=[agent(model, helper)], budgets=budgets) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        result = await client.ask("Status?", principal=acme)
        state = await ledger(harness, budgets, acme)

    assert result.outcome is Outcome.ANSWERED
    assert [s.observation.text for s in result.steps if s.observation] == ["All good."]
    # The parent's plan and answer, the sub-agent's plan and answer: four calls held.
    assert result.usage.model_calls == 4
    assert state.spent == pytest.approx(4 * CALL_COST) == result.usage.cost_usd


async def test_a_ledger_continues_as_new_with_its_sums_and_holds(harness: Harness) -> None:
    ends = datetime.now(timezone.utc) + timedelta(days=1)
    start = LedgerInput(ledger=f"budget:t:t-{uuid.uuid4().hex[:8]}:x", ends=ends, max_updates=3)
    async with harness.worker() as task_queue:
        handle = await harness.client.start_workflow(
            BudgetLedger.run, start, id=start.ledger, task_queue=task_queue
        )
        first_run = handle.result_run_id
        for i in range(4):
            await handle.execute_update(BudgetLedger.reserve, Reserve(id=f"c{i}", amount=1, cap=3))
        await handle.execute_update(BudgetLedger.settle, Settle(id="c0", cost=0.5))
        state = await handle.query(BudgetLedger.state)
        run = (await handle.describe()).run_id

    assert run != first_run  # it moved on after three updates
    # c3 did not fit (3 held); c0 settled at its cost, c1 and c2 still held.
    assert (state.spent, state.held, state.holds) == (0.5, 2.0, 2)


def test_budgets_read_from_settings_and_refuse_bad_ones_in_one_line() -> None:
    budgets = Budgets.parse("tenant=20/day, tenant:acme=500/month, user:acme=2/day")
    now = datetime(2026, 12, 31, 23, 30, tzinfo=timezone.utc)
    held = budgets.held(Principal(tenant="acme", user="u:1"), now)
    assert [(h.ledger, f"{h.ends:%Y-%m-%d}") for h in held] == [
        ("budget:t:acme:2026-12-31", "2027-01-01"),
        ("budget:t:acme:2026-12", "2027-01-01"),
        ("budget:u:acme:u%3A1:2026-12-31", "2027-01-01"),
    ]
    assert [h.ledger for h in budgets.held(Principal(tenant="zeta", user="u"), now)] == [
        "budget:t:zeta:2026-12-31"
    ]
    soft = Budgets.parse("tenant:acme=5/day@80%, user=1/day@50%:asker|role:support-lead").caps
    assert [(c.usd, c.per, c.tenant, c.soft, c.approver_rules) for c in soft] == [
        (5, "day", "acme", 0.8, []),
        (1, "day", "*", 0.5, ["asker", "role:support-lead"]),
    ]
    for bad in (
        "tenant=20",
        "tenant=-1/day",
        "team=3/day",
        "tenant:ACME=1/day",
        "user=x/month",
        "tenant=1/day@100%",
        "tenant=1/day@0%",
        "tenant=1/day@80",
        "tenant=1/day:role:lead",  # approvers, and no soft line for them to decide
        "tenant=1/day@80%:lead",
        "tenant=1/day@80%:role:Lead",
        "tenant=1/day@80%:",
    ):
        with pytest.raises(BudgetSettingError, match=r"^AGENT_BUDGETS: .* use SCOPE"):
            Budgets.parse(bad)


def test_no_two_users_share_a_ledger() -> None:
    users = ["a:b", "a%3Ab", "a", "a:", "ä", "x" * 300, "x" * 301, "!" + "0" * 64]
    keys = {ledger_id("acme", user_key(u), "2026-12-07") for u in users}
    assert len(keys) == len(users)
    assert ledger_id("acme", None, "2026-12-07") not in keys
    assert all(len(k) < 300 for k in keys)


async def test_on_a_versioned_worker_the_ledger_auto_upgrades(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, PRICE)
    budgets = Budgets.parse("tenant=1/day")
    settings = replace(Settings.from_env(), versioning=True, build_id="b1", promote="always")
    model = ScriptedModel(plans=[Reply(text="Fine.", usage=CALL)])
    acme = tenant()
    async with harness.worker(agents=[agent(model)], budgets=budgets, settings=settings) as queue:
        result = await AgentClient(harness.client, task_queue=queue).ask("Hi", principal=acme)
        (held,) = budgets.held(acme, datetime.now(timezone.utc))
        described = await harness.client.get_workflow_handle(held.ledger).describe()
        state = await ledger(harness, budgets, acme)

    assert result.outcome is Outcome.ANSWERED and state.spent == pytest.approx(CALL_COST)
    versioning = described.raw_description.workflow_execution_info.versioning_info
    assert versioning.behavior == VersioningBehavior.AUTO_UPGRADE.value


async def test_a_model_with_no_price_cannot_be_budgeted(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, "someother=1/1")
    model = forever()
    budgets = Budgets.parse("user=1/month")
    ada = tenant()
    async with harness.worker(agents=[agent(model)], budgets=budgets) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        result = await client.ask("Status?", principal=ada)

    assert result.outcome is Outcome.BUDGET_LIMIT and not model.requests
    assert result.answer == (
        f"Sorry, I had to stop: the monthly budget of user ada of tenant {ada.tenant} "
        "cannot be kept: the price of "
        "model scripted is unknown (whoever runs this agent can give it with "
        "AGENT_MODEL_PRICES)."
    )


@pytest.mark.usefixtures("own_state_dir")
async def test_an_mcp_servers_sampling_counts(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SETTING, PRICE)
    budgets = Budgets.parse("tenant=1/day")
    scripted = sampling.model()  # only the sample has tokens: it alone costs
    server = sampling.sampling_server(tmp_path / "ran.log", sampling="allow")
    acme = tenant()
    async with (
        connected([agent_with(server)]) as agents,
        harness.worker(scripted, agents=agents, budgets=budgets) as task_queue,
    ):
        client = AgentClient(harness.client, task_queue=task_queue)
        result = await client.ask("Summarise the report", model="scripted", principal=acme)
        state = await ledger(harness, budgets, acme)

    assert result.outcome is Outcome.ANSWERED and len(sampling.sampled(scripted)) == 1
    assert state.spent == pytest.approx(result.usage.cost_usd) == 0.00073  # 30 in, 7 out


def asked(result: TurnResult) -> list[str]:
    """What the turn asked a person before passing a budget's soft line."""
    return [s.text for s in result.steps if s.kind is StepKind.APPROVAL]


async def test_past_a_soft_line_each_turn_asks_once_and_goes_on_to_the_cap(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, PRICE)
    cap = 0.1  # about ten calls; the soft line after about three
    budgets = Budgets.parse(f"tenant={cap}/day@30%")
    acme = tenant()
    async with harness.worker(agents=[agent(forever())], budgets=budgets) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        turns = [await client.start("Status?", principal=acme) for _ in range(3)]
        results = asyncio.gather(*(t.result() for t in turns))
        approved = 0
        deadline = asyncio.get_running_loop().time() + 60
        while not results.done():  # a person approves whatever waits, as it comes
            assert asyncio.get_running_loop().time() < deadline, "the turns never ended"
            for waiting in await client.pending(tenant=acme.tenant):
                assert waiting.approval.call.name == "budget", waiting
                await client.turn(waiting.workflow_id).approve(waiting.approval.call.id, by="lee")
                approved += 1
            await asyncio.sleep(0.1)
        ended = await results
        state = await ledger(harness, budgets, acme)

    # Each turn was asked at most once (the first past the line surely), and went on to
    # the cap: every one ends with the cap's own budget_limit.
    assert all(len(asked(r)) <= 1 for r in ended) and approved == sum(map(len, map(asked, ended)))
    assert (
        approved >= 1
        and f"tenant {acme.tenant} ($0.1) would pass its soft line of 30%"
        in (asked(ended[0]) or asked(ended[1]) or asked(ended[2]))[0]
    )
    for r in ended:
        assert r.outcome is Outcome.BUDGET_LIMIT and "cannot pay for another" in r.answer
    spent = sum(r.usage.cost_usd or 0.0 for r in ended)
    assert state.spent == pytest.approx(spent) and spent > 0.3 * cap + CALL_COST
    assert spent <= cap + 3 * CALL_COST and state.holds == 0


@pytest.mark.parametrize("calls", ["activity", "local"])
async def test_a_soft_line_rejected_ends_the_turn(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, calls: Calls
) -> None:
    monkeypatch.setenv(SETTING, PRICE)
    budgets = Budgets.parse("tenant=0.1/day@30%")
    acme = tenant()
    served = agent(forever(), calls=calls)  # the refusal's details come either way
    async with harness.worker(agents=[served], budgets=budgets) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        turn = await client.start("Status?", principal=acme)
        deadline = asyncio.get_running_loop().time() + 60
        while not (waiting := (await turn.progress()).pending):
            assert asyncio.get_running_loop().time() < deadline, "the turn never asked"
            await asyncio.sleep(0.1)
        await turn.reject(waiting[0].call.id, by="lee", reason="enough for today")
        result = await turn.result()
        state = await ledger(harness, budgets, acme)

    assert result.outcome is Outcome.BUDGET_LIMIT
    # Two calls fit under 30% ($0.0202); the third's reservation ($0.0102) would pass it.
    assert result.usage.model_calls == 2 and state.spent == pytest.approx(2 * CALL_COST)
    assert result.answer.startswith(
        f"Sorry, I had to stop: the daily budget of tenant {acme.tenant} ($0.1) would pass "
        "its soft line of 30% with another model call ($0.0202 spent"
    )
    assert "; going on was declined by lee: enough for today." in result.answer
    assert waiting[0].call.arguments["ledger"] == f"budget:t:{acme.tenant}:" + (
        f"{datetime.now(timezone.utc):%Y-%m-%d}"
    )


async def test_a_soft_line_whose_cap_names_approvers_is_theirs_to_decide(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`@30%:role:support-lead`: the asker's decision is refused in one line (and
    recorded), a lead of the tenant finds the call in their queue and approves it, and
    the audit shows the lead as who let the turn go past the line."""
    monkeypatch.setenv(SETTING, PRICE)
    budgets = Budgets.parse("tenant=0.1/day@30%:role:support-lead")
    ada = tenant()
    lead = Principal(tenant=ada.tenant, user="lee", roles=("support-lead",))
    stranger = Principal(tenant="elsewhere", user="lee", roles=("support-lead",))
    async with harness.worker(agents=[agent(forever())], budgets=budgets) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        turn = await client.start("Status?", principal=ada)
        deadline = asyncio.get_running_loop().time() + 60
        while not (queue := await client.pending_for(lead)):
            assert asyncio.get_running_loop().time() < deadline, "the lead was never asked"
            await asyncio.sleep(0.1)
        (waiting,) = queue
        assert waiting.approval.call.name == "budget" and waiting.asker == ada
        assert waiting.approval.approvers == ["role:support-lead"]
        assert await client.pending_for(stranger) == []
        with pytest.raises(NotAnApprover, match="role 'support-lead' may$"):
            await turn.approve(waiting.approval.call.id, by="ada", principal=ada)
        decider = await client.turn_to_decide(turn.id, principal=lead)
        await decider.approve(waiting.approval.call.id, by="lee", principal=lead, via="desk")
        result = await turn.result()
        rows = await client.audit(tenant=ada.tenant)

    assert result.outcome is Outcome.BUDGET_LIMIT and "cannot pay for another" in result.answer
    (row,) = [r for r in rows if r.workflow_id == turn.id]
    assert (row.tool, row.user, row.approved, row.ran, row.via) == (
        "budget",
        "ada",
        True,
        False,
        "desk",
    )
    assert row.principal == lead and row.refused == 1
