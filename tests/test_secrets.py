"""Secrets out of histories, on a real server and worker: a context value marked secret
(`Secret`, `secret=[keys]`) reaches the tool and the instructions function in clear,
and appears nowhere else: not in any event of the turn's history (its stored payloads
read back), its memo or search attributes, the spans the worker exports, the worker's
logs, the payload store's files, or what the model was sent. A tool that echoes it, or
fails quoting it, is masked. A rerun of the turn gets it again; with no encryption key
the client refuses it in one line."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from temporalio.client import Client
from temporalio.contrib.opentelemetry import OpenTelemetryPlugin
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, AgentClient, Secret, ToolContext, ToolError, tool
from durable_agent.errors import InvalidSecret
from durable_agent.model import Reply
from durable_agent.runtime import storage
from durable_agent.runtime.codec import LEAN_DATA_CONVERTER, data_converter
from durable_agent.runtime.secret_refs import SECRETS_KEY
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import state_dir
from durable_agent.types import Outcome, ToolCall
from tests.conftest import Harness, memory_spans

API_KEY = "wx-tenant-" + "7f3a9c2e1b4d" * 3
"""The secret: long and unlike anything else a turn holds."""


class Nothing(BaseModel):
    pass


@tool(quick=True)
def call_api(args: Nothing, ctx: ToolContext[list[str]]) -> str:
    """Call the weather service with the caller's API key."""
    ctx.deps.append(ctx.context["api_key"])
    # A careless tool echoes the key: the result is masked before it is recorded.
    return f"sunny ({ctx.context['plan']} plan, authorized with {ctx.context['api_key']})"


@tool(quick=True)
def call_broken_api(args: Nothing, ctx: ToolContext[list[str]]) -> str:
    """Call a service that refuses the key, quoting it."""
    raise ToolError(f"the service refused key {ctx.context['api_key']}")


@tool(max_attempts=1)
def call_crashing_api(args: Nothing, ctx: ToolContext[list[str]]) -> str:
    """Call a service whose client crashes, quoting the key."""
    raise RuntimeError(f"the client crashed holding {ctx.context['api_key']}")


def instructions(context: dict[str, Any], deps: list[str]) -> str:
    deps.append(f"instructions:{context['api_key']}")
    return f"Help on the {context['plan']} plan; never say the key {context['api_key']}."


def agent(model: ScriptedModel, seen: list[str]) -> Agent:
    return Agent(
        name="weather",
        instructions=instructions,
        tools=[call_api, call_broken_api, call_crashing_api],
        model="scripted",
        models={"scripted": lambda _: model},
        deps=seen,
    )


def both_tools_then_answer() -> ScriptedModel:
    calls = [ToolCall(id="c1", name="call_api"), ToolCall(id="c2", name="call_broken_api")]
    return ScriptedModel(
        plans=[Reply(calls=calls)],
        decisions=[lambda req: Reply(text="It is sunny.")],
    )


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """The spans of this process, as a collector would get them."""
    return memory_spans()


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_ENCRYPTION_KEY", base64.b64encode(os.urandom(32)).decode())


@pytest.fixture
async def traced(env: WorkflowEnvironment, exporter: InMemorySpanExporter) -> Client:
    exporter.clear()
    return await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        data_converter=LEAN_DATA_CONVERTER,
        plugins=[OpenTelemetryPlugin(add_temporal_spans=True)],
    )


async def everything_recorded(client: AgentClient, workflow_id: str) -> bytes:
    """The turn's whole history, every stored payload read back in, with its memo and
    search attributes: all a reader of the server can get of it."""
    handle = client.temporal.get_workflow_handle(workflow_id)
    history = await handle.fetch_history()
    await storage.inline_stored(client.temporal, workflow_id, history.events)
    described = await handle.describe()
    raw = b"".join(e.SerializeToString() for e in history.events)
    return raw + described.raw_description.SerializeToString()


def stored_files(workflow_id: str) -> Iterator[Path]:
    root = state_dir() / "payloads"
    for _namespace, found, folder in storage.FolderStorageDriver(root).workflows():
        if found == workflow_id:
            yield from folder.iterdir()


