"""Fairness: does one customer's burst starve another's turns on a shared task queue?

    python -m durable_agent.bench.fairness [--a 200] [--b 5] [--slots 2] [--no-eager]
                    [--sticky-wait 2] [--fair-only]

Starts a dev server twice, without and with Temporal's task fairness
(`--dynamic-config-value matching.enableFairness=true`; the `temporal` CLI 1.9.1 =
Server 1.32 has it off by default), and on each: one worker with few slots (`--slots`
activities and workflow tasks at once, so that a backlog forms on the server), the
offline model and the demo shop's tools. It times customer B's turns alone, then
queues A's burst and B's turns right after it, and times B's turns again. Every turn
carries its customer as its fairness key (`runtime.turns.fairness_key`), which its
activities inherit. Without fairness B waits behind A's whole backlog; with it, B's
tasks take their turn beside A's. Figures from one run compare with each other only.

`--no-eager`: the worker takes no activity eagerly. By default a worker that completes
a workflow task with a free activity slot runs the activities it schedules at once,
handed back in the completion's reply: they never wait in the server's queue, where
fairness is decided, so a burst's own activities can take the slots B's wait for.

Where B's time goes: for B's turns alone and beside the burst, the seconds their tasks
waited to start (read from their histories, per turn, the median of the turns), by
where they waited: a workflow task on the task queue (a turn's first, and any whose
worker did not take it in time), one on the worker's sticky queue (the others: the
worker holds the turn in its cache), an activity task; and how many sticky tasks timed
out to the task queue. `--sticky-wait S`: the worker's
`sticky_queue_schedule_to_start_timeout` (the product's default: 2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from temporalio.api.enums.v1 import EventType, TaskQueueKind, TimeoutType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from durable_agent.commands.worker import build_worker
from durable_agent.model import ModelCatalog
from durable_agent.offline import OfflineModel
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.server import DEV_SERVER_TUNING, FAIRNESS, temporal_cli
from durable_agent.runtime.turns import fairness_key, start_turn
from durable_agent.settings import Settings
from durable_agent.types import TurnInput
from durable_agent.workflows import search

QUESTION = "Which item was ordered for 123456?"


async def _turns(client: Client, task_queue: str, customer: str, n: int) -> list[object]:
    turn = TurnInput(question=QUESTION, customer_id=customer, model="offline")
    return [await start_turn(client, turn, task_queue) for _ in range(n)]


async def _done(handles: Sequence[object]) -> float:
    """Seconds until every turn of `handles` has its result, from now."""
    began = time.monotonic()
    await asyncio.gather(*(h.result() for h in handles))  # type: ignore[attr-defined]
    return time.monotonic() - began


async def _keyed(client: Client, workflow_id: str) -> str:
    """The fairness key the turn started with (its activities' when they set none: the
    server merges the workflow's priority into each task it schedules)."""
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        return event.workflow_execution_started_event_attributes.priority.fairness_key
    return ""


WAITS = ("task queue", "sticky queue", "activities", "sticky timeouts")
"""Where a turn's tasks waited to start (seconds), and how many sticky tasks timed out."""


async def waits(client: Client, workflow_id: str) -> dict[str, float]:
    """Seconds the turn's tasks waited between scheduled and started, by `WAITS`."""
    got = dict.fromkeys(WAITS, 0.0)
    scheduled: dict[int, tuple[float, str]] = {}
    async for e in client.get_workflow_handle(workflow_id).fetch_history_events():
        at = e.event_time.ToDatetime().timestamp()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            kind = e.workflow_task_scheduled_event_attributes.task_queue.kind
            sticky = kind == TaskQueueKind.TASK_QUEUE_KIND_STICKY
            scheduled[e.event_id] = (at, "sticky queue" if sticky else "task queue")
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[e.event_id] = (at, "activities")
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            since, where = scheduled[e.workflow_task_started_event_attributes.scheduled_event_id]
            got[where] += at - since
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            since, where = scheduled[e.activity_task_started_event_attributes.scheduled_event_id]
            got[where] += at - since
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            timeout = e.workflow_task_timed_out_event_attributes.timeout_type
            got["sticky timeouts"] += timeout == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START
    return got


async def median_waits(client: Client, handles: Sequence[object]) -> dict[str, float]:
    each = [await waits(client, h.id) for h in handles]  # type: ignore[attr-defined]
    return {k: statistics.median(w[k] for w in each) for k in WAITS}


@dataclass
class Run:
    b_alone_s: float
    b_beside_burst_s: float
    a_burst_s: float
    b_alone_waits: dict[str, float]
    b_beside_waits: dict[str, float]


async def run_once(
    fair: bool,
    a: int,
    b: int,
    slots: int,
    flags: Sequence[str] = (),
    eager: bool = True,
    sticky_wait: float = 2.0,
) -> Run:
    extra = [x for f in flags for x in ("--dynamic-config-value", f)]
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=[*DEV_SERVER_TUNING, *(FAIRNESS if fair else []), *extra],
        data_converter=data_converter(),
        search_attributes=search.ALL,
    )
    try:
        client = env.client
        task_queue = f"fair-{uuid.uuid4().hex[:8]}"
        settings = replace(Settings.from_env(), versioning=False)
        async with build_worker(
            client,
            task_queue,
            settings=settings,
            models=ModelCatalog({"offline": lambda _: OfflineModel()}),
            max_concurrent_activities=slots,
            max_concurrent_workflow_tasks=slots,
            disable_eager_activity_execution=not eager,
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky_wait),
        ):
            b_alone = await _turns(client, task_queue, "customer-b", b)
            alone = await _done(b_alone)
            burst = await _turns(client, task_queue, "customer-a", a)
            began = time.monotonic()
            bs = await _turns(client, task_queue, "customer-b", b)
            b_time = await _done(bs)
            a_time = await _done(burst) + (time.monotonic() - began - b_time)
            key = await _keyed(client, bs[0].id)  # type: ignore[attr-defined]
            assert key == fairness_key(TurnInput(question="x", customer_id="customer-b")), key
            alone_waits = await median_waits(client, b_alone)
            beside_waits = await median_waits(client, bs)
    finally:
        await env.shutdown()
    return Run(alone, b_time, max(a_time, b_time), alone_waits, beside_waits)


