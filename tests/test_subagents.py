"""Agents as tools: a tool answered by a sub-agent's own turn, as a child workflow
with only its tools, its instructions and the rest of the parent's budget; its
usage rolls up; a worker killed during the child's activities loses nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from durable_agent.model import ModelRequest, Reply
from durable_agent.runtime.turns import start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import TOOLS_WITH_POLICY_EXPERT, ShopStore
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits
from durable_agent.workflows import AgentTurn
from tests.conftest import Harness, last_result

ROOT = Path(__file__).resolve().parent.parent
ASK_EXPERT = ToolCall(
    id="c1", name="policy_expert", arguments={"question": "Do you ship to Canada?"}
)


def parent_and_expert() -> ScriptedModel:
    """One scripted model for both: the parent asks the expert; the expert (given
    only the policy search) looks it up; both answer with what they were told."""

    def plan(request: ModelRequest) -> Reply:
        if [t.name for t in request.tools] == ["search_policies"]:  # the expert
            call = ToolCall(id="e1", name="search_policies", arguments={"query": request.question})
            return Reply(calls=[call])
        return Reply(calls=[ASK_EXPERT])

    return ScriptedModel(plans=[plan], decisions=[lambda req: Reply(text=last_result(req))])


async def test_an_agent_tool_runs_the_expert_as_a_child_turn(harness: Harness) -> None:
    model = parent_and_expert()
    async with harness.worker(model, TOOLS_WITH_POLICY_EXPERT) as task_queue:
        turn = TurnInput(
            question="Can I get my order in Toronto?",
            model="scripted",
            limits=TurnLimits(max_steps=4),
        )
        handle = await start_turn(harness.client, turn, task_queue)
        result = await handle.result()
        child = harness.client.get_workflow_handle_for(
            AgentTurn.run, f"{handle.id}-policy_expert-1-0"
        )
        child_result = await child.result()
        child_desc = await child.describe()

    assert result.outcome is Outcome.ANSWERED
    assert "Canada" in result.answer  # the shipping policy, through the expert
    assert child_result.answer == result.answer
    assert child_desc.parent_id == handle.id  # under Relationships in the Web UI
    # Usage rolls up: the parent's two calls and the expert's two.
    assert result.usage.model_calls == 4
    # The top-level agent was offered the expert, not the policy search itself;
    # the expert only the policy search, with its own instructions and budget.
    parent_request, expert_request = model.requests[0][1], model.requests[1][1]
    assert "search_policies" not in [t.name for t in parent_request.tools]
    assert "policy_expert" in [t.name for t in parent_request.tools]
    assert [t.name for t in expert_request.tools] == ["search_policies"]
    assert expert_request.instructions.startswith("You are the store's policy expert")
    child_input = (await child.fetch_history()).events[0]
    assert child_input.workflow_execution_started_event_attributes.parent_workflow_execution
    steps = [s for s in result.steps if s.kind is StepKind.TOOL_CALL]
    assert steps[0].text.endswith(f"→ {handle.id}-policy_expert-1-0")


async def test_the_top_level_agent_cannot_call_a_sub_agents_tool(harness: Harness) -> None:
    direct = ToolCall(id="c1", name="search_policies", arguments={"query": "shipping"})
    model = ScriptedModel(
        plans=[Reply(calls=[direct])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with harness.worker(model, TOOLS_WITH_POLICY_EXPERT) as task_queue:
        turn = TurnInput(question="Shipping?", model="scripted", limits=TurnLimits(max_replans=0))
        result = await (await start_turn(harness.client, turn, task_queue)).result()
    assert result.answer.startswith("unknown tool 'search_policies'")
    assert "policy_expert" in result.answer


async def test_a_worker_killed_during_the_childs_activities_loses_nothing(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Offline models: the parent asks the expert, the worker dies right after the
    expert's policy search ran; a new worker finishes both turns."""
    task_queue = f"expert-{uuid.uuid4().hex[:6]}"
    db, marker = tmp_path / "shop.db", tmp_path / "hung"
    ShopStore(db)
    address = env.client.service_client.config.target_host

    def spawn(*extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "durable_agent.bench.worker",
                address,
                task_queue,
                str(db),
                *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "AGENT_POLICY_EXPERT": "1"},
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    first = spawn("--crash-after", "dispatch", "--marker", str(marker))
    second = None
    try:
        handle = await start_turn(
            env.client, TurnInput(question="Do you ship to Canada?"), task_queue
        )
        while not marker.exists():
            await asyncio.sleep(0.05)
        first.kill()
        first.wait()
        second = spawn()
        result = await asyncio.wait_for(handle.result(), timeout=60)
        child = env.client.get_workflow_handle(f"{handle.id}-policy_expert-1-0")
        status = (await child.describe()).status
    finally:
        for proc in (first, second):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert result.outcome is Outcome.ANSWERED and "Canada" in result.answer
    assert status == WorkflowExecutionStatus.COMPLETED
