"""Fairness keys, on a real server: a turn, a conversation and its turns start with
their customer as Temporal's fairness key (`runtime.turns.fairness_key`), bounded to
the server's 64 bytes whatever the customer id. Whether the server shares the task
queue by them is a measurement, not a test: `python -m durable_agent.bench.fairness`;
the lever it names (the worker's sticky wait, docs/operations.md) is one a test checks."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio.client import Client

from durable_agent import AgentClient, build_worker
from durable_agent.types import Outcome
from tests.conftest import Harness

LONG = "customer-" + "é" * 200  # 409 bytes


async def started_key(client: Client, workflow_id: str) -> str:
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        return event.workflow_execution_started_event_attributes.priority.fairness_key
    return ""


async def test_turns_carry_their_customer_as_fairness_key(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        ada = await client.start("Which item was ordered for 123456?", customer="ada")
        long = await client.start("Which item was ordered for 123456?", customer=LONG)
        chat = client.chat(customer="bo", stream=False)
        chat_turn = await chat.start("Which item was ordered for 123456?")
        for turn in (ada, long, chat_turn):
            assert (await turn.result()).outcome is Outcome.ANSWERED
        await chat.end()

    assert await started_key(harness.client, ada.id) == "ada"
    hashed = await started_key(harness.client, long.id)
    assert hashed.startswith("h-") and len(hashed.encode()) <= 64
    assert await started_key(harness.client, chat.id) == "bo"
    # A conversation's turns are its children: they start with its key.
    assert await started_key(harness.client, chat_turn.id) == "bo"


async def test_a_worker_takes_the_sticky_wait_it_is_given(harness: Harness) -> None:
    # The fairness lever docs/operations.md names: a task waiting longer than this on a
    # worker's sticky queue (first come first served) moves to the fair task queue.
    agent = harness.agent()
    given = build_worker(
        harness.client,
        agent,
        task_queue=f"fair-{uuid.uuid4().hex[:8]}",
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=0.2),
    )
    assert given.config()["sticky_queue_schedule_to_start_timeout"] == timedelta(seconds=0.2)
    default = build_worker(harness.client, agent, task_queue=f"fair-{uuid.uuid4().hex[:8]}")
    assert default.config()["sticky_queue_schedule_to_start_timeout"] == timedelta(seconds=2)
