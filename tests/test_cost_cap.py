"""Spending caps through real turns: checked before each model call, a cap reached
mid-turn ends it gracefully (`cost_limit`) with what it found; a cap on a model
whose price nobody knows refuses the turn before its first call, naming the model; a
conversation's cap holds across its turns."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_agent import Agent, AgentClient
from durable_agent.model import Reply
from durable_agent.pricing import SETTING
from durable_agent.scripted import ScriptedModel
from durable_agent.types import Outcome, StepKind, ToolCall, TurnLimits, Usage
from tests.conftest import Harness, kinds
from tests.procs import Forks
from tests.test_fallback import status

ROOT = Path(__file__).resolve().parent.parent
PRICE = "scripted=10/10"
"""US dollars per million input / output tokens: a call of 1,000 in and 100 out costs
$0.011."""
CALL = Usage(input_tokens=1_000, output_tokens=100)
CHECK = ToolCall(id="c1", name="status")


def agent(model: ScriptedModel) -> Agent:
    return Agent(
        name="support",
        tools=[status],
        model="scripted",
        models={"scripted": lambda _: model},
    )


async def test_a_cap_reached_mid_turn_ends_it_with_what_it_found(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, PRICE)
    model = ScriptedModel(
        plans=[Reply(calls=[CHECK], usage=CALL)],
        decisions=[Reply(calls=[CHECK], usage=CALL)],  # never done: only the cap stops it
    )
    async with harness.worker(agents=[agent(model)]) as task_queue:
        result = await AgentClient(harness.client, task_queue=task_queue).ask(
            "Status?", limits=TurnLimits(max_cost=0.02)
        )

    assert result.outcome is Outcome.COST_LIMIT
    assert result.answer.startswith("Sorry, I reached this question's spending cap of $0.02.")
    assert "all systems go" in result.answer  # what the steps found
    # $0 and $0.011 spent were under the cap; at $0.022 no third call was made.
    assert len(model.requests) == 2
    assert result.usage.cost_usd == pytest.approx(0.022)
    assert kinds(result) == [
        "plan",
        "tool_call",
        "observation",
        "continue",
        "tool_call",
        "observation",
        "limit",
    ]
    assert result.steps[-1].text.startswith("cost_limit: ")


async def test_a_cap_on_a_model_with_no_known_price_refuses_the_turn(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SETTING, raising=False)
    model = ScriptedModel(plans=[Reply(text="never asked")])
    async with harness.worker(agents=[agent(model)]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        result = await client.ask("Status?", limits=TurnLimits(max_cost=1.0))
        uncapped = await client.ask("Status?")

    assert result.outcome is Outcome.COST_LIMIT
    assert "the price of model scripted is unknown" in result.answer
    assert SETTING in result.answer
    assert result.usage.model_calls == 0  # refused before the first call
    assert [s.kind for s in result.steps if s.kind is not StepKind.SHIELD] == [StepKind.LIMIT]
    assert len(model.requests) == 1  # only the turn without a cap asked the model
    assert uncapped.outcome is Outcome.ANSWERED


async def test_a_conversations_cap_holds_across_its_turns(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, PRICE)
    model = ScriptedModel(plans=[lambda req: Reply(text=f"Answer to: {req.question}", usage=CALL)])
    async with harness.worker(agents=[agent(model)]) as task_queue:
        chat = AgentClient(harness.client, task_queue=task_queue).chat(max_cost=0.02, stream=False)
        first = await chat.send("one?")
        second = await chat.send("two?")
        third = await chat.send("three?")
        await chat.end()

    # $0.02 in all: $0.011 after the first; the second starts under it and goes over;
    # the third has nothing left and makes no call.
    assert [first.outcome, second.outcome, third.outcome] == [
        Outcome.ANSWERED,
        Outcome.ANSWERED,
        Outcome.COST_LIMIT,
    ]
    assert third.answer.startswith("Sorry, I reached this question's spending cap of $0.")
    assert len(model.requests) == 2


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("-1", "error: --max-cost: Input should be greater than or equal to 0"),
        ("nan", "error: --max-cost: give a number of US dollars, not 'nan'"),
    ],
)
def test_the_cli_refuses_a_bad_cap_in_one_line(cli_forks: Forks, value: str, said: str) -> None:
    done = cli_forks.run(["client.py", "ask", "Hi", "--max-cost", value], dict(os.environ))
    assert done.returncode == 1
    assert done.stderr.startswith(said)
    assert len(done.stderr.strip().splitlines()) == 1
