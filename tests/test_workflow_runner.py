"""The agents' workflows run as plain code, every other workflow of the worker in the
runner it was given (the SDK's sandbox by default), and all of them in the sandbox
when the settings say so (`durable_agent.plugin.AgentWorkflowRunner`)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import WorkflowRunner

from durable_agent.plugin import AgentWorkflowRunner
from durable_agent.runtime.turns import start_turn
from durable_agent.settings import Settings
from durable_agent.types import TurnInput
from durable_agent.workflows import AgentTurn, Conversation, UnversionedConversation
from tests.conftest import Harness
from tests.sandbox_probe import SandboxProbe


class Recording(WorkflowRunner):
    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.made: list[str] = []

    def prepare_workflow(self, defn: Any) -> None:
        self.prepared.append(defn.name)

    def create_instance(self, det: Any) -> Any:
        self.made.append(det.defn.name)
        return det.defn.name


def details(cls: type) -> Any:
    return SimpleNamespace(defn=SimpleNamespace(cls=cls, name=cls.__name__))


@pytest.mark.parametrize("sandbox", [False, True])
def test_the_agents_workflows_leave_the_sandbox_unless_asked(sandbox: bool) -> None:
    given, plain = Recording(), Recording()
    runner = AgentWorkflowRunner(given, sandbox=sandbox, plain=plain)
    for cls in (AgentTurn, Conversation, UnversionedConversation, SandboxProbe):
        runner.prepare_workflow(details(cls).defn)
        runner.create_instance(details(cls))
    # Every workflow is checked in the given runner (the sandbox) as the worker starts.
    assert given.prepared == [
        "AgentTurn",
        "Conversation",
        "UnversionedConversation",
        "SandboxProbe",
    ]
    ours = ["AgentTurn", "Conversation", "UnversionedConversation"]
    assert plain.made == ([] if sandbox else ours)
    assert given.made == (ours if sandbox else []) + ["SandboxProbe"]


@pytest.mark.parametrize("sandbox", [False, True])
async def test_a_worker_keeps_its_other_workflows_in_the_sandbox(
    harness: Harness, sandbox: bool
) -> None:
    """A turn answers either way; a workflow of the worker's own stays sandboxed."""
    client: Client = harness.client
    settings = replace(Settings.from_env(), versioning=False, workflow_sandbox=sandbox)
    async with harness.worker(workflows=[SandboxProbe], settings=settings) as task_queue:
        probe = await client.execute_workflow(
            SandboxProbe.run, id=f"probe-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        turn = TurnInput(question="Which item was ordered for 123456?")
        result = await (await start_turn(client, turn, task_queue)).result()
    assert probe is True
    assert "Herbal Handsoap" in result.answer
