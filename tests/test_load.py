"""Many turns at once on one worker: under injected faults, and at load."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import WorkflowHandle

from durable_agent.runtime.chaos import Faults
from durable_agent.runtime.turns import start_turn
from durable_agent.types import Outcome, TurnInput, TurnLimits
from tests.conftest import SEED_CASES, Harness


async def run_many(harness: Harness, task_queue: str, n: int) -> None:
    cases = [SEED_CASES[i % len(SEED_CASES)] for i in range(n)]
    # Correctness under load, not latency: a loaded 2-core machine may take longer
    # than the default max_duration to get through 200 turns.
    limits = TurnLimits(max_duration=timedelta(minutes=10))
    handles = await asyncio.gather(
        *(
            start_turn(harness.client, TurnInput(question=q, limits=limits), task_queue)
            for q, _ in cases
        )
    )
    results = await asyncio.gather(*(h.result() for h in handles))
    # A worker takes only as many workflow tasks as it gets through within their
    # timeout (workflows/policies.py, worker.py): none may have overrun it. Tasks that
    # waited too long on the busy worker's sticky queue and moved to the shared one
    # (schedule-to-start) are Temporal doing its job, not an overrun.
    timed_out = [h.id for h in handles if await task_overruns(h)]
    assert not timed_out, f"{len(timed_out)} turn(s) had a workflow task overrun its timeout"
    wrong = [
        (q, r.answer)
        for (q, expected), r in zip(cases, results, strict=True)
        if r.outcome is not Outcome.ANSWERED or expected not in r.answer
    ]
    assert not wrong, wrong[:3]
    assert len({h.id for h in handles}) == n


async def task_overruns(handle: WorkflowHandle) -> int:
    return sum(
        [
            e.workflow_task_timed_out_event_attributes.timeout_type
            == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE
            async for e in handle.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
        ]
    )


async def test_fifty_turns_at_thirty_percent_transient_faults(harness: Harness) -> None:
    faults = Faults(rate=0.3, latency=0.005, seed=42)
    async with harness.worker(faults=faults) as task_queue:
        await run_many(harness, task_queue, 50)
    assert faults.injected >= 20  # ~0.3 × ~130 model and tool calls


async def test_two_hundred_concurrent_turns_on_one_worker(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        await run_many(harness, task_queue, 200)
