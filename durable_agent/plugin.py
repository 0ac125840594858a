"""Serving agents in a Temporal worker: `AgentPlugin`, and `build_worker`, a worker tuned
for turns as `worker.py`'s is. The two compose: every worker of a client connected
with the plugin serves that plugin's agents.

    client = await Client.connect("localhost:7233", plugins=[AgentPlugin(bookstore)])
    async with Worker(client, task_queue="bookstore"):         # a worker of your own
        ...
    async with build_worker(client, task_queue="bookstore"):   # or one tuned for turns
        ...

    # On a client without the plugin, build_worker adds it:
    async with build_worker(client, bookstore, task_queue="bookstore"):
        ...

The plugin registers the two workflows (`AgentTurn`, `Conversation`), a turn's
activities bound to the agents, the interceptors that record each turn's metrics and
each activity attempt's span, and the project's data converter (pydantic payloads
without their defaults, encrypted when AGENT_ENCRYPTION_KEY is set). Agents' `deps`
are opened as the worker starts and closed when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.service import RPCError
from temporalio.worker import (
    Interceptor,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerConfig,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.workflow import _Definition

from durable_agent.activities import turn_activities
from durable_agent.activities._common import PermanentErrors
from durable_agent.agents import Agent, AgentCard
from durable_agent.backends import default_models
from durable_agent.budgets import BudgetLedger, Budgets, Ledgers, UnversionedBudgetLedger
from durable_agent.errors import AgentDefinitionError
from durable_agent.model import ModelCatalog
from durable_agent.runtime import logs, metrics, peers
from durable_agent.runtime import storage as storage_
from durable_agent.runtime.attempts import ActivityAttempts
from durable_agent.runtime.chaos import ChaosInterceptor, Faults
from durable_agent.runtime.codec import LeanPayloadConverter, data_converter
from durable_agent.runtime.deployments import (
    build_id,
    claim,
    deployment_config,
    promote,
    publish,
    sources_of,
)
from durable_agent.serving import Agents
from durable_agent.settings import Settings
from durable_agent.workflows import AgentTurn, Conversation, UnversionedConversation

log = logging.getLogger("durable_agent.worker")

MAX_WORKFLOW_TASKS = 10
"""Workflow tasks a worker runs at once (one Python process runs one at a time)."""


class AgentPlugin(SimplePlugin):
    """Serves `agents` (the first one answers turns that name none) in any worker.

    `settings` (default: from the environment) fill in what an agent leaves to the
    worker; `models`: the catalog of model backends (default: offline, OpenAI-compatible,
    Bedrock, SageMaker); `faults`: fault injection for chaos runs (default: AGENT_FAULTS);
    `budgets`: spend caps per tenant and user, per day or month (default: AGENT_BUDGETS;
    `durable_agent.budgets`).
    Every problem with a definition is an `AgentDefinitionError` here, not at a turn."""

    def __init__(
        self,
        *agents: Agent,
        settings: Settings | None = None,
        models: ModelCatalog | None = None,
        faults: Faults | None = None,
        budgets: Budgets | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.budgets = budgets if budgets is not None else Budgets.from_env()
        self.given = list(agents)
        self.version: WorkerDeploymentVersion | None = None
        """This worker's version, once `configure_worker` knows its task queue."""
        self.code = ""
        """What this worker runs, named as a default build id is (`build_id`): the
        core, the agents' tool modules and the agents' fingerprints."""
        self.promoted = asyncio.Event()
        """Set once the deployment has a current version that serves (this one, or a
        live one `Settings.promote` leaves alone)."""
        self._client: Client | None = None
        self._task_queue = ""
        self.agents = Agents(
            agents, settings=self.settings, models=models or default_models(self.settings.model)
        )
        # Inside the tracing plugin's spans (the client's interceptors come first): each
        # activity attempt's span gets its attempt and error, each turn its metrics; the
        # agents' permanent errors (injected faults too) leave activities non-retryable.
        interceptors: list[Interceptor] = [
            PermanentErrors(),
            ActivityAttempts(),
            metrics.TurnMetrics(),
        ]
        faults = faults if faults is not None else Faults.from_env()
        if faults.active:
            interceptors.append(ChaosInterceptor(faults))
        super().__init__(
            "durable_agent.AgentPlugin",
            data_converter=_converter,
            interceptors=interceptors,
            activities=turn_activities(
                self.agents, Ledgers(self.budgets) if self.budgets else None
            ),
            # Every worker hosts the budgets' ledgers, budgets set or not: a ledger lives on
            # the queue of the turns that count against it.
            workflows=[
                BudgetLedger if self.settings.versioning else UnversionedBudgetLedger,
                AgentTurn,
                Conversation if self.settings.versioning else UnversionedConversation,
            ],
            run_context=self._opened,
            workflow_runner=lambda given: AgentWorkflowRunner(
                given or SandboxedWorkflowRunner(), sandbox=self.settings.workflow_sandbox
            ),
        )

    @contextlib.asynccontextmanager
    async def _opened(self) -> AsyncIterator[None]:
        """For as long as the worker runs: every agent's deps, opened once; once it polls,
        its version made current as `Settings.promote` says; and a turn whose workflow task
        it cannot run for want of a stored payload, ended (`storage.ending_stuck_turns`)."""
        ending = storage_.ending_stuck_turns(self._client) if self._client else None
        async with self.agents.opened(), ending or contextlib.nullcontext():
            settling = asyncio.create_task(self._promote())
            sweeping = self._sweeping()
            try:
                yield
            finally:
                settling.cancel()
                if sweeping is not None:
                    sweeping.cancel()

    def _sweeping(self) -> asyncio.Task[None] | None:
        """Storing in a local folder: its payloads of closed workflows deleted after the
        retention, once an hour (`storage.keep_swept`)."""
        storage = self._client.data_converter.external_storage if self._client else None
        folder = storage_.storing_folder(storage)
        if folder is None or self._client is None:
            return None
        return asyncio.create_task(storage_.keep_swept(self._client, folder))

    async def _promote(self) -> None:
        if self.version is None or self._client is None:
            self.promoted.set()
            return
        try:
            # Its code and agents first: once it is current, front ends read them there.
            await publish(self._client, self.version, self.code, self.cards)
        except RPCError as e:  # a server that refuses metadata calls (permissions)
            log.warning("version %s: cannot record its code and agents (%s)", self.version, e)
        except Exception:
            log.exception("could not record the code and agents of version %s", self.version)
        try:
            await promote(
                self._client,
                self.version,
                self.settings.promote,
                self._task_queue,
                settled=self.promoted,
                agents=[a.name for a in self.given],
            )
        except Exception:
            log.exception("could not make version %s current", self.version)
        finally:
            self.promoted.set()

    @property
    def cards(self) -> list[AgentCard]:
        """The cards of the agents it serves by their own names (sub-agents too), the
        one that answers turns that name none first."""
        return [
            s.agent.card(s.fingerprint)
            for s in self.agents.served.values()
            if s.name == s.agent.name
        ]

    @property
    def fingerprints(self) -> dict[str, str]:
        """The agents it serves by their own names, and their fingerprints."""
        return {c.name: c.fingerprint for c in self.cards}

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        logs.guard_sdk_messages()  # a tenant user's turn id holds a `%`
        self._client = config["client"]
        self._task_queue = config["task_queue"]
        # Its identity names its agents, so a worker starting on the same queue with
        # other definitions of them can say so (durable_agent/runtime/peers.py).
        base = config.get("identity") or self._client.identity
        config["identity"] = peers.identity(base, self.fingerprints)
        if self.settings.versioning and config.get("deployment_config") is None:
            served = self.agents.served.values()
            tools = [t.fn for s in served for t in s.tools.tools.values()]
            # Instructions given as a function are the agent's own code, as its tools are.
            own = tools + [s.dynamic for s in served if s.dynamic is not None]
            self.code = build_id([s.fingerprint for s in served], sources_of(own))
            self.version = WorkerDeploymentVersion(
                deployment_name=self.settings.deployment or config["task_queue"],
                build_id=self.settings.build_id or self.code,
            )
            config["deployment_config"] = deployment_config(self.version)
        converter = config["client"].data_converter
        if not issubclass(converter.payload_converter_class, LeanPayloadConverter):
            raise AgentDefinitionError(
                "the worker's client does not use the agents' data converter: connect it with "
                "Client.connect(..., plugins=[AgentPlugin(...)]), or pass "
                "data_converter=durable_agent.runtime.codec.data_converter()"
            )
        return super().configure_worker(config)


