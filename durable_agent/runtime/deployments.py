"""Worker versioning: every worker is a version of a worker deployment; a turn
finishes on the version it started on, and a conversation moves to a new version
only between turns.

A turn can wait a day for a person's consent. A worker deployed meanwhile with
changed workflow code would replay that turn on the new code and fail it (a
non-determinism error); Temporal's Worker Versioning pins each workflow to the
version (code and agents) that started it instead, and sends new work to the
*current* version. So:

    AgentTurn      pinned: finishes, approvals and all, on the version it started on;
                   its sub-agents' turns (child workflows) start on it too
    Conversation   pinned, run by run: when the current version changes, it continues
                   as new onto it at the next turn boundary (a turn ended, or a
                   message or the `upgrade` signal woke it while idle), carrying
                   its memory, its waiting messages and its stream. So a run never
                   replays on code it did not start on, and a message sent after a
                   deploy gets a turn of the new code

What still needs an old version's workers, then: its running turns, to their end
(those awaiting approval can take a day); its conversations with a turn in flight,
until that turn ends (then they move by themselves); and its idle conversations, for
one workflow task (their next message, or `move_conversations` now) in which they
move. `versions` counts each.

A version is `<deployment>:<build id>`. The deployment defaults to the task queue,
the build id to a hash of the code (the core, workflows and activities, and the
modules of the served agents' tools) and of the agents' fingerprints, so changing
any of them makes a new version. Rolling out (`docs/deploy.md`): start the new
version's workers; make it current (`temporal worker deployment set-current-version`,
or ramp a percentage); move the idle conversations; watch the old one drain
(`client.py versions`); stop its workers when nothing needs them.

`promote` says what a starting worker does with the deployment's current version:
`auto` (the default) makes itself current when the deployment has none (a first
deploy) or when no worker of the current one has polled for `ALIVE_S` (its workers
are gone: a restart with new code), and otherwise leaves it to the operator;
`always` makes itself current (a single development worker: the embedded server
does this); `never` leaves it to the operator. A turn started while the current
version has no workers waits in the queue and runs on the version made current
next: a workflow is pinned only once its first task has run.

A build id given by hand (`AGENT_BUILD_ID`) must name one release: a worker whose
code differs from the code already recorded for that version refuses to start
(`VersionConflict`), since turns pinned to it would replay on the wrong code.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import inspect
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
from temporalio.common import SearchAttributeKey, VersioningBehavior, WorkerDeploymentVersion
from temporalio.converter import default as default_converter
from temporalio.service import RPCError, RPCStatusCode

if TYPE_CHECKING:
    from temporalio.worker import WorkerDeploymentConfig

from durable_agent.agents import AgentCard

log = logging.getLogger("durable_agent.deployments")

T = TypeVar("T")

UNVERSIONED = "__unversioned__"
CORE = ("durable_agent", "durable_agent.workflows", "durable_agent.activities")
"""The packages every worker runs: the workflows and what they import."""
CORE_INSIDE = ("backends", "runtime", "shields")
"""`durable_agent`'s subpackages that are core: the others (the commands, the front
ends, an example agent, the evaluations, the benchmark) are no workflow's code, and an
agent's tools among them are hashed as its own source (`package_of`)."""


def core_folders() -> dict[str, Path]:
    """Where each `CORE` package's files are, in a clone or installed."""
    return {name: Path(str(importlib.import_module(name).__file__)).parent for name in CORE}


def build_id(
    fingerprints: Sequence[str],
    sources: Iterable[str] = (),
    folders: Mapping[str, Path] | None = None,
) -> str:
    """`b-` and 12 hex digits of a hash of the workflow-facing code (the `CORE`
    packages, in `folders`: default, where they are imported from), of `sources`
    (`sources_of`: the agents' own code) and of the agents' fingerprints: the same for
    the same code and agents, on any machine and however installed; a change to any of
    them is a new version."""
    digest = hashlib.sha256()
    for package, folder in sorted((folders or core_folders()).items()):
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder)
            inside = relative.parts[0] if len(relative.parts) > 1 else ""
            if package == "durable_agent" and inside and inside not in CORE_INSIDE:
                continue  # not core, or (in a wheel) hashed as its own package
            digest.update(f"{package}/{relative.as_posix()}".encode())
            digest.update(path.read_bytes())
    for source in sorted(set(sources)):
        digest.update(source.encode())
    for fingerprint in sorted(fingerprints):
        digest.update(fingerprint.encode())
    return f"b-{digest.hexdigest()[:12]}"


