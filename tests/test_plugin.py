"""The two documented ways to serve agents, together: `build_worker` on a client that
already carries `AgentPlugin` serves that plugin (the SDK applies a client's plugins
to each of its workers: a second plugin would register every activity twice), and
asked for anything the plugin cannot serve, it stops with one line."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from dataclasses import replace

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentPlugin, build_worker
from durable_agent.errors import AgentDefinitionError
from durable_agent.runtime.chaos import Faults
from durable_agent.runtime.turns import start_turn
from durable_agent.settings import Settings
from durable_agent.types import TurnInput
from tests.conftest import Harness


async def client_with(env: WorkflowEnvironment, plugin: AgentPlugin) -> Client:
    return await Client.connect(env.client.service_client.config.target_host, plugins=[plugin])


@pytest.mark.parametrize("again", [True, False], ids=["the-same-agent", "no-agent"])
async def test_build_worker_serves_the_plugin_its_client_carries(
    env: WorkflowEnvironment, harness: Harness, again: bool
) -> None:
    agent = harness.agent()
    plugin = AgentPlugin(agent, settings=replace(Settings.from_env(), versioning=False))
    client = await client_with(env, plugin)
    queue = f"plugin-{uuid.uuid4().hex[:8]}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the SDK warns of a plugin given twice
        worker = build_worker(client, *([agent] if again else []), task_queue=queue)
    async with worker:
        handle = await start_turn(
            client, TurnInput(question="Which item was ordered for 123456?"), queue
        )
        result = await handle.result()
    assert worker.plugin is plugin
    assert "Herbal Handsoap" in result.answer


async def test_build_worker_refuses_what_the_clients_plugin_cannot_serve(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    agent = harness.agent()
    client = await client_with(env, AgentPlugin(agent))
    other = replace(agent, name="other")
    for given, asked in (
        ([other], {}),
        ([agent], {"settings": replace(Settings.from_env(), model="other")}),
        ([], {"faults": Faults(rate=0.5)}),
    ):
        with pytest.raises(AgentDefinitionError) as refused:
            build_worker(client, *given, task_queue="unused", **asked)
        message = str(refused.value)
        assert message.startswith(f"the client already carries AgentPlugin({agent.name})")
        assert "call build_worker(client) with no agents" in message
        assert "\n" not in message


@pytest.mark.parametrize("versioning", [True, False], ids=["versioned", "unversioned"])
async def test_a_worker_that_fails_as_it_starts_says_why(
    env: WorkflowEnvironment, harness: Harness, versioning: bool
) -> None:
    """Its agents' deps cannot open: the worker stops with that error, not with the
    bare cancellation the SDK sends the task that started it, and does not wait for a
    shutdown of a run that never began."""

    def unreachable_store() -> None:
        raise OSError("the store is not there")

    agent = replace(harness.agent(), deps=unreachable_store)
    settings = replace(Settings.from_env(), versioning=versioning, promote="always")
    worker = build_worker(
        env.client, agent, task_queue=f"fails-{uuid.uuid4().hex[:8]}", settings=settings
    )
    with pytest.raises(OSError, match="the store is not there"):
        async with worker:
            await asyncio.Event().wait()  # until the failure cancels it
