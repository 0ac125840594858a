"""Worker versioning: every worker is a version of a worker deployment, and a turn
finishes on the version it started on.

A turn can wait a day for a person's consent. A worker deployed meanwhile with
changed workflow code would replay that turn on the new code and fail it (a
non-determinism error); Temporal's Worker Versioning pins each turn to the version
(code and agents) that started it instead, and sends new work to the *current*
version. So:

    AgentTurn      pinned: finishes, approvals and all, on the version it started on;
                   its sub-agents' turns follow it
    Conversation   auto-upgrade: its next step runs on the current version, so a
                   message sent after a deploy gets a turn of the new code; its own
                   code is small and must stay replay-compatible (`workflow.patched`;
                   the replay test in CI catches a change that is not)

A version is `<deployment>:<build id>`. The deployment defaults to the task queue,
the build id to a hash of the code (the core, workflows and activities) and of the
agents' fingerprints, so changing either makes a new version. Rolling out
(`docs/deploy.md`): start the new version's workers; make it current
(`temporal worker deployment set-current-version`, or ramp a percentage); watch the
old one drain (`client.py versions`); stop its workers when nothing runs on it.

`promote` says what a starting worker does with the deployment's current version:
`auto` (the default) makes itself current when the deployment has none (a first
deploy) or when no worker of the current one has polled for `ALIVE_S` (its workers
are gone: a restart with new code), and otherwise leaves it to the operator;
`always` makes itself current (a single development worker: the embedded server
does this); `never` leaves it to the operator. A turn started while the current
version has no workers waits in the queue and runs on the version made current
next: a workflow is pinned only once its first task has run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.deployment.v1 import WorkerDeploymentVersion as VersionMessage
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType, WorkerDeploymentVersionStatus
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentVersionRequest,
    SetWorkerDeploymentCurrentVersionRequest,
    UpdateWorkerDeploymentVersionMetadataRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from durable_agent.agents import AgentCard

log = logging.getLogger("durable_agent.deployments")

T = TypeVar("T")

UNVERSIONED = "__unversioned__"
_CODE = ("durable_agent", "workflows", "activities")


def build_id(fingerprints: Sequence[str]) -> str:
    """`b-` and 12 hex digits of a hash of the workflow-facing code and the agents'
    fingerprints: the same for the same code and agents, on any machine."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent.parent
    for package in _CODE:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    for fingerprint in sorted(fingerprints):
        digest.update(fingerprint.encode())
    return f"b-{digest.hexdigest()[:12]}"


def deployment_config(version: WorkerDeploymentVersion) -> WorkerDeploymentConfig:
    """A worker that is `version`; workflows that say nothing are pinned."""
    return WorkerDeploymentConfig(
        version=version,
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


@dataclass(frozen=True)
class Routing:
    current: str
    """The current version's build id ("" when the deployment has none)."""
    ramping: str = ""
    ramping_percentage: float = 0.0


async def routing(client: Client, deployment: str) -> Routing | None:
    """Where the deployment sends new work; None when it does not exist (yet)."""
    try:
        described = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
        )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    config = described.worker_deployment_info.routing_config
    return Routing(
        current=config.current_deployment_version.build_id,
        ramping=config.ramping_deployment_version.build_id,
        ramping_percentage=config.ramping_version_percentage,
    )


async def make_current(client: Client, version: WorkerDeploymentVersion) -> None:
    await client.workflow_service.set_worker_deployment_current_version(
        SetWorkerDeploymentCurrentVersionRequest(
            namespace=client.namespace,
            deployment_name=version.deployment_name,
            build_id=version.build_id,
            identity=f"durable-agent worker {version.build_id}",
            # The worker calling this is about to poll: do not wait for its pollers.
            allow_no_pollers=True,
        )
    )


ALIVE_S = 75.0
"""A worker long-polls for up to a minute: one not seen for longer is gone."""
WATCH_S = 15.0
"""How often an `auto` worker looks again while another version is current."""


async def live_build_ids(client: Client, task_queue: str) -> set[str]:
    """Build ids of the workers that polled `task_queue` for workflow tasks lately."""
    described = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    now = datetime.now(timezone.utc)
    return {
        poller.deployment_options.build_id
        for poller in described.pollers
        if (now - poller.last_access_time.ToDatetime(timezone.utc)).total_seconds() < ALIVE_S
    }


AGENTS_KEY = "durable-agent.agents"
"""The entry of a version's metadata that lists the agents it serves (their cards)."""


async def publish_agents(
    client: Client, version: WorkerDeploymentVersion, cards: Sequence[AgentCard]
) -> None:
    """Record on `version` the agents it serves, first the one that answers turns that
    name none: front ends show the words of the agent that answers (`current_agents`),
    and a starting worker sees what the current version serves. Plain JSON, not through
    the client's codec: cards are the agents' public words, for any client to read.
    Retries while the server has not yet heard of the version (its first poll)."""
    data = json.dumps({"agents": [c.model_dump() for c in cards]}).encode()
    request = UpdateWorkerDeploymentVersionMetadataRequest(
        namespace=client.namespace,
        deployment_version=_message(version),
        upsert_entries={AGENTS_KEY: Payload(metadata={"encoding": b"json/plain"}, data=data)},
        identity=f"durable-agent worker {version.build_id}",
    )
    await _once_known(
        lambda: client.workflow_service.update_worker_deployment_version_metadata(request)
    )