_INSTALLED = {"site-packages", "dist-packages"}


def package_of(module: str) -> str:
    """The package a module's source is hashed by: its top-level package, or for one of
    `durable_agent`'s own subpackages outside the core (an example agent), that one."""
    parts = module.split(".")
    inner = ".".join(parts[:2])
    own = parts[0] == "durable_agent" and inner not in CORE and parts[1] not in CORE_INSIDE
    if own and hasattr(sys.modules.get(inner), "__path__"):  # a subpackage, not a module
        return inner
    return parts[0]


def sources_of(functions: Iterable[Callable[..., Any]]) -> list[str]:
    """What names the code behind `functions` (tools), outside the core: for each
    one's package (`package_of`), a hash of its Python files, or, for one installed from
    a distribution, the distribution's name and version. So a changed tool (or the
    store it reads) is a new version, as a changed loop is: a turn approved
    tomorrow runs the tool code that was there when it was proposed.

    A tool whose package has no files to read (defined in a notebook, in `python -`,
    in code given to `exec`) is named by its own source where Python keeps it (a
    notebook's cells), else by nothing: a warning says so, since a change to its code
    then makes no new version (its name, description and schema still do, in the
    agent's fingerprint)."""
    packages: dict[str, list[Callable[..., Any]]] = {}
    for fn in functions:
        module = getattr(fn, "__module__", None) or ""
        packages.setdefault(package_of(module) if module else "", []).append(fn)
    distributions = importlib.metadata.packages_distributions()
    named = []
    for package in sorted(set(packages) - set(CORE)):
        file = getattr(sys.modules.get(package), "__file__", None) if package else None
        path = Path(file).resolve() if file else None
        if path is None or not path.is_file():  # no module file: '<stdin>', a notebook
            named.extend(_own_sources(package, packages[package]))
            continue
        dists = distributions.get(package.split(".")[0])
        if dists and _INSTALLED & set(path.parts):
            versions = sorted(f"{d}=={importlib.metadata.version(d)}" for d in set(dists))
            named.append(f"{package}:{','.join(versions)}")
            continue
        files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
        digest = hashlib.sha256()
        for f in files:
            digest.update(f.relative_to(path.parent).as_posix().encode())
            digest.update(f.read_bytes())
        named.append(f"{package}:{digest.hexdigest()}")
    return named


def _own_sources(package: str, functions: Iterable[Callable[..., Any]]) -> list[str]:
    """Each function's own source, where Python can find it (`inspect.getsource`: a
    file, a notebook's cell); a warning for each it cannot."""
    named = []
    for fn in functions:
        name = getattr(fn, "__qualname__", None) or repr(fn)
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):  # no file, or not Python code
            log.warning(
                "the source of tool function %s (module %s) cannot be read, so the build id "
                "does not cover its code: a change to it makes no new version. Define it in "
                "a module file, or set AGENT_BUILD_ID anew for each change",
                name,
                getattr(fn, "__module__", None) or "none",
            )
            continue
        digest = hashlib.sha256(source.encode()).hexdigest()
        named.append(f"{package or '-'}.{name}:{digest}")
    return named


