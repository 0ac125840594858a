"""Many turns at once on one worker: under injected faults, and at load."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from agent.types import Outcome, TurnInput, TurnLimits
from client import start_turn
from runtime.chaos import Faults
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
    wrong = [
        (q, r.answer)
        for (q, expected), r in zip(cases, results, strict=True)
        if r.outcome is not Outcome.ANSWERED or expected not in r.answer
    ]
    assert not wrong, wrong[:3]
    assert len({h.id for h in handles}) == n


async def test_fifty_turns_at_thirty_percent_transient_faults(harness: Harness) -> None:
    faults = Faults(rate=0.3, latency=0.005, seed=42)
    async with harness.worker(faults=faults) as task_queue:
        await run_many(harness, task_queue, 50)
    assert faults.injected >= 20  # ~0.3 × ~130 model and tool calls


async def test_two_hundred_concurrent_turns_on_one_worker(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        await run_many(harness, task_queue, 200)
