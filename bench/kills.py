"""Recovery with two workers: SIGKILL one of them at random moments while turns run,
start a replacement, and time how long each turn in flight at a kill waits for its
next step (a workflow task or an activity completed after the kill) and for its code
to run again (a workflow task completed after the kill).

A turn whose workflow task or local activity was on the killed worker waits for the
workflow task timeout; one whose model call was, for the heartbeat timeout and the
first retry's backoff, and then, its next workflow task being queued for the killed
worker, for the sticky queue's timeout (`workflows/policies.py`, `worker.py`).
"""

from __future__ import annotations

import asyncio
import random
import signal
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from durable_agent.bench.measure import pct, spawn_worker, stop
from durable_agent.bench.models import TASK_QUESTION
from durable_agent.runtime.turns import start_turn
from durable_agent.types import Outcome, TurnInput

KILLS = 20
IN_FLIGHT = 8
MODEL = "paced:150"  # two tools in sequence, 150 ms per model call: ~0.6 s per turn
# Between kills: longer than the longest wait one kill causes (heartbeat 2 s, retry
# 0.5 s, the call, then 2 s on the dead worker's sticky queue), so a turn's wait is
# that of one kill, not two in a row.
SETTLE_S = (6.0, 8.0)

# The turn's last event counts too: it shares its workflow task's batch, and a kill
# can fall between the two timestamps.
CODE = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
}
STEP = CODE | {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
}


@dataclass
class Run:
    client: Client
    task_queue: str
    turn_ids: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    running: bool = True

    async def feed(self) -> None:
        """One lane of turns, back to back, until told to stop."""
        while self.running:
            handle = await start_turn(
                self.client, TurnInput(question=TASK_QUESTION, model=MODEL), self.task_queue
            )
            self.turn_ids.append(handle.id)
            result = await handle.result()
            if result.outcome is not Outcome.ANSWERED or "rtn001" not in result.answer:
                self.wrong.append(handle.id)


async def kill_one_of_two(
    client: Client, address: str, db: Path, kills: int = KILLS, seed: int = 7
) -> dict[str, Any]:
    """`kills` SIGKILLs of one of two workers; each turn's wait after each kill."""
    rng = random.Random(seed)
    run = Run(client, f"bench-kills-{uuid.uuid4().hex[:6]}")
    workers: list[Popen[str]] = [spawn_worker(address, run.task_queue, db) for _ in range(2)]
    lanes = [asyncio.create_task(run.feed()) for _ in range(IN_FLIGHT)]
    kill_times: list[float] = []
    try:
        await asyncio.sleep(2)
        for _ in range(kills):
            await asyncio.sleep(rng.uniform(*SETTLE_S))
            doomed = workers.pop(rng.randrange(2))
            kill_times.append(time.time())
            doomed.send_signal(signal.SIGKILL)
            doomed.wait()
            workers.append(spawn_worker(address, run.task_queue, db))
        await asyncio.sleep(rng.uniform(*SETTLE_S))
        run.running = False
        await asyncio.gather(*lanes)
    finally:
        run.running = False
        for lane in lanes:
            lane.cancel()
        for w in workers:
            stop(w)
    step, code = await waits_after(client, run.turn_ids, kill_times)
    return {
        "kills": kills,
        "turns": len(run.turn_ids),
        "wrong_answers": len(run.wrong),
        "turns_in_flight_at_a_kill": len(step),
        "next_step_s": summary(step),
        "code_runs_again_s": summary(code),
    }


def summary(waits: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(waits), 2),
        "p95": round(pct(waits, 0.95), 2),
        "max": round(max(waits), 2),
    }


async def waits_after(
    client: Client, turn_ids: list[str], kill_times: list[float]
) -> tuple[list[float], list[float]]:
    """For every (kill, turn running at that kill): seconds until the turn's next
    step, and until its code next ran."""
    step, code = [], []
    for turn_id in turn_ids:
        events = [e async for e in client.get_workflow_handle(turn_id).fetch_history_events()]
        times = [(e.event_type, e.event_time.ToDatetime().timestamp()) for e in events]
        started, ended = times[0][1], times[-1][1]
        for kill in kill_times:
            if started < kill < ended:
                step.append(min(t for kind, t in times if kind in STEP and t > kill) - kill)
                code.append(min(t for kind, t in times if kind in CODE and t > kill) - kill)
    return step, code
