"""MCP tool servers as an agent's tools, against real servers from the registries:
`mcp-server-time` (PyPI, stdio), `@modelcontextprotocol/server-everything` (npm,
Streamable HTTP) and `@modelcontextprotocol/server-memory` (npm, stdio, writes to a
file we can count). `.ci/run` installs the npm ones into tests/npm/ from its lock."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from durable_agent.agents import Agent
from durable_agent.commands.worker import build_worker
from durable_agent.mcp import MCPConfigError, MCPServer, OutcomeUnknown, connected, load_config
from durable_agent.model import ModelCatalog, Reply
from durable_agent.runtime.server import free_port, is_listening
from durable_agent.runtime.turns import decide, progress_of, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.tools import ToolContext
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput
from tests.conftest import Harness, last_result
from tests.fakes.chat_completions import ChatCompletionsServer, text, tool_calls
from tests.procs import Forks, children

ROOT = Path(__file__).resolve().parent.parent

# In-process workers keep their MCP tool lists in the test's folder.
pytestmark = pytest.mark.usefixtures("own_state_dir")
BIN = Path(sys.executable).parent
NPM_BIN = ROOT / "tests" / "npm" / "node_modules" / ".bin"
TIME = MCPServer(
    name="time", command=str(BIN / "mcp-server-time"), args=("--local-timezone", "UTC")
)

needs_npm = pytest.mark.skipif(
    not (NPM_BIN / "mcp-server-memory").exists() and not os.environ.get("CI"),
    reason="the npm MCP servers are not installed: npm ci --prefix tests/npm",
)


def memory_server(tmp_path: Path) -> MCPServer:
    return MCPServer(
        name="memory",
        command=str(NPM_BIN / "mcp-server-memory"),
        env={"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")},
    )


def entities(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "memory.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if line.get("type") == "entity"]


@contextmanager
def everything_over_http(port: int = 0) -> Iterator[str]:
    """server-everything's Streamable HTTP transport on `port` (0: a free one); its URL."""
    port = port or free_port()
    with everything_process(port):
        yield f"http://127.0.0.1:{port}/mcp"


def agent_with(*servers: MCPServer, **options: Any) -> Agent:
    return Agent(
        name="desk",
        instructions="You answer with the tools you have.",
        mcp_servers=servers,
        **options,
    )


@asynccontextmanager
async def serving(harness: Harness, model: Any, *servers: MCPServer) -> AsyncIterator[str]:
    async with (
        connected([agent_with(*servers)]) as agents,
        harness.worker(model, agents=agents) as task_queue,
    ):
        yield task_queue


def observations(result: Any) -> list[str]:
    return [s.text for s in result.steps if s.kind is StepKind.OBSERVATION]


