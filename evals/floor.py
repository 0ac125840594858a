"""Temporal's own floor for the oracle's episodes (`python -m durable_agent.evals tau2
--floor`): each task's expected actions run by the barest workflow that keeps the same
promises about the world, on the run's own server. One workflow an episode; each step
asks the oracle (a local activity, as the durable run's model calls), then runs its
call: a read as a local activity, a write as an activity once the customer approved it
(the episode's memo says what waits, the runner reads it from the server and sends
an update). No agent: no parse, no provenance, no stream, no search attributes.

What a durable run costs above this is the agent's own; what this costs above the
plain loop (`--plain`) is Temporal's, on this machine, for these episodes."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durable_agent.evals import tau2
from durable_agent.evals.run import (
    APPROVER,
    Floor,
    Scoring,
    _close_scorer,
    _score,
    run_id,
    store_tools,
)

STEP_TIMEOUT = timedelta(seconds=30)
LOOK_EVERY_S = 0.05
"""How often the runner reads a waiting episode's memo (as `Consent.INTERVAL`)."""
WAITING = "waiting"
"""The memo key naming the step whose write waits for the customer (-1: none)."""


class FloorActivities:
    """The oracle's next action and the store's answer to a call, for `Tau2Floor`."""

    def __init__(self, store: tau2.EpisodeStore, tasks: list[Any]) -> None:
        self.store = store
        self.actions = {t.id: tau2.expected_actions(t) for t in tasks}
        self.writes = store_tools(store)

    @activity.defn(name="tau2_floor_step")
    async def step(self, task_id: str, done: int) -> list[Any]:
        """[tool, arguments, whether it writes] of the task's next action; [] when done."""
        actions = self.actions[task_id]
        if done >= len(actions):
            return []
        tool, arguments = actions[done]
        return [tool, arguments, self.writes[tool]]

    @activity.defn(name="tau2_floor_call")
    async def call(self, episode: str, key: str, tool: str, arguments: dict[str, Any]) -> str:
        write = self.writes[tool]
        return await asyncio.to_thread(self.store.call, episode, key, tool, arguments, write)


@workflow.defn(name="Tau2Floor")
class Tau2Floor:
    def __init__(self) -> None:
        self._waiting = -1
        self._approved: set[int] = set()

    @workflow.run
    async def run(self, episode: str, task_id: str) -> int:
        """The steps taken."""
        done = 0
        while True:
            step = await workflow.execute_local_activity_method(
                FloorActivities.step, args=[task_id, done], start_to_close_timeout=STEP_TIMEOUT
            )
            if not step:
                return done
            tool, arguments, write = step
            call = (episode, f"{episode}/{done}", tool, arguments)
            if write:
                self._waiting = done
                workflow.upsert_memo({WAITING: done})
                await workflow.wait_condition(lambda n=done: n in self._approved)  # type: ignore[misc]
                self._waiting = -1
                await workflow.execute_activity_method(
                    FloorActivities.call, args=call, start_to_close_timeout=STEP_TIMEOUT
                )
            else:
                await workflow.execute_local_activity_method(
                    FloorActivities.call, args=call, start_to_close_timeout=STEP_TIMEOUT
                )
            done += 1

    @workflow.update
    def approve(self, step: int, by: str) -> None:
        self._approved.add(step)

    @approve.validator
    def _check(self, step: int, by: str) -> None:
        if step != self._waiting:
            raise ApplicationError(f"step {step} is not waiting (waiting: {self._waiting})")


async def _approved(handle: WorkflowHandle[Any, int]) -> int:
    """The episode's result, each write approved as the customer would, once its memo
    (read from the server, not the worker) says it waits."""
    result = asyncio.ensure_future(handle.result())
    decided: set[int] = set()
    try:
        while not result.done():
            described = await handle.describe()
            waiting = await described.memo_value(WAITING, default=-1)
            if isinstance(waiting, int) and waiting >= 0 and waiting not in decided:
                await handle.execute_update(Tau2Floor.approve, args=[waiting, APPROVER])
                decided.add(waiting)
            await asyncio.wait([result], timeout=LOOK_EVERY_S)
        return result.result()
    finally:
        result.cancel()


async def floor_run(
    client: Client, domain: str, tasks: list[Any], *, state_dir: Path, concurrency: int = 4
) -> Floor:
    """The tasks' episodes as `Tau2Floor` workflows on a worker of this process,
    `concurrency` at a time; times leave scoring aside, and each episode is scored as
    the durable ones are."""
    # One store for the tasks, made afresh by each invocation (as the plain loop's);
    # workflows and their queue of this invocation's own, whatever an earlier one left.
    named = f"floor-{run_id(domain, 'oracle', [t.id for t in tasks])}"
    path = state_dir / f"{named}.db"
    for stale in state_dir.glob(f"{named}.db*"):
        stale.unlink()
    run = f"{named}-{uuid.uuid4().hex[:8]}"
    store = tau2.EpisodeStore(path, domain)
    activities = FloorActivities(store, tasks)
    gate = asyncio.Semaphore(concurrency)
    scoring = Scoring(len(tasks))
    ended: list[float] = []
    took: dict[str, float] = {}

    async def one(task: Any) -> bool:
        over = scoring.turn()
        try:
            async with gate:
                began = time.monotonic()
                episode = f"{run}-{task.id}"
                handle = await client.start_workflow(
                    Tau2Floor.run, args=[episode, task.id], id=episode, task_queue=run
                )
                await _approved(handle)
                ended.append(time.monotonic())
                took[task.id] = round(ended[-1] - began, 3)
        finally:
            over()
        scored = await scoring.run(_score, domain, task.id, str(path), episode)
        return bool(scored["reward"] == 1.0 and scored["store_matches_gold"])

    worker = Worker(
        client,
        task_queue=run,
        workflows=[Tau2Floor],
        activities=[activities.step, activities.call],
        # As the durable run's turns: outside the SDK's sandbox.
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    started = time.monotonic()
    try:
        async with worker:
            passed = await asyncio.gather(*(one(t) for t in tasks))
    finally:
        _close_scorer()
    return Floor(max(ended, default=started) - started, took, list(passed), scoring.cpu_seconds)
