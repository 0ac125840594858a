"""One trace per turn: the client's root span, the workflow, all five activity kinds,
the model calls (`gen_ai.*`) and the tool calls; nothing duplicated on replay.

In this process (spans kept in memory) for what the worker does, and with real
processes (`client.py`, `worker.py`, a worker SIGKILLed mid-turn) exporting OTLP to
a receiver on loopback for what only whole processes show: the client's root span,
the flush as a command ends, replays on another worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, Field
from temporalio.client import Client
from temporalio.contrib.opentelemetry import OpenTelemetryPlugin
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, ModelSettings, ToolContext, tool
from durable_agent.chat import ConversationInput
from durable_agent.errors import InvalidModelOutput, ModelUnavailable
from durable_agent.model import Reply
from durable_agent.runtime.codec import LEAN_DATA_CONVERTER
from durable_agent.runtime.server import free_port
from durable_agent.runtime.turns import start_chat, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import ShopStore
from durable_agent.types import Outcome, ToolCall, TurnInput
from durable_agent.workflows import AgentTurn, search
from tests.conftest import Harness, memory_spans
from tests.fakes.anthropic_messages import MessagesServer
from tests.fakes.anthropic_messages import text as said
from tests.fakes.otlp import OtlpReceiver, Span

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "Has order 123456 shipped?"
ACTIVITIES = ["plan", "parse", "dispatch", "interpret"]  # dispatch screens its result


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return memory_spans()


@pytest.fixture
async def traced_client(env: WorkflowEnvironment, exporter: InMemorySpanExporter) -> Client:
    client = await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        data_converter=LEAN_DATA_CONVERTER,
        plugins=[OpenTelemetryPlugin(add_temporal_spans=True)],
    )
    exporter.clear()
    return client


def ancestors(span: ReadableSpan, spans: list[ReadableSpan]) -> Iterator[str]:
    by_id = {s.context.span_id: s for s in spans}
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        yield span.name


async def test_one_trace_per_turn(
    traced_client: Client, store: ShopStore, exporter: InMemorySpanExporter
) -> None:
    # No workflow cache: every workflow task replays the history from the start,
    # so a span that is not replay-safe would show up more than once.
    async with Harness(traced_client, store).worker(max_cached_workflows=0) as task_queue:
        handle = await start_turn(traced_client, TurnInput(question=QUESTION), task_queue)
        await handle.result()

    spans = exporter.get_finished_spans()
    names = Counter(s.name for s in spans)
    for name in [
        "StartWorkflow:AgentTurn",
        "RunWorkflow:AgentTurn",
        *(f"RunActivity:{kind}" for kind in ACTIVITIES),
        "StartActivity:plan",
        "StartActivity:dispatch",
        "execute_tool order_status",
        "invoke_agent shop",
    ]:
        assert names[name] == 1, f"{name}: {names[name]} spans in {sorted(names)}"
    assert len({s.context.trace_id for s in spans}) == 1

    (agent,) = [s for s in spans if s.name == "invoke_agent shop"]
    assert agent.attributes is not None
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["agent.outcome"] == "answered"
    assert agent.attributes["gen_ai.usage.input_tokens"] > 0
    assert agent.attributes["agent.cost_usd"] == 0  # the offline model is free
    assert "gen_ai.conversation.id" not in agent.attributes  # asked alone, not in a chat
    assert "RunWorkflow:AgentTurn" in ancestors(agent, spans)
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert len(chats) == 2  # plan + interpret
    for chat in chats:
        assert chat.attributes is not None
        assert chat.attributes["gen_ai.provider.name"] == "offline"
        assert chat.attributes["gen_ai.request.model"] == "offline-keyword-v1"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert "invoke_agent shop" in ancestors(chat, spans)
    (tool,) = [s for s in spans if s.name == "execute_tool order_status"]
    dispatch = next(s for s in spans if s.name == "RunActivity:dispatch")
    assert tool.parent is not None and tool.parent.span_id == dispatch.context.span_id
    assert dispatch.attributes is not None
    assert dispatch.attributes["temporal.activity.attempt"] == 1
    assert "error.type" not in dispatch.attributes


class Isbn(BaseModel):
    isbn: str = Field(pattern=r"^\d{13}$", description="the book's ISBN (13 digits)")


@tool(quick=True)
def book_price(args: Isbn, ctx: ToolContext[None]) -> str:
    """Price of one book, by its ISBN."""
    return f"Book {args.isbn} costs $9.99."


async def test_a_named_agents_turn_carries_its_name_and_fingerprint(
    traced_client: Client, store: ShopStore, exporter: InMemorySpanExporter
) -> None:
    """A turn of the worker's second agent: its search attributes and its trace name
    that agent, not the worker's first."""
    bookstore = Agent(name="bookstore", tools=[book_price])
    harness = Harness(traced_client, store)
    async with harness.worker(agents=[harness.agent(), bookstore]) as task_queue:
        turn = TurnInput(question="How much is the book 9780141187761?", agent="bookstore")
        handle = await start_turn(traced_client, turn, task_queue)
        result = await handle.result()
        described = await handle.describe()

    assert result.agent == "bookstore" and "$9.99" in result.answer
    found = described.typed_search_attributes
    assert found.get(search.AGENT) == "bookstore"
    assert found.get(search.FINGERPRINT) == bookstore.fingerprint() == result.fingerprint
    spans = exporter.get_finished_spans()
    (agent,) = [s for s in spans if s.name.startswith("invoke_agent")]
    assert agent.name == "invoke_agent bookstore"
    assert agent.attributes is not None and agent.attributes["gen_ai.agent.name"] == "bookstore"
    (tool_span,) = [s for s in spans if s.name.startswith("execute_tool")]
    assert tool_span.name == "execute_tool book_price"
    assert "invoke_agent bookstore" in ancestors(tool_span, spans)