def deployment_config(version: WorkerDeploymentVersion) -> WorkerDeploymentConfig:
    """A worker that is `version`; workflows that say nothing are pinned."""
    # The worker's import, here: the client side reads this module for every command.
    from temporalio.worker import WorkerDeploymentConfig

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
        described = await _read(
            lambda: client.workflow_service.describe_worker_deployment(
                DescribeWorkerDeploymentRequest(
                    namespace=client.namespace, deployment_name=deployment
                )
            )
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


async def publish(
    client: Client, version: WorkerDeploymentVersion, code: str, cards: Sequence[AgentCard]
) -> None:
    """Record on `version` the code it runs (see `claim`) and the agents it serves,
    first the one that answers turns that name none: front ends show the words of the
    agent that answers (`current_agents`), and a starting worker sees what the current
    version serves. Cards are plain JSON, not through the client's codec: they are the
    agents' public words, for any client to read. Retries while the server has not
    yet heard of the version (its first poll creates it)."""
    cards_json = json.dumps({"agents": [c.model_dump() for c in cards]}).encode()
    request = UpdateWorkerDeploymentVersionMetadataRequest(
        namespace=client.namespace,
        deployment_version=_message(version),
        upsert_entries={
            CODE_KEY: default_converter().payload_converter.to_payload(code),
            AGENTS_KEY: Payload(metadata={"encoding": b"json/plain"}, data=cards_json),
        },
        identity=f"durable-agent worker {version.build_id}",
    )
    await _once_known(
        lambda: client.workflow_service.update_worker_deployment_version_metadata(request)
    )


async def agents_of(client: Client, deployment: str, build_id: str) -> list[AgentCard] | None:
    """The agents version `build_id` of `deployment` serves, as it published them; None
    when it published none (a worker of another kind, or not started yet)."""
    entries = await _metadata(client, deployment, build_id)
    if entries is None or AGENTS_KEY not in entries:
        return None
    try:
        listed = json.loads(entries[AGENTS_KEY].data)["agents"]
        return [AgentCard.model_validate(card) for card in listed]
    except (ValueError, KeyError, TypeError, ValidationError):
        return None


async def _metadata(client: Client, deployment: str, build_id: str) -> Any | None:
    """A version's metadata entries (a map of payloads); None when there is no such
    version (yet)."""
    try:
        described = await _read(
            lambda: client.workflow_service.describe_worker_deployment_version(
                DescribeWorkerDeploymentVersionRequest(
                    namespace=client.namespace,
                    deployment_version=VersionMessage(
                        deployment_name=deployment, build_id=build_id
                    ),
                )
            )
        )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return described.worker_deployment_version_info.metadata.entries


async def current_agents(client: Client, deployment: str) -> list[AgentCard] | None:
    """The agents the deployment's current version serves (where new turns go); None
    when it has no current version, or that one published none."""
    now = await routing(client, deployment)
    if now is None or not now.current:
        return None
    return await agents_of(client, deployment, now.current)


def _message(version: WorkerDeploymentVersion) -> VersionMessage:
    return VersionMessage(deployment_name=version.deployment_name, build_id=version.build_id)


READ_AGAIN = (
    RPCStatusCode.CANCELLED,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.RESOURCE_EXHAUSTED,
)
"""A description the server could not give this time: it asks the deployment's own
workflow, which a busy server (a version being promoted) may answer late or not at all."""

READ_PAUSES_S = (0.25, 0.5, 1.0, 2.0)


async def _read(call: Callable[[], Awaitable[T]]) -> T:
    """`call` (a read), again after each pause of `READ_PAUSES_S` while the server
    answers it with one of `READ_AGAIN`; its last refusal otherwise."""
    for pause in READ_PAUSES_S:
        try:
            return await call()
        except RPCError as e:
            if e.status not in READ_AGAIN:
                raise
        await asyncio.sleep(pause)
    return await call()


async def _once_known(call: Callable[[], Awaitable[T]]) -> T:
    """`call`, again while the server has not yet heard of a version (a worker's first
    poll creates it), or asks for fewer requests to the deployment (many replicas
    starting at once)."""
    attempt = 0
    while True:
        try:
            return await call()
        except RPCError as e:
            again = (
                RPCStatusCode.NOT_FOUND,
                RPCStatusCode.FAILED_PRECONDITION,
                RPCStatusCode.RESOURCE_EXHAUSTED,
            )
            if e.status not in again:
                raise
            attempt += 1
            if attempt > 40:
                raise
            # Short at first: the version exists a moment after the first poll (0.1 to
            # 0.3 s, measured), and each worker starting waits here. Doubling to 2 s
            # keeps 40 attempts over about the same minute as before.
            await asyncio.sleep(min(0.05 * 2**attempt, 2.0))


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

    async def step() -> bool:
        """Current now (True), or another live version is current and stays (False)."""
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
                return False
            log.info("version %s has no workers left: taking over", now.current)
        await make_current(client, version)
        log.info("version %s is current", version.build_id)
        return True

    while not await _once_known(step):
        await asyncio.sleep(WATCH_S)
    return True


@dataclass(frozen=True)
class VersionReport:
    build_id: str
    status: str
    """current, ramping, draining, drained, inactive"""
    turns: int
    """Running turns pinned to it: they finish here."""
    awaiting_approval: int
    conversations: int
    """Running conversations on it: they move to the current version between turns."""
    mid_turn: int | None = None
    """Of those, the ones with a turn in flight (None: unknown, the agent's search
    attributes are not registered)."""

    @property
    def takes_new_work(self) -> bool:
        return self.status in ("current", "ramping")

    @property
    def idle(self) -> int | None:
        """Conversations between turns: they move at their next message (or `upgrade`)."""
        return None if self.mid_turn is None else self.conversations - self.mid_turn

    @property
    def needs_workers(self) -> bool:
        """Something still runs a workflow task here: its workers must stay."""
        return self.takes_new_work or bool(self.turns or self.conversations)


_STATUS = {
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CURRENT: "current",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_RAMPING: "ramping",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINING: "draining",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINED: "drained",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_INACTIVE: "inactive",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CREATED: "created",
}


def _running_on(deployment: str, build: str) -> str:
    return (
        f"TemporalWorkerDeploymentVersion = '{deployment}:{build}' AND ExecutionStatus = 'Running'"
    )


async def versions(client: Client, deployment: str, indexed: bool) -> list[VersionReport]:
    """Each version of the deployment, newest first, with what still runs on it: turns
    (and how many wait for consent) and conversations (and how many have a turn in
    flight); `indexed`: the agent's search attributes exist, so those two are known."""
    described = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )
    summaries = sorted(
        described.worker_deployment_info.version_summaries,
        key=lambda v: v.create_time.ToDatetime(),
        reverse=True,
    )

    async def count(query: str) -> int:
        return (await client.count_workflows(query)).count

    reports = []
    for summary in summaries:
        build = summary.deployment_version.build_id
        turns_on = f"{_running_on(deployment, build)} AND WorkflowType = 'AgentTurn'"
        turns = await count(turns_on)
        chats = await count(f"{_running_on(deployment, build)} AND WorkflowType = 'Conversation'")
        waiting, mid_turn = 0, None
        if indexed:
            waiting = await count(f"{turns_on} AND AgentStatus = 'awaiting_approval'")
            # A conversation runs one turn at a time, a child pinned to its version.
            mid_turn = min(chats, await count(f"{turns_on} AND AgentConversation IS NOT NULL"))
        reports.append(
            VersionReport(
                build_id=build,
                status=_STATUS.get(summary.status, "unknown"),
                turns=turns,
                awaiting_approval=waiting,
                conversations=chats,
                mid_turn=mid_turn,
            )
        )
    return reports