def span_text(exporter: InMemorySpanExporter) -> str:
    return "".join(span.to_json() for span in exporter.get_finished_spans())


async def test_a_secret_reaches_the_tool_and_nothing_records_it(
    key: None,
    harness: Harness,
    traced: Client,
    exporter: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    model = both_tools_then_answer()
    seen: list[str] = []
    async with Harness(traced, harness.store).worker(agents=[agent(model, seen)]) as task_queue:
        client = AgentClient(traced, task_queue=task_queue)
        turn = await client.start(
            "Weather?", context={"plan": "pro", "api_key": Secret(API_KEY)}, customer="ada"
        )
        result = await turn.result()

    assert result.outcome is Outcome.ANSWERED, result.answer
    # The tool and the instructions function got the value, in clear.
    assert seen == [f"instructions:{API_KEY}", API_KEY]
    # The context the turn carries names the secret, and holds only a reference.
    recorded = await everything_recorded(client, turn.id)
    assert SECRETS_KEY.encode() in recorded and b"api_key" in recorded
    assert b"sunny (pro plan, authorized with [secret api_key])" in recorded  # masked
    assert b"the service refused key [secret api_key]" in recorded
    assert API_KEY.encode() not in recorded
    assert API_KEY not in span_text(exporter) and "execute_tool call_api" in span_text(exporter)
    assert API_KEY not in caplog.text and "call_api c1: ok" in caplog.text
    # The model was never sent it, though the instructions and the result quoted it.
    sent = "".join(request.model_dump_json() for _, request in model.requests)
    assert "[secret api_key]" in sent and API_KEY not in sent
    # The store holds it encrypted: its files under the turn never show it.
    files = list(stored_files(turn.id))
    assert files and not any(API_KEY.encode() in f.read_bytes() for f in files)
    shown = str(result.steps) + result.answer
    assert API_KEY not in shown

    # A rerun of the turn (a fork, reads live) gets the secret again from its reference.
    seen.clear()
    async with Harness(traced, harness.store).worker(agents=[agent(model, seen)]) as task_queue:
        client = AgentClient(traced, task_queue=task_queue)
        fork = await client.rerun(turn.id, from_step=1, live_reads=True)
        again = await fork.result()
    assert again.outcome is Outcome.ANSWERED, again.answer
    assert API_KEY in seen
    assert API_KEY.encode() not in await everything_recorded(client, fork.id)


async def test_secret_names_a_context_key(key: None, harness: Harness) -> None:
    model = both_tools_then_answer()
    seen: list[str] = []
    async with harness.worker(agents=[agent(model, seen)]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        asked = {"plan": "pro", "api_key": API_KEY}
        turn = await client.start("Weather?", context=asked, secret=["api_key"], request_id="r1")
        assert (await turn.result()).outcome is Outcome.ANSWERED
        assert API_KEY in seen
        assert API_KEY.encode() not in await everything_recorded(client, turn.id)
        # The same request again (sealed anew, so its reference differs) is that turn.
        again = await client.start("Weather?", context=asked, secret=["api_key"], request_id="r1")
        assert again.id == turn.id


async def test_without_a_key_a_secret_is_refused_in_one_line(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("AGENT_ENCRYPTION_KEY_FILE", raising=False)
    client = AgentClient(harness.client, task_queue="nobody-serves-this")
    with pytest.raises(InvalidSecret, match="AGENT_ENCRYPTION_KEY") as refused:
        await client.start("Weather?", context={"api_key": Secret(API_KEY)})
    assert "\n" not in str(refused.value) and API_KEY not in str(refused.value)
    with pytest.raises(InvalidSecret, match="does not have"):
        await client.start("Weather?", context={"plan": "pro"}, secret=["api_key"])


async def test_the_sweep_deletes_a_turns_secrets_and_a_rerun_then_says_so(
    key: None, harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_PAYLOAD_STORE", f"local:{tmp_path}")  # a store of this test's
    model = both_tools_then_answer()
    seen: list[str] = []
    async with harness.worker(agents=[agent(model, seen)]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        turn = await client.start("Weather?", context={"api_key": Secret(API_KEY), "plan": "pro"})
        assert (await turn.result()).outcome is Outcome.ANSWERED
        folder = storage.FolderStorageDriver(tmp_path)
        assert [w for _, w, _ in folder.workflows()] == [turn.id]

        swept = await storage.sweep(harness.client, folder, timedelta(0))
        assert swept == [turn.id] and folder.workflows() == []

        seen.clear()
        fork = await client.rerun(turn.id, from_step=1, live_reads=True)
        again = await fork.result()
    assert again.outcome is Outcome.PAYLOAD_UNAVAILABLE
    (said,) = [s.text for s in again.steps if f"the secrets api_key of {turn.id}" in s.text]
    assert "cannot be had" in said and "start the turn again, giving them" in said
    assert "is not in the payload store" in said
    assert seen == []  # no tool ran without its key


async def test_a_conversations_turns_get_its_secrets(key: None, harness: Harness) -> None:
    model = both_tools_then_answer()
    seen: list[str] = []
    async with harness.worker(agents=[agent(model, seen)]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        chat = client.chat(context={"plan": "pro", "api_key": Secret(API_KEY)}, stream=False)
        turn = await chat.start("Weather?")
        assert (await turn.result()).outcome is Outcome.ANSWERED
        await chat.end()
        assert API_KEY in seen
        for workflow_id in (chat.id, turn.id):
            assert API_KEY.encode() not in await everything_recorded(client, workflow_id)


async def test_a_crash_quoting_a_secret_is_recorded_masked(key: None, harness: Harness) -> None:
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="call_crashing_api")])],
        decisions=[lambda req: Reply(text="The service is down.")],
    )
    seen: list[str] = []
    async with harness.worker(agents=[agent(model, seen)]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        turn = await client.start("Weather?", context={"plan": "pro", "api_key": Secret(API_KEY)})
        await turn.result()
        recorded = await everything_recorded(client, turn.id)
    assert b"the client crashed holding [secret api_key]" in recorded
    assert b"RuntimeError" in recorded  # its type stands, for retry policies
    assert API_KEY.encode() not in recorded


async def test_ask_takes_a_secret_on_the_command_line(key: None, harness: Harness) -> None:
    """`client.py ask --secret NAME=VALUE`: the tool gets the value, the history never
    has it; a name given twice, or one whose environment variable is unset, is one line
    and no turn."""
    model = both_tools_then_answer()
    seen: list[str] = []
    root = Path(__file__).resolve().parent.parent
    # The command encrypts its payloads with the key (the codec): so must the worker.
    encrypting = await Client.connect(
        harness.client.service_client.config.target_host,
        namespace=harness.client.namespace,
        data_converter=data_converter(),
    )
    async with Harness(encrypting, harness.store).worker(agents=[agent(model, seen)]) as task_queue:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
        environ |= {
            "TEMPORAL_ADDRESS": harness.client.service_client.config.target_host,
            "TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml",
            "AGENT_TASK_QUEUE": task_queue,
        }

        def ask(*flags: str) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, "client.py", "ask", "--agent", "weather", "--no-wait"]
            return subprocess.run(
                [*command, "--context", '{"plan": "pro"}', *flags, "Weather?"],
                cwd=root,
                env=environ,
                capture_output=True,
                text=True,
                timeout=120,
            )

        started = await asyncio.to_thread(ask, "--secret", f"api_key={API_KEY}")
        assert started.returncode == 0, started.stderr
        client = AgentClient(encrypting, task_queue=task_queue)
        turn_id = started.stdout.strip()
        assert (await client.turn(turn_id).result()).outcome is Outcome.ANSWERED
        assert API_KEY in seen
        assert API_KEY.encode() not in await everything_recorded(client, turn_id)

        for flags, said in [
            (("--secret", "plan=x"), "--secret plan: that context key is given already"),
            (("--secret", "no_such_variable"), "--secret no_such_variable: no environment"),
        ]:
            refused = await asyncio.to_thread(ask, *flags)
            assert refused.returncode == 1 and said in refused.stderr, refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1