async def test_a_retried_call_shows_each_attempt_and_why_it_failed(
    traced_client: Client, store: ShopStore, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel(
        plans=[
            ModelUnavailable("throttled"),
            Reply(calls=[ToolCall(id="c1", name="order_status", arguments={"order_id": "404404"})]),
        ],
        decisions=[Reply(text="No such order.")],
    )
    async with Harness(traced_client, store).worker(model) as task_queue:
        turn = TurnInput(question="Has order 404404 shipped?", model="scripted")
        await (await start_turn(traced_client, turn, task_queue)).result()

    spans = exporter.get_finished_spans()
    plans = sorted(
        (s for s in spans if s.name == "RunActivity:plan"),
        key=lambda s: s.attributes["temporal.activity.attempt"] if s.attributes else 0,
    )
    assert [s.attributes and s.attributes["temporal.activity.attempt"] for s in plans] == [1, 2]
    assert plans[0].attributes and plans[0].attributes["error.type"] == "ModelUnavailable"
    assert plans[1].attributes and "error.type" not in plans[1].attributes
    chats = [s for s in spans if s.name == "chat scripted" and s.attributes]
    failed = [s for s in chats if s.attributes and "error.type" in s.attributes]
    assert len(chats) == 3 and len(failed) == 1  # two plan attempts, one interpret
    # A tool's "not found" is the tool's answer, and its span says which error it was.
    (tool,) = [s for s in spans if s.name == "execute_tool order_status"]
    assert tool.attributes and tool.attributes["error.type"] == "NotFound"


async def test_a_fallback_shows_on_the_turns_span_once(
    traced_client: Client, store: ShopStore, exporter: InMemorySpanExporter
) -> None:
    """The first model's reply cannot be used: the second answers, and the turn's span
    says so in one `model_fallback` event, however often the workflow replays."""
    first = ScriptedModel(plans=[InvalidModelOutput("garbled")], name="first")
    second = ScriptedModel(plans=[Reply(text="Fine.")], name="second")
    agent = Agent(
        name="bookstore",
        tools=[book_price],
        model=["first", "second"],
        models={"first": lambda _: first, "second": lambda _: second},
    )
    harness = Harness(traced_client, store)
    async with harness.worker(agents=[agent], max_cached_workflows=0) as task_queue:
        turn = TurnInput(question="Are you open?", agent="bookstore")
        result = await (await start_turn(traced_client, turn, task_queue)).result()

    assert result.outcome is Outcome.ANSWERED and result.answer == "Fine."
    spans = exporter.get_finished_spans()
    (agent_span,) = [s for s in spans if s.name == "invoke_agent bookstore"]
    (event,) = [e for e in agent_span.events if e.name == "model_fallback"]
    assert event.attributes is not None
    assert (event.attributes["agent.model.failed"], event.attributes["agent.model.next"]) == (
        "first",
        "second",
    )
    assert event.attributes["agent.model.reason"] == "reply unusable"
    assert event.attributes["agent.model.error"] == "garbled"
    failed = [s for s in spans if s.name == "chat first"]
    assert len(failed) == 1 and failed[0].attributes
    assert failed[0].attributes["error.type"] == "InvalidModelOutput"
    assert len([s for s in spans if s.name == "chat second"]) == 1


async def test_a_model_calls_settings_are_on_its_span_by_their_genai_names(
    traced_client: Client, store: ShopStore, exporter: InMemorySpanExporter
) -> None:
    """What the call sent, under the GenAI semantic conventions' names (an extra by its
    name alone: its value may be anything); what its backend did not send, named."""
    server = MessagesServer()
    server.replies = [said("Fine.")]
    settings = ModelSettings(
        temperature=0.2,
        top_p=0.9,
        max_tokens=300,
        stop=["END"],
        seed=7,
        reasoning_effort="low",
        extra={"top_k": 20},
    )
    agent = Agent(
        name="bookstore",
        tools=[book_price],
        model="anthropic",
        models={"anthropic": lambda _: server.model()},
        settings=settings,
    )
    try:
        async with Harness(traced_client, store).worker(agents=[agent]) as task_queue:
            turn = TurnInput(question="Are you open?", agent="bookstore")
            result = await (await start_turn(traced_client, turn, task_queue)).result()
    finally:
        server.close()

    assert result.outcome is Outcome.ANSWERED
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.request.temperature"] == 0.2
    assert chat.attributes["gen_ai.request.top_p"] == 0.9
    assert chat.attributes["gen_ai.request.max_tokens"] == 300
    assert tuple(chat.attributes["gen_ai.request.stop_sequences"]) == ("END",)
    assert chat.attributes["gen_ai.request.reasoning.level"] == "low"
    assert tuple(chat.attributes["agent.request.extra"]) == ("top_k",)
    # The Messages API has no seed: not on the span as sent, named as not sent.
    assert "gen_ai.request.seed" not in chat.attributes
    assert tuple(chat.attributes["agent.request.settings_ignored"]) == ("seed",)


async def test_a_chats_turns_name_their_conversation(
    traced_client: Client, store: ShopStore, exporter: InMemorySpanExporter
) -> None:
    async with Harness(traced_client, store).worker() as task_queue:
        chat, accepted = await start_chat(
            traced_client, ConversationInput(model="offline"), QUESTION, task_queue
        )
        await traced_client.get_workflow_handle(accepted.turn_id).result()
        await chat.terminate("test over")

    turns = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent shop"]
    assert [s.attributes and s.attributes["gen_ai.conversation.id"] for s in turns] == [chat.id]


# -- real processes, spans over OTLP -----------------------------------------------------


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def proc_env(env: WorkflowEnvironment, otlp: OtlpReceiver, tmp_path: Path) -> dict[str, str]:
    """Client and workers on the session's server, exporting spans to `otlp`."""
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    }
    return base | {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_TASK_QUEUE": f"traces-{uuid.uuid4().hex[:8]}",
        "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "PYTHONUNBUFFERED": "1",
    }