async def move_conversations(client: Client, deployment: str) -> dict[str, int]:
    """Wake every running conversation on a version of `deployment` that is not its
    current one (the `upgrade` signal): an idle one moves to the current version now,
    in one workflow task on its old version's workers; one with a turn in flight
    moves when that turn ends, as it would anyway. How many, by build id."""
    now = await routing(client, deployment)
    if now is None or not now.current:
        return {}
    described = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )
    woken: dict[str, int] = {}
    for summary in described.worker_deployment_info.version_summaries:
        build = summary.deployment_version.build_id
        if build == now.current:
            continue
        query = f"{_running_on(deployment, build)} AND WorkflowType = 'Conversation'"
        async for wf in client.list_workflows(query):
            try:
                await client.get_workflow_handle(wf.id, run_id=wf.run_id).signal("upgrade")
            except RPCError as e:
                if e.status != RPCStatusCode.NOT_FOUND:  # it ended meanwhile
                    raise
                continue
            woken[build] = woken.get(build, 0) + 1
    return woken


VERSION = SearchAttributeKey.for_keyword("TemporalWorkerDeploymentVersion")
"""Set by the server on a versioned workflow: the version its workflow tasks run on."""


class VersionConflict(Exception):
    """A worker was given a build id that is already a version of other code."""


CODE_KEY = "durable-agent.code"
"""The version's metadata entry naming its code (`build_id` of code and agents)."""


async def claim(client: Client, version: WorkerDeploymentVersion, code: str) -> None:
    """Refuse, before polling, to serve `version` with code other than the code it
    was first served with (a build id reused by hand, e.g. from a `.env` file, for a
    new release); once serving, the worker records `code` on it (`publish`). A server
    that refuses the metadata calls (permissions) is let be, with a warning."""
    try:
        entries = await _metadata(client, version.deployment_name, version.build_id)
    except RPCError as e:
        log.warning("version %s: cannot read its metadata (%s)", version, e.message)
        return
    if entries is not None and CODE_KEY in entries:
        recorded = default_converter().payload_converter.from_payload(entries[CODE_KEY], str)
        if recorded != code:
            raise VersionConflict(
                f"build id {version.build_id!r} is already version "
                f"{version.deployment_name}:{version.build_id} of other code ({recorded}; "
                f"this worker's is {code}): turns pinned to it would replay on this code. "
                "Give this release a build id of its own (AGENT_BUILD_ID), or leave "
                "AGENT_BUILD_ID unset to name it by its code"
            )