# -- configuration ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("{", "not JSON"),
        ('{"servers": {}}', 'expected {"mcpServers"'),
        ('{"mcpServers": {"a b": {"command": "x"}}}', "a name is 1-64 letters"),
        ('{"mcpServers": {"t": {}}}', "give either a command (stdio) or a url (HTTP)"),
        ('{"mcpServers": {"t": {"command": "x", "url": "http://h"}}}', "either a command"),
        ('{"mcpServers": {"t": {"url": "ftp://h"}}}', "is not http:// or https://"),
        ('{"mcpServers": {"t": {"command": "x", "args": "y"}}}', "args is a list of strings"),
        ('{"mcpServers": {"t": {"command": "x", "timeout": 0}}}', "timeout is seconds"),
        ('{"mcpServers": {"t": {"command": "x", "comand": "y"}}}', "unknown key 'comand'"),
        ('{"mcpServers": {"t": {"command": "x", "attempts": 0}}}', "attempts is how often"),
        ('{"mcpServers": {"t": {"command": "x", "attempts": 21}}}', "1 to 20"),
        ('{"mcpServers": {"t": {"command": "x", "attempts": 2.5}}}', "attempts is a whole"),
        ('{"mcpServers": {"t": {"command": "x", "attempts": true}}}', "attempts is a whole"),
        (
            '{"mcpServers": {"t": {"command": "x"}, "u": {"command": "y"}, "t": {"url": "http://h"}}}',
            "'t' appears twice in one object",
        ),
        ('{"mcpServers": {"t": {"command": "x", "command": "y"}}}', "'command' appears twice"),
    ],
)
def test_a_bad_config_says_what_to_fix(tmp_path: Path, config: str, says: str) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(config)
    with pytest.raises(MCPConfigError, match=None) as caught:
        load_config(path)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("servers", "says"),
    [
        ({"nope": {"command": "/nonexistent/mcp-server"}}, "MCP server 'nope'"),
        (
            {
                "time": {"command": str(BIN / "mcp-server-time")},
                "again": {"command": str(BIN / "mcp-server-time"), "prefix": "time"},
            },
            "time__get_current_time",
        ),
    ],
    ids=["unknown-command", "duplicate-names"],
)
def test_the_worker_stops_with_one_line_on_a_server_that_cannot_serve(
    cli_forks: Forks, tmp_path: Path, servers: dict[str, Any], says: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    done = cli_forks.run(
        ["worker.py", "--mcp-config", str(path)],
        env | {"AGENT_STATE_DIR": str(tmp_path), "TEMPORAL_ADDRESS": "127.0.0.1:1"},
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_a_server_named_twice_stops_the_worker_with_one_line(
    cli_forks: Forks, tmp_path: Path
) -> None:
    path = tmp_path / "mcp.json"
    time = json.dumps({"command": str(BIN / "mcp-server-time")})
    path.write_text(f'{{"mcpServers": {{"time": {time}, "time": {time}}}}}')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    done = cli_forks.run(
        ["worker.py", "--mcp-config", str(path)],
        env | {"AGENT_STATE_DIR": str(tmp_path), "TEMPORAL_ADDRESS": "127.0.0.1:1"},
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"error: --mcp-config {path}: 'time' appears twice in one object (JSON would keep "
        "only the last): rename or remove one"
    ]


def test_a_config_sets_each_servers_timeout_and_read_attempts(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    entry = {"command": TIME.command, "timeout": 5, "attempts": 7}
    path.write_text(json.dumps({"mcpServers": {"time": entry, "other": {"url": "http://h/mcp"}}}))
    time, other = load_config(path)
    assert (time.timeout.total_seconds(), time.attempts) == (5, 7)
    assert (other.timeout.total_seconds(), other.attempts) == (30, 3)


async def test_an_optional_server_that_cannot_start_is_left_out() -> None:
    broken = MCPServer(name="broken", command="/nonexistent/mcp-server", optional=True)
    async with connected([agent_with(TIME, broken)]) as (agent,):
        names = set(agent.registry.tools)
    assert "time__get_current_time" in names
    assert not any(n.startswith("broken__") for n in names)


# -- turns -----------------------------------------------------------------------


async def test_a_stdio_server_answers_through_the_strict_chat_completions_fake(
    harness: Harness,
) -> None:
    fake = ChatCompletionsServer()
    fake.replies = [
        tool_calls(("c1", "time__get_current_time", json.dumps({"timezone": "Europe/London"}))),
        text("It is morning in London."),
    ]
    models = ModelCatalog({"openai": fake.model}, default="openai:test-model")
    try:
        task_queue = f"mcp-{uuid.uuid4().hex[:8]}"
        settings = replace(Settings.from_env(), versioning=False)
        async with (
            connected([agent_with(TIME)]) as agents,
            build_worker(
                harness.client, task_queue, agents=agents, models=models, settings=settings
            ),
        ):
            handle = await start_turn(
                harness.client, TurnInput(question="What time is it in London?"), task_queue
            )
            result = await handle.result()
    finally:
        fake.close()
    assert result.outcome is Outcome.ANSWERED
    [seen] = observations(result)
    assert '"timezone": "Europe/London"' in seen and "datetime" in seen
    # The model was offered the server's tools, with their own schemas.
    offered = {t["function"]["name"]: t for t in fake.accepted[0]["tools"]}
    assert offered["time__convert_time"]["function"]["parameters"]["required"] == [
        "source_timezone",
        "time",
        "target_timezone",
    ]
    kinds = [s.kind for s in result.steps]
    assert StepKind.APPROVAL not in kinds  # reads need no consent


async def test_an_is_error_result_is_an_observation_the_model_reads(harness: Harness) -> None:
    call = ToolCall(id="c1", name="time__get_current_time", arguments={"timezone": "Mars/Olympus"})
    model = ScriptedModel(
        plans=[Reply(calls=[call])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with serving(harness, model, TIME) as task_queue:
        handle = await start_turn(
            harness.client, TurnInput(question="Time on Mars?", model="scripted"), task_queue
        )
        result = await handle.result()
    assert result.outcome is Outcome.ANSWERED
    assert "get_current_time failed" in result.answer and "Mars/Olympus" in result.answer


@needs_npm
async def test_a_streamable_http_server_answers_a_turn(harness: Harness) -> None:
    with everything_over_http() as url:
        server = MCPServer(name="everything", url=url)
        calls = [
            ToolCall(id="c1", name="everything__echo", arguments={"message": "hello there"}),
            ToolCall(id="c2", name="everything__get-sum", arguments={"a": 2, "b": 40}),
        ]
        model = ScriptedModel(
            plans=[Reply(calls=calls)], decisions=[lambda req: Reply(text="done")]
        )
        async with serving(harness, model, server) as task_queue:
            handle = await start_turn(
                harness.client, TurnInput(question="Echo and add", model="scripted"), task_queue
            )
            result = await handle.result()
    seen = observations(result)
    assert any("hello there" in s for s in seen)
    assert any("42" in s for s in seen)


@needs_npm
async def test_a_streamable_http_server_that_restarted_is_reconnected(harness: Harness) -> None:
    """The server behind the URL went down and came back (a deploy): its old session is
    gone; the worker connects again and the next turn's call goes through."""
    port = free_port()
    echo = ToolCall(id="c1", name="everything__echo", arguments={"message": "still there"})
    model = ScriptedModel(
        plans=[Reply(calls=[echo])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    turn = TurnInput(question="Echo", model="scripted")
    server = MCPServer(name="everything", url=f"http://127.0.0.1:{port}/mcp")
    with ExitStack() as first_server:
        first_server.enter_context(everything_over_http(port))
        async with serving(harness, model, server) as task_queue:
            first = await (await start_turn(harness.client, turn, task_queue)).result()
            first_server.close()  # down, and back up as a new process
            with everything_over_http(port):
                second = await (await start_turn(harness.client, turn, task_queue)).result()
    assert "still there" in first.answer
    assert second.outcome is Outcome.ANSWERED and "still there" in second.answer


def calls_of(connection: Any) -> list[dict[str, Any]]:
    """Each call the worker makes through `connection`, as it goes: its tool, and
    whether it has returned (or failed) yet. Counting only: the call is the real one."""
    made: list[dict[str, Any]] = []
    real = connection.call

    async def counted(name: str, arguments: dict[str, Any], *, write: bool) -> Any:
        made.append({"tool": name, "done": False})
        try:
            return await real(name, arguments, write=write)
        finally:
            made[-1]["done"] = True

    connection.call = counted
    return made


async def first_call(made: list[dict[str, Any]]) -> dict[str, Any]:
    async with asyncio.timeout(120):
        while not made:
            await asyncio.sleep(0.02)
    return made[0]


@needs_npm
@pytest.mark.parametrize("attempts", [1, 2])
async def test_a_read_is_tried_as_often_as_its_server_says(harness: Harness, attempts: int) -> None:
    """server-everything over Streamable HTTP, gone once the worker has connected: each
    attempt of a read finds it down, and the turn reads the failure after the server's
    `attempts`."""
    echo = ToolCall(id="c1", name="everything__echo", arguments={"message": "hello"})
    model = ScriptedModel(
        plans=[Reply(calls=[echo])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    with ExitStack() as up:
        url = up.enter_context(everything_over_http())
        server = MCPServer(name="everything", url=url, attempts=attempts)
        async with (
            connected([agent_with(server)]) as agents,
            harness.worker(model, agents=agents) as task_queue,
        ):
            made = calls_of(agents[0].registry.connections[0])  # type: ignore[attr-defined]
            up.close()  # the server goes
            turn = TurnInput(question="Echo hello", model="scripted")
            result = await (await start_turn(harness.client, turn, task_queue)).result()
    assert result.outcome is Outcome.ANSWERED
    assert "MCP server 'everything'" in result.answer and "did not answer" in result.answer
    assert [m["tool"] for m in made] == ["echo"] * attempts


@needs_npm
async def test_a_streamable_http_server_dying_mid_read_is_reconnected_and_the_read_retried(
    harness: Harness,
) -> None:
    """The server is killed while a read runs (a four-second operation) and comes back
    on its address: the read goes again on a fresh connection and the turn answers."""
    port = free_port()
    slow = ToolCall(
        id="c1",
        name="everything__trigger-long-running-operation",
        arguments={"duration": 4, "steps": 4},
    )
    model = ScriptedModel(
        plans=[Reply(calls=[slow])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    server = MCPServer(name="everything", url=f"http://127.0.0.1:{port}/mcp")
    with ExitStack() as first_server:
        proc = first_server.enter_context(everything_process(port))
        async with (
            connected([agent_with(server)]) as agents,
            harness.worker(model, agents=agents) as task_queue,
        ):
            made = calls_of(agents[0].registry.connections[0])  # type: ignore[attr-defined]
            turn = TurnInput(question="Run the long operation", model="scripted")
            handle = await start_turn(harness.client, turn, task_queue)
            call = await first_call(made)
            await asyncio.sleep(0.5)
            proc.kill()
            assert not call["done"], "the read ended before its server was killed"
            first_server.close()
            with everything_process(port):
                result = await handle.result()
    assert result.outcome is Outcome.ANSWERED
    assert "Long running operation completed" in result.answer
    assert len(made) >= 2


@needs_npm
async def test_a_streamable_http_server_dying_mid_write_leaves_the_outcome_unknown_and_asks(
    harness: Harness,
) -> None:
    """A write (server-everything's gzip-file-as-resource, fetching a file from a slow
    server of ours) is running when its MCP server is killed; the server comes back.
    The write is not sent again by itself: the turn asks, saying it may have run
    already; declined, the model reads that it was not sent again, and the file was
    fetched once."""
    port = free_port()
    with slow_file() as (file_url, fetched), ExitStack() as first_server:
        gzip = ToolCall(
            id="c1",
            name="everything__gzip-file-as-resource",
            arguments={"name": "notes.gz", "data": file_url},
        )
        model = ScriptedModel(
            plans=[Reply(calls=[gzip])], decisions=[lambda req: Reply(text=last_result(req))]
        )
        proc = first_server.enter_context(everything_process(port))
        server = MCPServer(name="everything", url=f"http://127.0.0.1:{port}/mcp")
        async with (
            connected([agent_with(server)]) as agents,
            harness.worker(model, agents=agents) as task_queue,
        ):
            turn = TurnInput(question="Compress my notes", model="scripted")
            handle = await start_turn(harness.client, turn, task_queue)
            first = await next_pending(handle)
            assert "may have run" not in first.why
            await decide(harness.client, handle.id, "c1", approved=True, by="test")
            async with asyncio.timeout(120):  # the server is fetching the file
                while not fetched:
                    await asyncio.sleep(0.02)
            proc.kill()
            first_server.close()
            with everything_process(port):
                again = await next_pending(handle)
                assert again.call.id == "c1" and "may have run already" in again.why
                await decide(harness.client, handle.id, "c1", approved=False, by="test")
                result = await handle.result()
    assert result.outcome is Outcome.ANSWERED
    assert "not sent again" in result.answer
    assert len(fetched) == 1


@contextmanager
def everything_process(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """server-everything over Streamable HTTP on `port`, once it listens; its process."""
    proc = subprocess.Popen(
        [str(NPM_BIN / "mcp-server-everything"), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(1200):
            if is_listening("127.0.0.1", port):
                break
            assert proc.poll() is None, "server-everything exited"
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(10)


@contextmanager
def slow_file() -> Iterator[tuple[str, list[str]]]:
    """A file served slowly (it answers once the block ends): its URL, and the paths
    asked for, as they are asked."""
    import http.server
    import threading

    fetched: list[str] = []
    done = threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the handler's own name
            fetched.append(self.path)
            done.wait(60)
            body = b"notes\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/notes.txt", fetched
    finally:
        done.set()
        server.shutdown()
        server.server_close()


@needs_npm
async def test_a_write_waits_for_consent_and_is_written_once(
    harness: Harness, tmp_path: Path
) -> None:
    call = ToolCall(
        id="c1",
        name="memory__create_entities",
        arguments={
            "entities": [{"name": "order-123456", "entityType": "order", "observations": ["late"]}]
        },
    )
    model = ScriptedModel(
        plans=[Reply(calls=[call])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with serving(harness, model, memory_server(tmp_path)) as task_queue:
        handle = await start_turn(
            harness.client,
            TurnInput(question="Note that 123456 is late", model="scripted"),
            task_queue,
        )
        while not (await progress_of(handle)).pending:
            await asyncio.sleep(0.05)
        assert entities(tmp_path) == []  # nothing written while it waits
        await decide(harness.client, handle.id, "c1", approved=True, by="test")
        result = await handle.result()
    assert result.outcome is Outcome.ANSWERED
    assert [e["name"] for e in entities(tmp_path)] == ["order-123456"]


@needs_npm
async def test_a_write_whose_attempt_may_have_reached_the_server_is_not_sent_again(
    tmp_path: Path,
) -> None:
    async with connected([agent_with(memory_server(tmp_path))]) as (agent,):
        tool = agent.registry["memory__create_entities"]
        assert tool.side_effects and tool.needs_approval
        arguments = {"entities": [{"name": "x", "entityType": "t", "observations": []}]}
        ctx: ToolContext[Any] = ToolContext(customer_id="demo", deps=None)
        retried = ActivityEnvironment()
        retried.info = activity.Info(**{**retried.info.__dict__, "attempt": 2})
        with pytest.raises(OutcomeUnknown, match="outcome of create_entities is unknown"):
            await retried.run(tool.fn, arguments, ctx)
        first = ActivityEnvironment()
        await first.run(tool.fn, arguments, ctx)
    assert len(entities(tmp_path)) == 1


async def test_a_server_killed_between_turns_is_started_again(harness: Harness) -> None:
    call = ToolCall(id="c1", name="time__get_current_time", arguments={"timezone": "Asia/Tokyo"})
    model = ScriptedModel(
        plans=[Reply(calls=[call])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with serving(harness, model, TIME) as task_queue:
        turn = TurnInput(question="Time in Tokyo?", model="scripted")
        first = await (await start_turn(harness.client, turn, task_queue)).result()
        for pid in _children_named("mcp-server-time"):
            os.kill(pid, signal.SIGKILL)
        second = await (await start_turn(harness.client, turn, task_queue)).result()
    assert "Asia/Tokyo" in first.answer
    assert "Asia/Tokyo" in second.answer


async def test_a_server_killed_mid_turn_is_started_again_for_its_call(harness: Harness) -> None:
    call = ToolCall(id="c1", name="time__get_current_time", arguments={"timezone": "Asia/Tokyo"})

    def kill_then_call(request: Any) -> Reply:
        for pid in _children_named("mcp-server-time"):
            os.kill(pid, signal.SIGKILL)
        return Reply(calls=[call])

    model = ScriptedModel(
        plans=[kill_then_call], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with serving(harness, model, TIME) as task_queue:
        turn = TurnInput(question="Time in Tokyo?", model="scripted")
        result = await (await start_turn(harness.client, turn, task_queue)).result()
    assert result.outcome is Outcome.ANSWERED
    assert "Asia/Tokyo" in result.answer


def _children_named(name: str) -> list[int]:
    found = children(os.getpid(), name)
    assert found, f"no {name} process of this test"
    return found


async def test_the_cli_asks_a_question_a_server_answers(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Done as a person would: worker.py with --mcp-config, then client.py ask."""
    fake = ChatCompletionsServer()
    fake.replies = [
        tool_calls(("c1", "time__get_current_time", json.dumps({"timezone": "Europe/Paris"}))),
        text("Here is the time in Paris."),
    ]
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": TIME.command}}}))
    environ = worker_environ(env, tmp_path, fake)
    try:
        with worker_process(environ, "worker.py", "--mcp-config", str(config)):
            asked = subprocess.run(
                [sys.executable, "client.py", "ask", "What time is it in Paris?"],
                cwd=ROOT,
                env=environ,
                capture_output=True,
                text=True,
                timeout=120,
            )
    finally:
        fake.close()
    assert asked.returncode == 0, asked.stderr
    assert "answer (answered): Here is the time in Paris." in asked.stdout
    # The model read the server's answer.
    tool_results = [m for r in fake.accepted for m in r["messages"] if m["role"] == "tool"]
    assert tool_results and all("Europe/Paris" in m["content"] for m in tool_results)


def tool_names(request: Any) -> list[str]:
    return sorted(spec.name for spec in request.tools)


@needs_npm
async def test_a_tool_list_that_changes_keeps_running_turns_on_theirs(
    harness: Harness, tmp_path: Path
) -> None:
    """A server upgraded while a turn waits for consent (its command now starts another
    server, and the old process is gone): a turn started then is offered the new
    list; the waiting turn keeps the list it started with to its end, and its call
    reaches the new server, which says what it thinks of it."""
    command = tmp_path / "desk-server"
    command.symlink_to(NPM_BIN / "mcp-server-memory")
    server = MCPServer(
        name="desk", command=str(command), env={"MEMORY_FILE_PATH": str(tmp_path / "m.jsonl")}
    )
    offered: dict[str, list[list[str]]] = {"waiting": [], "new": []}

    def remember(request: Any) -> None:
        turn = "waiting" if "Remember" in str(request.messages[0]) else "new"
        offered[turn].append(tool_names(request))

    def plan(request: Any) -> Reply:
        remember(request)
        if offered["new"]:
            return Reply(text="It is late in Tokyo.")
        entities = {"entities": [{"name": "x", "entityType": "t", "observations": []}]}
        return Reply(calls=[ToolCall(id="c1", name="desk__create_entities", arguments=entities)])

    def answer(request: Any) -> Reply:
        remember(request)
        return Reply(text=last_result(request))

    model = ScriptedModel(plans=[plan], decisions=[answer])
    async with (
        connected([agent_with(server)]) as agents,
        harness.worker(model, agents=agents) as task_queue,
    ):
        [connection] = agents[0].registry.connections  # type: ignore[attr-defined]
        remember_x = TurnInput(question="Remember x.", model="scripted")
        waiting = await start_turn(harness.client, remember_x, task_queue)
        await next_pending(waiting)
        upgraded = tmp_path / "upgraded"
        upgraded.symlink_to(BIN / "mcp-server-time")
        upgraded.replace(command)
        for pid in _children_named("desk-server"):
            os.kill(pid, signal.SIGKILL)
        async with asyncio.timeout(60):  # the worker has seen it go
            while connection.alive:
                await asyncio.sleep(0.02)
        ask = TurnInput(question="Time in Tokyo?", model="scripted")
        new = await (await start_turn(harness.client, ask, task_queue)).result()
        await decide(harness.client, waiting.id, "c1", approved=True, by="test")
        old = await waiting.result()
    memory_tools, time_tools = (
        offered["waiting"][0],
        ["desk__convert_time", "desk__get_current_time"],
    )
    assert "desk__create_entities" in memory_tools
    assert offered == {"waiting": [memory_tools, memory_tools], "new": [time_tools]}
    assert "create_entities failed: Unknown tool: create_entities" in old.answer
    assert old.fingerprint != new.fingerprint


@needs_npm
async def test_a_worker_that_never_saw_a_turns_tools_serves_it_with_those_it_recorded(
    harness: Harness, tmp_path: Path
) -> None:
    """A turn waits for consent with the tools its worker listed (a memory server's);
    that worker stops, the server is upgraded (its command now starts a time server),
    and a worker started since, which never saw the turn's tools, takes the turn up:
    it reads the specs the turn recorded, offers the model those, and sends the call
    to its own server, which says what it thinks of it."""
    command = tmp_path / "desk-server"
    command.symlink_to(NPM_BIN / "mcp-server-memory")
    server = MCPServer(
        name="desk", command=str(command), env={"MEMORY_FILE_PATH": str(tmp_path / "m.jsonl")}
    )
    entity = {"entities": [{"name": "x", "entityType": "t", "observations": []}]}
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="desk__create_entities", arguments=entity)])],
        decisions=[lambda request: Reply(text=last_result(request))],
    )
    task_queue = f"mcp-{uuid.uuid4().hex[:8]}"
    settings = replace(Settings.from_env(), versioning=False)
    catalog = ModelCatalog({"scripted": lambda _: model})

    def worker(agents: list[Agent]) -> Any:
        return build_worker(
            harness.client, task_queue, agents=agents, models=catalog, settings=settings
        )

    async with connected([agent_with(server)]) as agents, worker(agents):
        turn = TurnInput(question="Remember x.", model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        await next_pending(handle)
        [(_, started_with)] = model.requests
    upgraded = tmp_path / "upgraded"
    upgraded.symlink_to(BIN / "mcp-server-time")
    upgraded.replace(command)
    async with connected([agent_with(server)]) as agents, worker(agents):
        assert "desk__create_entities" not in agents[0].registry.tools  # it lists time tools
        await decide(harness.client, handle.id, "c1", approved=True, by="test")
        result = await handle.result()
    (_, plan), (_, interpret) = model.requests
    assert "desk__create_entities" in tool_names(plan)
    assert tool_names(interpret) == tool_names(plan)
    assert [t.parameters for t in interpret.tools] == [t.parameters for t in plan.tools]
    assert "create_entities failed: Unknown tool: create_entities" in result.answer


@needs_npm
async def test_a_server_that_says_its_list_changed_is_listed_again_before_the_next_turn(
    harness: Harness,
) -> None:
    """server-everything (stdio) adds tools of its own once the client says it is
    initialized, and says so (`notifications/tools/list_changed`), while the worker
    lists its tools. The worker hears it: the next turn's first step lists the tools
    again, once; a turn after it, with nothing heard since, lists nothing."""
    server = MCPServer(
        name="everything", command=str(NPM_BIN / "mcp-server-everything"), args=("stdio",)
    )
    echo = ToolCall(id="c1", name="everything__echo", arguments={"message": "hi"})
    model = ScriptedModel(
        plans=[Reply(calls=[echo])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with (
        connected([agent_with(server)]) as agents,
        harness.worker(model, agents=agents) as task_queue,
    ):
        [connection] = agents[0].registry.connections  # type: ignore[attr-defined]
        async with asyncio.timeout(60):  # it has said so
            while not connection.stale:
                await asyncio.sleep(0.02)
        listed = connection.listed
        lists: list[int] = []
        real = connection._list

        async def counted() -> list[Any]:
            lists.append(1)
            return await real()

        connection._list = counted
        turn = TurnInput(question="Echo hi", model="scripted")
        first = await (await start_turn(harness.client, turn, task_queue)).result()
        after_first = len(lists)
        second = await (await start_turn(harness.client, turn, task_queue)).result()
    assert (after_first, len(lists)) == (1, 1)
    assert not connection.stale
    assert "simulate-research-query" in {t.name for t in listed}
    assert "Echo: hi" in first.answer and "Echo: hi" in second.answer
    assert first.fingerprint == second.fingerprint  # the same list: the same version


def worker_environ(
    env: WorkflowEnvironment, tmp_path: Path, fake: ChatCompletionsServer
) -> dict[str, str]:
    """A worker's and client's environment: the test server, a task queue of their
    own, the strict fake as the model."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    return base | {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_TASK_QUEUE": f"mcp-{uuid.uuid4().hex[:8]}",
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_MODEL": "openai:test-model",
        "OPENAI_BASE_URL": fake.url,
        "OPENAI_API_KEY": fake.api_key,
    }


async def client_py(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`client.py ARGS` in that environment, as a person types it (no stdin), off the
    event loop; done within two minutes."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "client.py", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@dataclass
class RunningWorker:
    """A worker process and what it has printed. Its output is read all along, so a
    worker that logs a lot never blocks on a full pipe."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if "worker ready" in line:
                self.ready.set()

    def line(self, start: str, timeout: float = 60) -> str:
        """The first line it printed that starts with `start`, once it has."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.startswith(start):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no line starting {start!r}: {''.join(self.lines)}")

    def stop(self) -> str:
        """Stop it (SIGTERM, as a deployment does) and return all it printed."""
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(60)
        if self.reader is not None:
            self.reader.join(60)
        return "".join(self.lines)


@contextmanager
def worker_process(environ: dict[str, str], *command: str) -> Iterator[RunningWorker]:
    """A worker process, once it says it is ready (within two minutes); stopped at
    the end."""
    worker = RunningWorker(
        subprocess.Popen(
            [sys.executable, *command],
            cwd=ROOT,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    )
    worker.reader = threading.Thread(target=worker.read, daemon=True)
    worker.reader.start()
    try:
        if not worker.ready.wait(120):
            worker.process.kill()
            worker.reader.join(10)
            raise AssertionError("the worker was not ready in 120 s: " + "".join(worker.lines))
        yield worker
    finally:
        worker.stop()


async def next_pending(handle: Any) -> Any:
    """The first call of the turn waiting for consent, once one does."""
    async with asyncio.timeout(120):
        while not (pending := (await progress_of(handle)).pending):
            await asyncio.sleep(0.05)
    return pending[0]


@needs_npm
async def test_a_worker_killed_during_a_write_leaves_it_written_once_and_asks(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A worker SIGKILLed after the server took a write and before Temporal heard of it:
    the worker that takes the call over does not send it again; the turn asks, and
    the write is there once."""
    fake = ChatCompletionsServer()
    entity = {"entities": [{"name": "order-123456", "entityType": "note", "observations": []}]}
    fake.replies = [
        tool_calls(("c1", "memory__create_entities", json.dumps(entity))),
        text("I could not confirm the note was saved; please check it."),
    ]
    server = memory_server(tmp_path)
    config = tmp_path / "mcp.json"
    entry = {"command": server.command, "env": dict(server.env)}
    config.write_text(json.dumps({"mcpServers": {"memory": entry}}))
    environ = worker_environ(env, tmp_path, fake)
    crashing = ("tests/mcp_crashing_worker.py", str(tmp_path / "killed"), "--mcp-config")
    turn = TurnInput(question="Note order 123456 down.", customer_id="c-mcp")
    try:
        with worker_process(environ, *crashing, str(config)) as dying:
            handle = await start_turn(env.client, turn, environ["AGENT_TASK_QUEUE"])
            first = await next_pending(handle)
            await decide(env.client, handle.id, first.call.id, approved=True, by="test")
            assert await asyncio.to_thread(dying.process.wait, 60) == -signal.SIGKILL
        assert len(entities(tmp_path)) == 1  # it reached the server before the kill
        with worker_process(environ, "worker.py", "--mcp-config", str(config)):
            again = await next_pending(handle)
            assert again.call.id == "c1" and "may have run already" in again.why
            await decide(env.client, handle.id, "c1", approved=False, by="test")
            result = await handle.result()
    finally:
        fake.close()
    assert result.outcome is Outcome.ANSWERED
    assert [e["name"] for e in entities(tmp_path)] == ["order-123456"]
    # The model read that the write was not sent again.
    tool_results = [m for r in fake.accepted for m in r["messages"] if m["role"] == "tool"]
    assert tool_results and "not sent again" in tool_results[-1]["content"]


async def test_the_offline_model_asks_a_server_with_values_shaped_like_its_examples(
    harness: Harness,
) -> None:
    """The offline model reads the server's own schema: `timezone` is described by
    quoted examples ('America/New_York'), so the word of that shape is its value."""
    async with serving(harness, None, TIME) as task_queue:
        asked = [
            await (await start_turn(harness.client, TurnInput(question=q), task_queue)).result()
            for q in ("What time is it in Europe/Paris?", "What is the current time in Asia/Tokyo?")
        ]
    for result, zone in zip(asked, ("Europe/Paris", "Asia/Tokyo"), strict=True):
        assert result.outcome is Outcome.ANSWERED
        [seen] = observations(result)
        assert f'"timezone": "{zone}"' in seen and '"datetime"' in seen


# -- the commands that start a worker of their own ------------------------------------


def user_folder(tmp_path: Path, *servers: MCPServer) -> Path:
    """A folder of a user's own, with `mypkg.agents:desk` naming `servers` (none: an
    agent with no MCP server of its own)."""
    folder = tmp_path / "mine"
    (folder / "mypkg").mkdir(parents=True)
    (folder / "mypkg" / "__init__.py").write_text("")
    named = ", ".join(
        f"MCPServer(name={s.name!r}, command={s.command!r}, args={s.args!r})" for s in servers
    )
    (folder / "mypkg" / "agents.py").write_text(
        "from durable_agent import Agent\n"
        "from durable_agent.mcp import MCPServer\n\n"
        'desk = Agent(name="desk", instructions="You tell the time with the tools you have.",'
        f" mcp_servers=[{named}])\n"
    )
    return folder


def command_environ(env: WorkflowEnvironment, tmp_path: Path) -> dict[str, str]:
    """The environment of a command run in a user's folder: the test server, the
    offline model (the default), state in tmp_path."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    return base | {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.mark.parametrize("where", ["definition", "config"])
def test_ask_embedded_serves_the_servers_of_the_agent_and_of_mcp_config(
    env: WorkflowEnvironment, tmp_path: Path, where: str
) -> None:
    """`durable-agent ask --embedded` from a user's folder starts a worker of its own:
    it connects the servers the agent's definition names, or those --mcp-config names,
    and the offline model answers from the server's tool."""
    folder = user_folder(tmp_path, TIME) if where == "definition" else user_folder(tmp_path)
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": TIME.command}}}))
    more = ["--mcp-config", str(config)] if where == "config" else []
    asked = subprocess.run(
        [str(BIN / "durable-agent"), "--task-queue", f"mcp-{uuid.uuid4().hex[:8]}", "ask"]
        + ["--embedded", "--agent", "mypkg.agents:desk", *more]
        + ["What is the current time in Asia/Tokyo?"],
        cwd=folder,
        env=command_environ(env, tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert asked.returncode == 0, asked.stderr
    assert "Traceback" not in asked.stderr
    answer = next(line for line in asked.stdout.splitlines() if line.startswith("answer"))
    assert answer.startswith("answer (answered):") and '"timezone": "Asia/Tokyo"' in answer


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--mcp-config", "{config}"], "--mcp-config is read by the worker that --embedded"),
        (["--embedded", "--mcp-config", "{config}.missing"], "No such file"),
        (["--embedded", "--mcp-config", "{broken}"], "MCP server 'nope' (/nonexistent/mcp"),
    ],
    ids=["without-embedded", "no-file", "cannot-start"],
)
def test_ask_with_an_mcp_config_it_cannot_use_is_one_line(
    env: WorkflowEnvironment, tmp_path: Path, args: list[str], says: str
) -> None:
    config, broken = tmp_path / "mcp.json", tmp_path / "broken.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": TIME.command}}}))
    broken.write_text(json.dumps({"mcpServers": {"nope": {"command": "/nonexistent/mcp"}}}))
    filled = [a.format(config=config, broken=broken) for a in args]
    asked = subprocess.run(
        [str(BIN / "durable-agent"), "--task-queue", f"mcp-{uuid.uuid4().hex[:8]}", "ask"]
        + ["--agent", "mypkg.agents:desk", *filled, "What time is it in Asia/Tokyo?"],
        cwd=user_folder(tmp_path, TIME),
        env=command_environ(env, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert asked.returncode == 1
    lines = asked.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], asked.stderr
