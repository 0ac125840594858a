"""Who else uses a server: asked by the process that started the embedded server
before it stops it, since stopping it stops them too.

Temporal sees no client, only what clients leave: workflows still running (someone's
turns, conversations, waits for consent) and workers polling task queues. A worker
counts as another program's when its identity is not the stopping process's own
(the SDK's default, `pid@host`, unless a worker was given another) and it is live:
it polled within `POLL_WINDOW`, and no heartbeat since says it stopped or is
overdue (the rules of `runtime.turns.workers`, by identity rather than by count).

Temporal lists no task queues, so the ones asked about are those some sign names:
the stopping process's own, those of the workers' heartbeats (a worker beats first
one interval after it starts: 5 s for `worker.py`'s, a minute by the SDK's default),
those of running workflows, and the worker deployments' names (a version exists from
a worker's first poll, and a deployment is named after its task queue unless
AGENT_DEPLOYMENT says otherwise). A worker started a moment ago on a queue none of
these names is missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from temporalio.api.enums.v1 import TaskQueueType, WorkerStatus
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    ListWorkerDeploymentsRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError

from durable_agent.runtime.peers import base_of
from durable_agent.runtime.turns import worker_heartbeats

POLL_WINDOW = timedelta(seconds=75)
"""An idle worker polls again when its long poll (about a minute) runs out."""
HEARTBEAT_GRACE = timedelta(seconds=5)
"""Slack for a heartbeat on a busy machine, beyond two of its intervals."""
LISTED = 200
"""Running workflows read for their task queues (they are only counted beyond)."""


@dataclass(frozen=True)
class Others:
    workers: int
    """Live workers of other processes."""
    task_queues: tuple[str, ...]
    """The task queues they poll."""
    running: int
    """Workflows still running (whoever started them)."""

    def __bool__(self) -> bool:
        return bool(self.workers or self.running)

    def describe(self) -> str:
        """`2 workers of other programs poll it (task queue agent-turns) and 3 workflows
        run on it`"""
        parts = []
        if self.workers:
            queues = ", ".join(self.task_queues)
            parts.append(
                f"{_counted(self.workers, 'worker')} of other programs "
                f"{'polls' if self.workers == 1 else 'poll'} it "
                f"({'task queue' if len(self.task_queues) == 1 else 'task queues'} {queues})"
            )
        if self.running:
            parts.append(
                f"{_counted(self.running, 'workflow')} "
                f"{'runs' if self.running == 1 else 'run'} on it"
            )
        return " and ".join(parts)


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


async def others_using(
    client: Client, own_identity: str, task_queues: Iterable[str] = ()
) -> Others:
    """What besides this process still uses the server: live workers of other
    identities on `task_queues` and on those the server names (module docstring); and
    how many workflows run."""
    now = datetime.now(timezone.utc)
    queues = set(task_queues)
    gone: dict[str, datetime] = {}
    live: dict[str, str] = {}  # identity -> a task queue it serves
    try:
        beats = await worker_heartbeats(client)
    except RPCError:  # a server without worker heartbeats: the polls say it all
        beats = []
    for beat in beats:
        who = beat.worker_identity
        if base_of(who) == own_identity:  # this process's workers name their agents too
            continue
        queues.add(beat.task_queue)
        at = beat.heartbeat_time.ToDatetime(tzinfo=timezone.utc)
        interval = beat.elapsed_since_last_heartbeat.ToTimedelta()
        if beat.status != WorkerStatus.WORKER_STATUS_RUNNING:
            gone[who] = max(at, gone.get(who, at))
        elif interval and now - at > 2 * interval + HEARTBEAT_GRACE:
            late = at + 2 * interval + HEARTBEAT_GRACE
            gone[who] = max(late, gone.get(who, late))
        elif interval:
            live[who] = beat.task_queue
    try:
        deployments = await client.workflow_service.list_worker_deployments(
            ListWorkerDeploymentsRequest(namespace=client.namespace, page_size=1000)
        )
        queues.update(d.name for d in deployments.worker_deployments)
    except RPCError:  # a server without Worker Versioning
        pass
    running = (await client.count_workflows("ExecutionStatus = 'Running'")).count
    if running:
        async for wf in client.list_workflows("ExecutionStatus = 'Running'", limit=LISTED):
            queues.add(wf.task_queue)
    ordered = sorted(queues)
    # At once: a folder's server gathers a deployment per task queue ever served.
    polled = await asyncio.gather(*(_pollers(client, queue) for queue in ordered))
    for queue, pollers in zip(ordered, polled, strict=True):
        for who, at in pollers.items():
            polled_since_gone = who not in gone or at > gone[who]
            mine = base_of(who) == own_identity
            if not mine and now - at <= POLL_WINDOW and polled_since_gone:
                live.setdefault(who, queue)
    return Others(workers=len(live), task_queues=tuple(sorted(set(live.values()))), running=running)


async def _pollers(client: Client, task_queue: str) -> dict[str, datetime]:
    """Each poller of the queue (workflow or activity tasks) and its last poll."""
    last: dict[str, datetime] = {}
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=kind,
            )
        )
        for p in described.pollers:
            at = p.last_access_time.ToDatetime(tzinfo=timezone.utc)
            last[p.identity] = max(at, last.get(p.identity, at))
    return last