class AgentWorkflowRunner(WorkflowRunner):
    """Runs the agents' own workflows (`AgentTurn`, `Conversation`) as plain code, and
    every other workflow of the worker with the runner it was given.

    The SDK's sandbox imports a workflow's module afresh for every run, and steps into
    itself for every activation and for every payload it converts: a third of the
    worker's CPU per turn. It guards against workflow code that reads the clock, draws
    random numbers, does I/O or keeps state between runs; the turn and the
    conversation do none of that, and they still meet the sandbox: each worker has it
    check them as it starts (`prepare_workflow`), the replay gate replays every stored
    history in it, and `sandbox=True` (`Settings.workflow_sandbox`,
    AGENT_WORKFLOW_SANDBOX=on) runs them in it, for a worker whose workflow code is
    being changed."""

    def __init__(
        self,
        given: WorkflowRunner,
        *,
        sandbox: bool = False,
        plain: WorkflowRunner | None = None,
    ) -> None:
        self.given = given
        self.sandbox = sandbox
        self._plain = plain or UnsandboxedWorkflowRunner()

    def prepare_workflow(self, defn: _Definition) -> None:
        self.given.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        if not self.sandbox and issubclass(det.defn.cls, (AgentTurn, Conversation)):
            return self._plain.create_instance(det)
        return self.given.create_instance(det)

    def set_worker_level_failure_exception_types(
        self, types: Sequence[type[BaseException]]
    ) -> None:
        self.given.set_worker_level_failure_exception_types(types)
        self._plain.set_worker_level_failure_exception_types(types)