def start(args: list[str], env: dict[str, str], service: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env | {"OTEL_SERVICE_NAME": service},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the worker is ready (or dies)
    assert "ready" in line, line + proc.stdout.read() + (proc.stderr.read() if proc.stderr else "")
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, as an orchestrator stops a worker: it exits cleanly, spans sent."""
    proc.terminate()
    assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""


def ask(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "client.py", "ask", QUESTION, *flags],
        cwd=ROOT,
        env=env | {"OTEL_SERVICE_NAME": "client"},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def assert_one_unbroken_trace(spans: list[Span]) -> None:
    """Exactly one root (the client's), one trace id, every parent present, no span twice."""
    roots = [s for s in spans if not s.parent_id]
    assert [(r.name, r.service, r.kind) for r in roots] == [("client.py ask", "client", "internal")]
    assert len({s.trace_id for s in spans}) == 1
    ids = Counter(s.span_id for s in spans)
    assert [i for i, n in ids.items() if n > 1] == []
    orphans = [s.name for s in spans if s.parent_id and s.parent_id not in ids]
    assert orphans == []


def test_one_trace_from_the_client_process_to_the_worker_process(
    proc_env: dict[str, str], otlp: OtlpReceiver
) -> None:
    worker = start(["worker.py"], proc_env, "worker")
    try:
        out = ask(proc_env)
    finally:
        stop(worker)
    assert "answer (answered)" in out.stdout

    spans = otlp.spans()
    assert_one_unbroken_trace(spans)
    kinds = {(s.name, s.service): s.kind for s in spans}
    expected = {
        ("StartWorkflow:AgentTurn", "client"): "client",
        ("RunWorkflow:AgentTurn", "worker"): "server",
        ("invoke_agent shop", "worker"): "internal",
        ("chat offline-keyword-v1", "worker"): "client",
        ("execute_tool order_status", "worker"): "internal",
        **{(f"StartActivity:{k}", "worker"): "client" for k in ACTIVITIES},
        **{(f"RunActivity:{k}", "worker"): "server" for k in ACTIVITIES},
    }
    assert {k: kinds.get(k) for k in expected} == expected
    by_id = {s.span_id: s for s in spans}
    start_span = next(s for s in spans if s.name == "StartWorkflow:AgentTurn")
    assert by_id[start_span.parent_id].name == "client.py ask"
    # The client waits by reading the turn's stream (queries, which leave no trace in
    # the turn's history): its reads join the trace too.
    assert any(s.name == "QueryWorkflow:__temporal_workflow_stream_poll" for s in spans)


async def test_a_worker_killed_mid_turn_leaves_one_trace_with_nothing_twice(
    proc_env: dict[str, str], otlp: OtlpReceiver, env: WorkflowEnvironment, tmp_path: Path
) -> None:
    marker = tmp_path / "hung"
    address, task_queue = proc_env["TEMPORAL_ADDRESS"], proc_env["AGENT_TASK_QUEUE"]
    doomed = start(
        ["-m", "tests.traced_worker", address, task_queue, proc_env["AGENT_SHOP_DB"], str(marker)],
        proc_env | {"OTEL_BSP_SCHEDULE_DELAY": "100"},
        "worker-a",
    )
    fresh = None
    try:
        workflow_id = ask(proc_env, "--no-wait").stdout.split()[-1]
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the first worker never reached interpret"
            await asyncio.sleep(0.05)
        # Everything before interpret is done: let its spans leave (interpret's start
        # too, the parent of its run on the next worker), then kill.
        otlp.wait_for(
            lambda: (
                {"RunActivity:dispatch", "StartActivity:interpret"}
                <= {s.name for s in otlp.spans()}
            ),
            what_for="the first worker's spans",
        )
        doomed.kill()
        doomed.wait()
        fresh = start(["worker.py"], proc_env, "worker-b")
        result = await asyncio.wait_for(
            env.client.get_workflow_handle_for(AgentTurn.run, workflow_id).result(), timeout=60
        )
        assert result.outcome is Outcome.ANSWERED
        stop(fresh)
    finally:
        for proc in (doomed, fresh):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

    spans = otlp.spans()
    assert_one_unbroken_trace(spans)
    runs = [s for s in spans if s.name.startswith("RunActivity:")]
    # One span per activity: the killed attempt never ended, none ran twice.
    ran = Counter((s.name, s.attributes["temporalActivityID"]) for s in runs)
    assert [key for key, n in ran.items() if n > 1] == []
    before = ACTIVITIES[:-1]  # what the first worker finished: plan ... dispatch
    where = {s.name: s.service for s in runs}
    assert {k: where.get(f"RunActivity:{k}") for k in before} == dict.fromkeys(before, "worker-a")
    (interpret,) = [s for s in runs if s.name == "RunActivity:interpret"]
    assert interpret.service == "worker-b"
    assert interpret.attributes["temporal.activity.attempt"] == 2
    # The workflow's spans end once, on the worker that finished it; its replay of
    # the first worker's part added none.
    once = Counter(s.name for s in spans if s.service == "worker-b" and "Activity" not in s.name)
    assert once["RunWorkflow:AgentTurn"] == 1 and once["invoke_agent shop"] == 1
    assert Counter(s.name for s in spans)["chat offline-keyword-v1"] == 2
    assert Counter(s.name for s in spans)["execute_tool order_status"] == 1


@pytest.mark.parametrize(
    "sig, code, why",
    [(signal.SIGINT, 130, "CancelledError"), (signal.SIGTERM, 143, "Terminated")],
)
def test_a_client_stopped_by_a_signal_still_sends_its_spans(
    proc_env: dict[str, str], otlp: OtlpReceiver, sig: signal.Signals, code: int, why: str
) -> None:
    """No worker serves the queue, so `ask` waits; Ctrl-C or SIGTERM stop it, and the
    spans it made (its root, the start) are sent before it exits."""
    asking = subprocess.Popen(
        [sys.executable, "client.py", "ask", QUESTION],
        cwd=ROOT,
        env=proc_env | {"OTEL_SERVICE_NAME": "client"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert asking.stderr is not None
    while "started" not in (line := asking.stderr.readline()):
        assert line, "ask ended early"
    asking.send_signal(sig)
    _, err = asking.communicate(timeout=30)
    assert asking.returncode == code, err
    assert "the turn goes on" in err and "Traceback" not in err
    spans = {s.name: s for s in otlp.spans()}
    root = spans["client.py ask"]
    assert root.attributes["error.type"] == why
    assert spans["StartWorkflow:AgentTurn"].parent_id == root.span_id


def console_spans(text: str) -> list[dict]:
    """The spans ConsoleSpanExporter printed among a process's other output."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find('{\n    "name"', at)) != -1:
        span, at = decoder.raw_decode(text, at)
        found.append(span)
    return found


def test_console_spans_of_the_client_and_an_embedded_worker_form_one_trace(
    tmp_path: Path,
) -> None:
    """OTEL_TRACES_EXPORTER=console on both sides, nothing else running: the worker's
    embedded server must not take the variable as its own (it refuses `console`)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    }
    env |= {
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
        "AGENT_SERVER_PORT": str(free_port()),
        "AGENT_UI_PORT": str(free_port()),
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "OTEL_TRACES_EXPORTER": "console",
        "PYTHONUNBUFFERED": "1",
    }
    printed = tmp_path / "worker.out"
    with printed.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "worker.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while "worker ready" not in printed.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, printed.read_text()
            time.sleep(0.1)
        asked = subprocess.run(
            [sys.executable, "client.py", "ask", QUESTION],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert asked.returncode == 0, asked.stdout + asked.stderr
    finally:
        worker.terminate()
        assert worker.wait(timeout=30) == 0, printed.read_text()

    spans = console_spans(asked.stdout) + console_spans(printed.read_text())
    ids = {s["context"]["span_id"] for s in spans}
    assert [s["name"] for s in spans if not s["parent_id"]] == ["client.py ask"]
    assert len({s["context"]["trace_id"] for s in spans}) == 1
    assert [s["name"] for s in spans if s["parent_id"] and s["parent_id"] not in ids] == []
    assert {f"RunActivity:{k}" for k in ACTIVITIES} <= {s["name"] for s in spans}
