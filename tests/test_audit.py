"""The audit lists every write: one a person decided on, and one that ran unasked
(its consent waived by the agent's policy), each with what it ran and its result."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

from pydantic import BaseModel
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, AgentClient, Principal, ToolContext, tool
from durable_agent.approval import consent_hash
from durable_agent.audit import AuditRow
from durable_agent.commands.worker import build_worker
from durable_agent.model import ModelCatalog, ModelRequest, Reply
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.types import WAIVED, Outcome, StepKind, ToolCall
from tests.conftest import last_result

ASKER = Principal(tenant="globex", user="c-9")


class Note(BaseModel):
    text: str


class Refund(BaseModel):
    order_id: str
    amount: int


@tool(side_effects=True, approval=False)
def add_note(args: Note, ctx: ToolContext[list[str]]) -> str:
    """Add a note to the customer's file."""
    ctx.deps.append(args.text)
    return f"noted: {args.text}"


@tool(side_effects=True)
def refund(args: Refund, ctx: ToolContext[list[str]]) -> str:
    """Refund an amount of an order."""
    ctx.deps.append(f"refund {args.amount} on {args.order_id}")
    return f"refunded {args.amount} on {args.order_id}"


NOTE = ToolCall(id="n1", name="add_note", arguments={"text": "called about o-9"})
REFUND = ToolCall(id="r1", name="refund", arguments={"order_id": "o-9", "amount": 4})


def decide(request: ModelRequest) -> Reply:
    done = sum(1 for m in request.messages if getattr(m, "role", "") == "tool")
    return Reply(calls=[REFUND]) if done == 1 else Reply(text=last_result(request))


async def test_a_write_that_ran_unasked_is_in_the_audit_as_such(env: WorkflowEnvironment) -> None:
    effects: list[str] = []
    model = ScriptedModel(plans=[Reply(calls=[NOTE])], decisions=[decide])
    desk = Agent(
        name="desk",
        instructions="Help.",
        tools=[add_note, refund],
        model="scripted",
        models={"scripted": lambda _: model},
        deps=effects,
    )
    task_queue = f"test-{uuid.uuid4().hex[:8]}"
    settings = replace(Settings.from_env(), versioning=False, workflow_sandbox=True)
    async with build_worker(
        env.client, task_queue, agents=[desk], models=ModelCatalog({}), settings=settings
    ):
        agents = AgentClient(env.client, task_queue=task_queue)
        # The note's text is the customer's own words: its consent is waived.
        question = "Add a note: called about o-9. Then refund 4 on o-9."
        turn = await agents.start(question, principal=ASKER)
        deadline = time.monotonic() + 30
        while not (await turn.progress()).pending:
            assert time.monotonic() < deadline, "the refund never asked"
            await asyncio.sleep(0.2)
        await turn.approve(by="ann", via="desk")
        result = await turn.result()
        assert result.outcome is Outcome.ANSWERED
        assert effects == ["called about o-9", "refund 4 on o-9"]

        # The story's call step of the unasked write carries its waiver.
        [noted] = [s for s in result.steps if s.kind is StepKind.TOOL_CALL and s.calls == [NOTE]]
        assert noted.consent is not None and noted.consent.via == WAIVED
        assert noted.consent.by == "" and noted.consent.call_hash == consent_hash(NOTE)

        rows: list[AuditRow] = []
        while len(rows) < 2:
            rows = [r for r in await agents.audit(tenant="globex") if r.workflow_id == turn.id]
            assert time.monotonic() < deadline, rows
            await asyncio.sleep(0.2)
        unasked, decided = rows  # oldest first: the note ran before the refund was decided
        assert (unasked.tool, unasked.via, unasked.by, unasked.ran) == (
            "add_note",
            WAIVED,
            "",
            True,
        )
        assert unasked.ran and unasked.result == "noted: called about o-9"
        assert unasked.user == "c-9"
        assert "ran unasked (consent waived)" in unasked.line()
        assert (decided.tool, decided.via, decided.by, decided.ran) == (
            "refund",
            "desk",
            "ann",
            True,
        )
        assert "approved by ann" in decided.line()