async def agents_of(client: Client, deployment: str, build_id: str) -> list[AgentCard] | None:
    """The agents version `build_id` of `deployment` serves, as it published them; None
    when it published none (a worker of another kind, or not started yet)."""
    try:
        described = await client.workflow_service.describe_worker_deployment_version(
            DescribeWorkerDeploymentVersionRequest(
                namespace=client.namespace,
                deployment_version=VersionMessage(deployment_name=deployment, build_id=build_id),
            )
        )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    entries = described.worker_deployment_version_info.metadata.entries
    if AGENTS_KEY not in entries:
        return None
    try:
        listed = json.loads(entries[AGENTS_KEY].data)["agents"]
        return [AgentCard.model_validate(card) for card in listed]
    except (ValueError, KeyError, TypeError, ValidationError):
        return None


async def current_agents(client: Client, deployment: str) -> list[AgentCard] | None:
    """The agents the deployment's current version serves (where new turns go); None
    when it has no current version, or that one published none."""
    now = await routing(client, deployment)
    if now is None or not now.current:
        return None
    return await agents_of(client, deployment, now.current)


def _message(version: WorkerDeploymentVersion) -> VersionMessage:
    return VersionMessage(deployment_name=version.deployment_name, build_id=version.build_id)


async def _once_known(call: Callable[[], Awaitable[T]]) -> T:
    """`call`, again while the server has not yet heard of a version (a worker's first
    poll creates it)."""
    attempt = 0
    while True:
        try:
            return await call()
        except RPCError as e:
            if e.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                raise
            attempt += 1
            if attempt > 40:
                raise
            await asyncio.sleep(min(0.25 * attempt, 2.0))


async def _serves_elsewhere(
    client: Client,
    version: WorkerDeploymentVersion,
    current: str,
    task_queue: str,
    agents: Sequence[str],
) -> None:
    """Say so, in one line, when the live current version does not serve some of
    `agents`: their turns would go to it, and end `unknown_agent`."""
    theirs = await agents_of(client, version.deployment_name, current)
    if theirs is None:
        return
    missing = [a for a in agents if a not in {c.name for c in theirs}]
    if missing:
        log.warning(
            "version %s is current on task queue %r and serves %s, not %s: turns for %s go "
            "there and end unknown_agent. Give this worker a task queue of its own "
            "(--task-queue), or make this version current (temporal worker deployment "
            "set-current-version --deployment-name %s --build-id %s)",
            current,
            task_queue,
            ", ".join(c.name for c in theirs) or "no agent",
            ", ".join(missing),
            ", ".join(missing),
            version.deployment_name,
            version.build_id,
        )


async def promote(
    client: Client,
    version: WorkerDeploymentVersion,
    how: str,
    task_queue: str,
    settled: asyncio.Event | None = None,
    agents: Sequence[str] = (),
) -> bool:
    """Make `version` current per `how` (see the module docstring); True once it is.
    `auto` keeps watching while another version is current and alive, and takes over
    when that one's workers are gone; if that one does not serve all of `agents` (this
    version's), it says so. Retries while the server has not yet heard of this worker's
    deployment (its first poll creates it). `settled` is set once the deployment has a
    current version that serves."""
    if how == "never":
        return False
    attempt = 0
    while True:
        try:
            now = await routing(client, version.deployment_name)
            if now is not None and now.current == version.build_id:
                return True
            if how == "auto" and now is not None and now.current:
                if now.current in await live_build_ids(client, task_queue):
                    if settled is not None and not settled.is_set():
                        log.info(
                            "version %s is current and has workers: this one (%s) takes "
                            "new work once it is made current (docs/deploy.md)",
                            now.current,
                            version.build_id,
                        )
                        await _serves_elsewhere(client, version, now.current, task_queue, agents)
                        settled.set()
                    await asyncio.sleep(WATCH_S)
                    continue
                log.info("version %s has no workers left: taking over", now.current)
            await make_current(client, version)
            log.info("version %s is current", version.build_id)
            return True
        except RPCError as e:
            if e.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                raise
            attempt += 1
            if attempt > 40:
                raise
            await asyncio.sleep(min(0.25 * attempt, 2.0))


@dataclass(frozen=True)
class VersionReport:
    build_id: str
    status: str
    """current, ramping, draining, drained, inactive"""
    turns: int
    awaiting_approval: int
    conversations: int


_STATUS = {
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CURRENT: "current",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_RAMPING: "ramping",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINING: "draining",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINED: "drained",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_INACTIVE: "inactive",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CREATED: "created",
}


async def versions(client: Client, deployment: str, indexed: bool) -> list[VersionReport]:
    """Each version of the deployment, newest first, with what still runs on it: turns
    (and how many wait for consent; `indexed`: the agent's search attributes exist)
    and conversations."""
    described = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )
    summaries = sorted(
        described.worker_deployment_info.version_summaries,
        key=lambda v: v.create_time.ToDatetime(),
        reverse=True,
    )
    reports = []
    for summary in summaries:
        build = summary.deployment_version.build_id
        on = (
            f"TemporalWorkerDeploymentVersion = '{deployment}:{build}' "
            "AND ExecutionStatus = 'Running'"
        )

        async def count(query: str) -> int:
            return (await client.count_workflows(query)).count

        turns = await count(f"{on} AND WorkflowType = 'AgentTurn'")
        waiting = (
            await count(
                f"{on} AND WorkflowType = 'AgentTurn' AND AgentStatus = 'awaiting_approval'"
            )
            if indexed
            else 0
        )
        chats = await count(f"{on} AND WorkflowType = 'Conversation'")
        reports.append(
            VersionReport(
                build_id=build,
                status=_STATUS.get(summary.status, "unknown"),
                turns=turns,
                awaiting_approval=waiting,
                conversations=chats,
            )
        )
    return reports