def _converter(existing: DataConverter | None) -> DataConverter:
    """The project's converter; a codec the client already has (its own encryption)
    and a payload store it already has are kept."""
    ours = data_converter()
    if existing is not None and existing.payload_codec is not None:
        ours = dataclasses.replace(ours, payload_codec=existing.payload_codec)
    if existing is not None and existing.external_storage is not None:
        ours = dataclasses.replace(ours, external_storage=existing.external_storage)
    return ours


class AgentWorker(Worker):
    """A worker that, entered (`async with`), has settled its version first: turns
    started in the block go to a version that serves them."""

    def __init__(self, client: Client, plugin: AgentPlugin, **config: Any) -> None:
        super().__init__(client, **config)
        self.plugin = plugin
        self.failure: BaseException | None = None
        """Why the worker stopped running, if it failed."""

    async def run(self) -> None:
        try:
            await super().run()
        except BaseException as e:
            self.failure = e
            raise

    async def __aenter__(self) -> AgentWorker:
        if self.plugin.version is not None:
            # Before the first poll: a build id reused for other code is refused.
            await claim(self.client, self.plugin.version, self.plugin.code)
        await self._rivals()
        await super().__aenter__()
        if self.plugin.settings.versioning:
            try:
                await asyncio.wait_for(self.plugin.promoted.wait(), PROMOTE_WAIT_S)
            except asyncio.TimeoutError:
                log.warning(
                    "version %s: not settled after %s s", self.plugin.version, PROMOTE_WAIT_S
                )
            except asyncio.CancelledError:
                # A worker that fails as it starts (its agents' deps cannot open) cancels
                # the task that entered it: say why, as the exit would.
                await self.__aexit__(asyncio.CancelledError, None, None)
                raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *args: Any) -> None:
        if self.failure is None:
            await super().__aexit__(exc_type, *args)
        # It failed, and has stopped: the SDK's exit would wait for the end of a run that,
        # when a plugin failed before it (the agents' deps), never began.
        elif exc_type is asyncio.CancelledError and not isinstance(
            self.failure, asyncio.CancelledError
        ):
            raise self.failure from None

    async def _rivals(self) -> None:
        """Say, before polling, which live workers of its queue serve one of its agents'
        names with another definition."""
        task_queue = self.config(active_config=True)["task_queue"]
        mine = self.plugin.fingerprints
        try:
            found = await peers.rivals(self.client, task_queue, mine)
        except RPCError as e:  # a help, not a must: a server that will not say
            log.warning("task queue %r: cannot see its other workers (%s)", task_queue, e)
            return
        for rival in found:
            peers.warn(rival, mine, task_queue, self.plugin.settings.versioning)