def _row(name: str, w: dict[str, float]) -> str:
    return f"  {name:<20}" + "".join(f"{w[k]:>16.2f}" for k in WAITS)


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", type=int, default=200, help="A's burst, in turns")
    parser.add_argument("--b", type=int, default=5, help="B's turns")
    parser.add_argument("--slots", type=int, default=2, help="the worker's slots of each kind")
    parser.add_argument(
        "--no-eager", action="store_true", help="no eager activities: every task queues"
    )
    parser.add_argument(
        "--sticky-wait", type=float, default=2.0, help="the worker's sticky queue wait, seconds"
    )
    parser.add_argument("--fair-only", action="store_true", help="skip the run without fairness")
    args = parser.parse_args(argv)
    eager = "" if not args.no_eager else "; no eager activities"
    print(
        f"{args.a} turns of A queued, then {args.b} of B; worker slots: {args.slots}{eager}; "
        f"sticky wait {args.sticky_wait:g} s; load average {os.getloadavg()[0]:.1f}"
    )
    print("server                       B alone   B beside A's burst   ratio   A's burst")
    for fair in (True,) if args.fair_only else (False, True):
        got = await run_once(
            fair, args.a, args.b, args.slots, eager=not args.no_eager, sticky_wait=args.sticky_wait
        )
        ratio = got.b_beside_burst_s / got.b_alone_s
        name = "matching.enableFairness=true" if fair else "default (fairness off)"
        print(
            f"{name:<28} {got.b_alone_s:6.1f} s   {got.b_beside_burst_s:10.1f} s"
            f"         {ratio:5.1f}x  {got.a_burst_s:7.1f} s"
        )
        print("  B's tasks waited (s, a turn)" + "".join(f"{k:>16}" for k in WAITS))
        print(_row("alone", got.b_alone_waits))
        print(_row("beside the burst", got.b_beside_waits))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
