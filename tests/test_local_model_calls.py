"""Model calls as local activities (`Agent(model_calls="local")`), on a real server: the
turn answers as one whose calls are activities does, in fewer workflow tasks and with no
call input in its history; a worker that never saw the turn reads the conversation from
the calls' markers; a fork reads them too; and an activity that needs a call's
conversation before the history records it waits for the record."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from durable_agent.activities import _conversation as conversation
from durable_agent.agents import Agent
from durable_agent.client import AgentClient
from durable_agent.commands.worker import build_worker
from durable_agent.conversation import ToolResult
from durable_agent.model import ModelCatalog, Reply
from durable_agent.runtime.turns import decide, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.shop import TOOLS, ShopStore
from durable_agent.stream import TokensEvent
from durable_agent.types import Outcome, StepKind, TurnInput
from tests.conftest import Harness, story
from tests.test_long import forget_every_conversation
from tests.test_mcp import next_pending
from tests.test_rewind import (
    QUESTION,
    TOOLS_AND_STOCK,
    WAIVED,
    Forking,
    original,
    three_steps,
)
from tests.test_stream import read_turn


def scheduled(events: Sequence[HistoryEvent]) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


def workflow_tasks(events: Sequence[HistoryEvent]) -> int:
    return sum(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in events)


def local(agent: Agent) -> Agent:
    return replace(agent, model_calls="local")


async def test_a_turn_of_local_calls_answers_as_one_of_activities_in_fewer_tasks(
    harness: Harness, tmp_path: Path
) -> None:
    seen = {}
    for how in ("activity", "local"):
        model = three_steps()
        agent = replace(
            harness.agent(TOOLS_AND_STOCK, approvals=WAIVED),
            model_calls=how,
            deps=ShopStore(tmp_path / f"{how}.db"),  # each turn writes to a shop of its own
        )
        async with harness.worker(model, agents=[agent]) as task_queue:
            turn = TurnInput(question=QUESTION, model="scripted")
            handle = await start_turn(harness.client, turn, task_queue)
            result = await handle.result()
        seen[how] = result, model, (await handle.fetch_history()).events
    (activity, as_activities, their_events) = seen["activity"]
    (result, model, events) = seen["local"]
    assert result.outcome is Outcome.ANSWERED and result.answer == activity.answer
    # The model read the same conversation at every call.
    assert [r.messages for _, r in model.requests] == [
        r.messages for _, r in as_activities.requests
    ]
    assert [s.kind for s in story(result)] == [s.kind for s in story(activity)]
    assert {"plan", "interpret"} <= set(scheduled(their_events))
    assert not {"plan", "interpret"} & set(scheduled(events))
    assert workflow_tasks(events) < workflow_tasks(their_events)
    assert len(events) < len(their_events)


@asynccontextmanager
async def worker_of(
    harness: Harness, task_queue: str, agent: Agent, model: ScriptedModel
) -> AsyncIterator[None]:
    """A worker of `task_queue` with activities of its own (no conversation at hand)."""
    settings = replace(Settings.from_env(), versioning=False)
    catalog = ModelCatalog({"scripted": lambda _: model})
    async with build_worker(
        harness.client, task_queue, agents=[agent], models=catalog, settings=settings
    ):
        yield


async def test_a_worker_that_never_saw_the_turn_reads_its_conversation_from_the_markers(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn waits for consent to its write; its worker stops, and a worker started
    since takes the turn on: its next model call reads the conversation so far from
    the markers of the calls before it."""
    read = conversation._recorded_deltas
    reads: list[int | None] = []

    async def counted(workflow_id: str, run_id: str, before: str, through: int | None) -> Any:
        reads.append(through)
        return await read(workflow_id, run_id, before, through)

    monkeypatch.setattr(conversation, "_recorded_deltas", counted)
    model = three_steps()
    agent = local(harness.agent(TOOLS_AND_STOCK))
    task_queue = f"local-{uuid.uuid4().hex[:8]}"
    turn = TurnInput(question=QUESTION, model="scripted")
    async with worker_of(harness, task_queue, agent, model):
        handle = await start_turn(harness.client, turn, task_queue)
        waiting = await next_pending(handle)
        assert waiting.call.name == "start_return"
    async with worker_of(harness, task_queue, agent, model):
        assert not reads  # the first worker had every conversation at hand
        await decide(harness.client, handle.id, waiting.call.id, approved=True, by="test")
        async with asyncio.timeout(60):
            result = await handle.result()
    assert reads == [2]  # the call after the write read the two calls before it
    assert result.outcome is Outcome.ANSWERED and result.answer == "Your return is started."
    assert len(harness.store.returns_for("123456")) == 1
    after_the_write = model.requests[-2][1].messages  # the call that read the write
    assert [m.tool for m in after_the_write if isinstance(m, ToolResult)] == [
        "order_status",
        "start_return",
    ]
    assert len(after_the_write) == 1 + 2 * 2  # the question, then a call and a result a round


async def test_a_turn_of_local_calls_forks_from_the_markers(harness: Harness) -> None:
    model = Forking(three_steps())
    agent = local(harness.agent(TOOLS_AND_STOCK, approvals=WAIVED))
    async with harness.worker(model, agents=[agent]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(harness, agents)
        later = ScriptedModel(decisions=[Reply(text="Return started; that is all.")])
        model.then(later)
        result = await (await agents.rerun(first.workflow_id, from_step=3)).result()
    assert result.answer == "Return started; that is all."
    assert len(harness.store.returns_for("123456")) == 1
    (request,) = [r for _, r in later.requests]
    assert [m.tool for m in request.messages if isinstance(m, ToolResult)] == [
        "order_status",
        "start_return",
    ]


async def test_with_no_conversation_kept_an_activity_waits_for_the_calls_record(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker keeps a copy: the checks and model calls that run in the workflow task
    of the call whose conversation they read wait until the SDK records its marker
    (it extends a task that runs long), and the turn answers as it would."""
    forget_every_conversation(monkeypatch)
    model = three_steps()
    agent = local(harness.agent(TOOLS_AND_STOCK, approvals=WAIVED))
    async with harness.worker(model, agents=[agent]) as task_queue:
        turn = TurnInput(question=QUESTION, model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        result = await handle.result()
    assert result.outcome is Outcome.ANSWERED and result.answer == "Your return is started."
    assert not [s for s in result.steps if s.kind is StepKind.LIMIT]
    last = model.requests[-1][1].messages
    assert [m.tool for m in last if isinstance(m, ToolResult)] == [
        "order_status",
        "start_return",
        "stock",
    ]


def test_an_unknown_way_to_call_the_model_is_refused() -> None:
    with pytest.raises(ValueError, match="model_calls='remote': use 'activity'"):
        Agent(name="x", tools=TOOLS, model_calls="remote")  # type: ignore[arg-type]


async def test_a_streamed_turn_calls_the_model_as_activities_and_streams_its_text(
    harness: Harness,
) -> None:
    """The workflow takes a call's text as it comes only from an activity: a turn that
    streams calls the model so, whatever the agent says."""
    agent = local(harness.agent())
    async with harness.worker(agents=[agent]) as task_queue:
        turn = TurnInput(question="Has order 123456 shipped?", stream=True)
        handle = await start_turn(harness.client, turn, task_queue)
        events = await read_turn(harness, handle.id)
        result = await handle.result()
    assert result.outcome is Outcome.ANSWERED
    assert [e for _, e in events if isinstance(e, TokensEvent)], "the answer's text streamed"
    assert {"plan", "interpret"} <= set(scheduled((await handle.fetch_history()).events))