PROMOTE_WAIT_S = 30.0


def build_worker(
    client: Client,
    *agents: Agent,
    task_queue: str | None = None,
    settings: Settings | None = None,
    models: ModelCatalog | None = None,
    faults: Faults | None = None,
    budgets: Budgets | None = None,
    **options: Any,
) -> AgentWorker:
    """A worker for `agents` on `task_queue` (default: the settings', AGENT_TASK_QUEUE),
    tuned for turns; `options` go to `Worker` as they are.

    On a client that already carries an `AgentPlugin`, the worker serves that plugin
    (every worker of a client applies the client's plugins, and a second one would
    register every activity twice): give it no agents, or the plugin's own; settings,
    models, faults and budgets are the plugin's to hold."""
    plugin = _carried_by(client)
    if plugin is None:
        plugin = AgentPlugin(
            *agents, settings=settings, models=models, faults=faults, budgets=budgets
        )
        added: list[AgentPlugin] = [plugin]
    else:
        own = faults if faults is not None else budgets
        _check_compatible(plugin, agents, settings, models, own)
        added = []
    tuned: dict[str, Any] = {
        # A dead worker's cached workflows move to a live one after 2 s, not 10 s.
        "sticky_queue_schedule_to_start_timeout": timedelta(seconds=2),
        # Workflow tasks take CPU, not I/O: a worker takes only as many at once as it
        # gets through well within their timeout (workflows/policies.py); the rest
        # wait on the server, where their clock has not started.
        "max_concurrent_workflow_tasks": MAX_WORKFLOW_TASKS,
        # On SIGTERM, let in-flight activities finish rather than time out.
        "graceful_shutdown_timeout": timedelta(seconds=10),
        **options,
    }
    plugins: Sequence[Any] = [*tuned.pop("plugins", []), *added]
    return AgentWorker(
        client,
        plugin,
        task_queue=task_queue or plugin.settings.task_queue,
        plugins=plugins,
        **tuned,
    )


def _carried_by(client: Client) -> AgentPlugin | None:
    """The `AgentPlugin` the client was connected with, if any."""
    return next((p for p in client.config()["plugins"] if isinstance(p, AgentPlugin)), None)


def _check_compatible(
    plugin: AgentPlugin,
    agents: Sequence[Agent],
    settings: Settings | None,
    models: ModelCatalog | None,
    own: object | None,
) -> None:
    """Refuses what the client's plugin cannot serve: other agents, or settings, models,
    faults or budgets of the worker's own (the plugin's agents were built with its own)."""
    other_agents = bool(agents) and list(agents) != plugin.given
    other_settings = settings is not None and settings != plugin.settings
    if other_agents or other_settings or models is not None or own is not None:
        names = ", ".join(a.name for a in plugin.given)
        raise AgentDefinitionError(
            f"the client already carries AgentPlugin({names}), which serves every worker of "
            "that client: call build_worker(client) with no agents, settings, models, faults "
            "or budgets (give those to the AgentPlugin), or connect a client without the plugin"
        )
