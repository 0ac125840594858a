"""MCP servers that misbehave (tests/fakes/mcp_server.py, written with the `mcp` SDK):
a list that changes into tools no model can call, a list that never ends or is too
big, a list that fails or hangs, junk on stdout, a tool that says it only reads. None
of them wedges the worker or the agent; each says so in one line naming the server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent import mcp
from durable_agent.approval import ApprovalPolicy
from durable_agent.mcp import MCPConfigError, MCPServer, connected, load_config
from durable_agent.model import ModelRequest, Reply
from durable_agent.runtime.turns import decide, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.types import Outcome, ToolCall, TurnInput
from tests.conftest import Harness, last_result
from tests.fakes.chat_completions import ChatCompletionsServer, text, tool_calls
from tests.test_mcp import (
    ROOT,
    TIME,
    agent_with,
    next_pending,
    observations,
    worker_environ,
    worker_process,
)

FAKE = ROOT / "tests" / "fakes" / "mcp_server.py"

# In-process workers keep their MCP tool lists in the test's folder.
pytestmark = pytest.mark.usefixtures("own_state_dir")


def tool(name: str, schema: dict[str, Any] | None = None, *, reads: bool = True) -> dict[str, Any]:
    """A tool as a server lists it."""
    return {
        "name": name,
        "description": f"The {name} of a thing.",
        "inputSchema": schema or {"type": "object", "properties": {"q": {"type": "string"}}},
        "annotations": {"readOnlyHint": reads},
    }


FIND, LOOKUP = tool("find"), tool("lookup")


def misbehaving(
    tmp_path: Path, spec: dict[str, Any], name: str = "evil", **options: Any
) -> MCPServer:
    """The fake server doing what `spec` says (tests/fakes/mcp_server.py)."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return MCPServer(name=name, command=sys.executable, args=(str(FAKE), str(path)), **options)


def said_of(caplog: pytest.LogCaptureFixture, server: str) -> list[str]:
    """What the worker logged of `server`."""
    named = (f"MCP server {server}", f"MCP server {server!r}")
    return [m for r in caplog.records if (m := r.getMessage()).startswith(named)]


def offered(request: ModelRequest) -> set[str]:
    return {spec.name for spec in request.tools}


# -- a list that changes after the worker started ---------------------------------------

BAD_SCHEMA = {"type": "object", "properties": {"q": {"type": "nonsense"}}}
BAD_REGEX = {"type": "object", "properties": {"q": {"type": "string", "pattern": "("}}}
LOOKING = {"type": "string", "pattern": r"^(?!x)\w+"}
"""A pattern no linear-time engine takes (`durable_agent/schemas.py`)."""
SIXTY_FIVE = "x" * 65

RELISTED = {
    "invalid-schema": (
        {"tools": [FIND, tool("lookup", BAD_SCHEMA)]},
        {"evil__change", "evil__find"},
        "'lookup' (tool evil__lookup: its JSON schema is not valid",
    ),
    "bad-regex-and-required": (
        {
            "tools": [
                FIND,
                tool("lookup", BAD_REGEX),
                tool("get", {"type": "object", "properties": {"q": {"minLength": -1}}}),
            ]
        },
        {"evil__change", "evil__find"},
        "left out 2 tool(s)",
    ),
    "look-around-pattern": (
        {"tools": [FIND, tool("lookup", {"type": "object", "properties": {"q": LOOKING}})]},
        {"evil__change", "evil__find"},
        f"'lookup' (tool evil__lookup: its JSON schema's pattern {LOOKING['pattern']!r} at",
    ),
    "odd-names": (
        {"tools": [FIND, tool("look up"), tool(SIXTY_FIVE)]},
        {"evil__change", "evil__find"},
        "left out 2 tool(s)",
    ),
    "listed-twice": (
        {"tools": [FIND, LOOKUP, tool("lookup", reads=False)]},
        {"evil__change", "evil__find", "evil__lookup"},
        "'lookup' (it is listed twice)",
    ),
    "list-error": (
        {"tools": [FIND], "list_error": "database is down"},
        {"evil__change", "evil__find", "evil__lookup"},
        "its tools/list failed: database is down; its tools stay as they were",
    ),
    "list-hangs": (
        {"tools": [FIND], "list_delay": 60},
        {"evil__change", "evil__find", "evil__lookup"},
        f"listing its tools again takes more than {mcp.RELIST_TIMEOUT_S:g} s",
    ),
    "pages-forever": (
        {"tools": [FIND], "pages": "forever"},
        {"evil__change", "evil__find", "evil__lookup"},
        f"goes on past {mcp.MAX_PAGES} pages",
    ),
    "too-many-tools": (
        {"tools": [tool(f"t{n}") for n in range(mcp.MAX_TOOLS + 1)]},
        {"evil__change", "evil__find", "evil__lookup"},
        f"lists more than {mcp.MAX_TOOLS} tools",
    ),
}


@pytest.mark.parametrize("optional", [True, False], ids=["optional", "required"])
@pytest.mark.parametrize("case", list(RELISTED))
async def test_a_list_that_changes_into_tools_no_model_can_call_leaves_the_rest_working(
    harness: Harness,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    optional: bool,
) -> None:
    """The server's list changes after the worker started (its `change` tool, then
    `notifications/tools/list_changed`): into tools with a schema that is not one, names
    a model cannot call, a name twice; or the list fails, hangs, never ends, is too
    long. The next turn answers with the tools that still work, and one warning names
    the server."""
    then, expected, says = RELISTED[case]
    server = misbehaving(tmp_path, {"tools": [FIND, LOOKUP], "then": then}, optional=optional)

    def plan(request: ModelRequest) -> Reply:
        if "Change" in str(request.messages[0]):
            return Reply(calls=[ToolCall(id="c1", name="evil__change", arguments={})])
        return Reply(calls=[ToolCall(id="c1", name="evil__find", arguments={"q": "x"})])

    model = ScriptedModel(plans=[plan], decisions=[lambda r: Reply(text=last_result(r))])
    async with (
        connected([agent_with(server)]) as agents,
        harness.worker(model, agents=agents) as task_queue,
    ):
        [connection] = agents[0].registry.connections  # type: ignore[attr-defined]
        if case == "list-hangs":
            # A list that hangs holds the server's connection until the list's own
            # timeout, and the next turn's call waits for it: the same story with 8 s
            # rather than 30 s to wait (the first list, read above, had the whole 30 s).
            monkeypatch.setattr(mcp, "LIST_TIMEOUT_S", 8.0)
        change = TurnInput(question="Change", model="scripted")
        first = await (await start_turn(harness.client, change, task_queue)).result()
        async with asyncio.timeout(60):  # the worker heard the list changed
            while not connection.stale:
                await asyncio.sleep(0.02)
        caplog.clear()
        find = TurnInput(question="Find x", model="scripted")
        second = await (await start_turn(harness.client, find, task_queue)).result()
    assert first.outcome is Outcome.ANSWERED and "changed" in first.answer
    assert second.outcome is Outcome.ANSWERED, second
    assert 'find got {"q": "x"}' in second.answer
    planned = [r for k, r in model.requests if k == "plan"][-1]
    assert offered(planned) == expected
    async with asyncio.timeout(90):  # a list that fails may say so after the turn
        while not any(says in line for line in said_of(caplog, "evil")):
            await asyncio.sleep(0.05)
    said = said_of(caplog, "evil")
    assert len(said) <= 2 and not any("\n" in line for line in said), said


# -- a list the worker cannot take as it starts -------------------------------------------

AT_START = {
    "pages-forever": ({"tools": [FIND], "pages": "forever"}, f"past {mcp.MAX_PAGES} pages"),
    "5000-small-tools": (
        {"tools": [tool(f"t{n}") for n in range(5000)]},
        f"more than {mcp.MAX_TOOLS} tools",
    ),
    "3-MB-of-tools": (
        {"tools": [{**tool(f"t{n}"), "description": "d" * 30_000} for n in range(100)]},
        f"weighs more than {mcp.MAX_LIST_BYTES // 1024} KB",
    ),
    "list-error": ({"tools": [FIND], "list_error": "no such table"}, "tools/list failed"),
}


@pytest.mark.parametrize("case", list(AT_START))
def test_a_list_the_worker_cannot_take_stops_it_with_one_line_naming_the_server(
    tmp_path: Path, case: str
) -> None:
    spec, says = AT_START[case]
    server = misbehaving(tmp_path, spec)
    config = tmp_path / "mcp.json"
    entry = {"command": server.command, "args": list(server.args)}
    config.write_text(json.dumps({"mcpServers": {"evil": entry}}))
    done = run_worker(tmp_path, "--mcp-config", str(config))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        line for line in done.stderr.strip().splitlines() if "MCP server 'evil'" in line
    ]
    [line] = done.stderr.strip().splitlines()
    assert says in line and "Traceback" not in done.stderr


def run_worker(tmp_path: Path, *args: str, cwd: Path = ROOT, **more: str) -> Any:
    """`worker.py` (or the console script, from `cwd`) with no Temporal server to reach:
    for what it says before it connects."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    command = (
        [sys.executable, "worker.py"]
        if cwd == ROOT
        else [str(Path(sys.executable).parent / "durable-agent-worker")]
    )
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        env=env
        | {"AGENT_STATE_DIR": str(tmp_path / "state"), "TEMPORAL_ADDRESS": "127.0.0.1:1"}
        | more,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_a_list_that_does_not_answer_at_start_is_one_line_naming_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp, "LIST_TIMEOUT_S", 1.0)  # the default 30 s, shortened
    server = misbehaving(tmp_path, {"tools": [FIND], "list_delay": 60})
    with pytest.raises(MCPConfigError) as caught:
        async with connected([agent_with(server)]):
            pass
    assert str(caught.value) == "MCP server 'evil': its tools/list did not answer within 1 s"


async def test_servers_whose_lists_together_weigh_too_much_are_one_line_naming_the_agent(
    tmp_path: Path,
) -> None:
    """Five servers, each under its own limit, over the agent's together."""
    heavy = {"tools": [{**tool(f"t{n}"), "description": "d" * 2_300} for n in range(100)]}
    servers = [misbehaving(tmp_path, heavy, name=f"s{n}") for n in range(5)]
    with pytest.raises(MCPConfigError) as caught:
        async with connected([agent_with(*servers)]):
            pass
    assert str(caught.value).startswith("agent 'desk': its MCP servers' tool lists weigh ")
    assert "together, more than a model call carries (1024 KB)" in str(caught.value)


async def test_a_tool_with_a_bad_schema_at_start_is_left_out_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = misbehaving(tmp_path, {"tools": [FIND, tool("lookup", BAD_SCHEMA)]})
    async with connected([agent_with(server)]) as (agent,):
        names = set(agent.registry.tools)
    assert names == {"evil__change", "evil__find"}
    [warning] = said_of(caplog, "evil")
    assert (
        "left out 1 tool(s)" in warning and "evil__lookup: its JSON schema is not valid" in warning
    )


@pytest.mark.parametrize(
    "spec",
    [
        {"tools": [FIND], "pages": "forever"},
        {"tools": [FIND], "list_error": "boom"},
        {"tools": [FIND], "list_delay": 60},
        {"tools": [tool("look up"), tool("lookup", BAD_SCHEMA)]},
    ],
    ids=["pages-forever", "list-error", "list-hangs", "no-tool-a-model-can-call"],
)
async def test_an_optional_server_whose_list_fails_at_start_is_left_out(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    spec: dict[str, Any],
) -> None:
    monkeypatch.setattr(mcp, "LIST_TIMEOUT_S", 1.0)
    server = misbehaving(tmp_path, spec, optional=True)
    async with connected([agent_with(TIME, server)]) as (agent,):
        names = set(agent.registry.tools)
    assert "time__get_current_time" in names
    assert not {"evil__find", "evil__lookup"} & names
    assert said_of(caplog, "evil")


# -- stray stdout -------------------------------------------------------------------------


async def test_junk_on_a_servers_stdout_is_one_log_line_with_its_count(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """20,000 lines of junk as the server starts and 2,000 after each call (once, a
    traceback each): the worker answers, and says so in one line."""
    server = misbehaving(
        tmp_path, {"tools": [FIND], "noise": 20_000, "call_noise": 2_000}, name="noisy"
    )
    config = tmp_path / "mcp.json"
    entry = {"command": server.command, "args": list(server.args)}
    config.write_text(json.dumps({"mcpServers": {"noisy": entry}}))
    fake = ChatCompletionsServer()
    fake.replies = [
        tool_calls(("c1", "noisy__find", json.dumps({"q": "x"}))),
        tool_calls(("c2", "noisy__find", json.dumps({"q": "y"}))),
        text("Found both."),
    ]
    environ = worker_environ(env, tmp_path, fake)
    worker = subprocess.Popen(
        [sys.executable, "worker.py", "--mcp-config", str(config)],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert worker.stdout is not None
        said = []
        for line in worker.stdout:
            said.append(line)
            if "worker ready" in line:
                break
        turn = TurnInput(question="Find x and y", customer_id="c-noisy")
        handle = await start_turn(env.client, turn, environ["AGENT_TASK_QUEUE"])
        result = await handle.result()
        worker.terminate()
        rest, _ = await asyncio.to_thread(worker.communicate, timeout=60)
    finally:
        fake.close()
        if worker.poll() is None:
            worker.kill()
            worker.wait(30)
    said.append(rest)
    assert result.outcome is Outcome.ANSWERED
    assert observations(result) == [f'noisy__find: find got {{"q": "{q}"}}' for q in "xy"]
    log = "".join(said)
    assert "Traceback" not in log and len(log) < 5_000, log[:2000]
    [line] = [x for x in log.splitlines() if "not MCP messages" in x]
    assert "MCP server noisy:" in line and "debug: not a protocol message" in line


# -- approval lists name MCP tools --------------------------------------------------------


@pytest.mark.parametrize("required", ["evil__lookup", "evil__*"])
async def test_a_tool_that_claims_it_only_reads_can_be_put_under_consent(
    harness: Harness, tmp_path: Path, required: str
) -> None:
    """`lookup` says it only reads (readOnlyHint); AGENT_APPROVAL_REQUIRED names it
    (or every tool of its server): its call waits for consent, and runs once approved."""
    server = misbehaving(tmp_path, {"tools": [FIND, LOOKUP]})
    call = ToolCall(id="c1", name="evil__lookup", arguments={"q": "ACC-999"})
    model = ScriptedModel(
        plans=[Reply(calls=[call])], decisions=[lambda r: Reply(text=last_result(r))]
    )
    environ = {"AGENT_APPROVAL_REQUIRED": required}
    settings = replace(Settings.from_env(environ), versioning=False)
    async with (
        connected([agent_with(server)]) as agents,
        harness.worker(model, agents=agents, settings=settings) as task_queue,
    ):
        turn = TurnInput(question="Look ACC-999 up", model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        pending = await next_pending(handle)
        assert pending.call.name == "evil__lookup"
        await decide(harness.client, handle.id, "c1", approved=True, by="test")
        result = await handle.result()
    assert 'lookup got {"q": "ACC-999"}' in result.answer


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"AGENT_APPROVAL_REQUIRED": "evil__lookup"}, "evil__lookup (needs approval)"),
        ({"AGENT_APPROVAL_REQUIRED": "evil__*"}, "evil__find (needs approval)"),
        ({"AGENT_APPROVAL_WAIVED": "evil__*"}, "evil__write (writes)"),
    ],
)
async def test_the_worker_takes_approval_settings_that_name_mcp_tools(
    env: WorkflowEnvironment, tmp_path: Path, settings: dict[str, str], says: str
) -> None:
    server = misbehaving(tmp_path, {"tools": [FIND, LOOKUP, tool("write", reads=False)]})
    config = tmp_path / "mcp.json"
    entry = {"command": server.command, "args": list(server.args)}
    config.write_text(json.dumps({"mcpServers": {"evil": entry}}))
    fake = ChatCompletionsServer()
    environ = worker_environ(env, tmp_path, fake) | settings
    try:
        with worker_process(environ, "worker.py", "--mcp-config", str(config)) as worker:
            described = worker.line("agent ")
    finally:
        fake.close()
    assert says in described


@pytest.mark.parametrize("name", ["evli__lookup", "evli__*", "lookup"])
def test_an_approval_setting_that_names_no_server_is_still_refused(
    tmp_path: Path, name: str
) -> None:
    server = misbehaving(tmp_path, {"tools": [FIND]})
    config = tmp_path / "mcp.json"
    entry = {"command": server.command, "args": list(server.args)}
    config.write_text(json.dumps({"mcpServers": {"evil": entry}}))
    done = run_worker(tmp_path, "--mcp-config", str(config), AGENT_APPROVAL_REQUIRED=name)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert f"names unknown tools: {name}" in line
    assert ("PREFIX__TOOL or PREFIX__*" in line) == ("__" in name)


def test_an_approval_policy_reads_server_wildcards() -> None:
    policy = ApprovalPolicy(required=frozenset({"evil__*"}), waived=frozenset({"time__*"}))
    assert policy.needs_approval("evil__lookup", declared=False)
    assert not policy.needs_approval("time__convert_time", declared=True)
    assert not policy.needs_approval("evilness", declared=False)
    assert policy.needs_approval("evil_lookup", declared=True)  # its own word


# -- the SDK and the config ------------------------------------------------------------------


@pytest.mark.parametrize(
    "shadow",
    ["", "raise RuntimeError('my helper is broken')\n"],
    ids=["a-module", "a-module-that-fails"],
)
def test_a_module_of_ones_own_named_mcp_is_named_not_a_timeout(tmp_path: Path, shadow: str) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "mcp.py").write_text(f"# my own helpers\n{shadow}")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": TIME.command}}}))
    done = run_worker(tmp_path, "--mcp-config", str(config), cwd=folder)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert str(folder / "mcp.py") in line and "shadows" in line


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ('{"mcpServers": {"t": {"command": "x", "timeout": Infinity}}}', "timeout is seconds"),
        ('{"mcpServers": {"t": {"command": "x", "timeout": -Infinity}}}', "timeout is seconds"),
        ('{"mcpServers": {"t": {"command": "x", "timeout": NaN}}}', "timeout is seconds"),
        ('{"mcpServers": {"t": {"command": "x", "timeout": 1e308}}}', "timeout is seconds"),
        ('{"mcpServers": {"t": {"command": "x", "timeout": 1e999}}}', "timeout is seconds"),
        ('{"mcpServers": ' + "[" * 50_000 + "]" * 50_000 + "}", "nested too deeply"),
        ('{"mcpServers": ' + '{"a":' * 50_000 + "1" + "}" * 50_000 + "}", "nested too deeply"),
        ('{"mcpServers": {}, "pad": "' + "x" * 1_100_000 + '"}', "over 1 MB"),
        (b'{"mcpServers": {"\xff": {}}}', "not JSON"),
    ],
    ids=[
        "Infinity",
        "-Infinity",
        "NaN",
        "1e308",
        "1e999",
        "deep-lists",
        "deep-objects",
        "huge",
        "not-utf8",
    ],
)
def test_a_config_the_worker_cannot_read_is_one_line_and_exit_1(
    tmp_path: Path, config: str | bytes, says: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_bytes(config if isinstance(config, bytes) else config.encode())
    with pytest.raises(MCPConfigError) as caught:
        load_config(path)
    assert says in str(caught.value)
    done = run_worker(tmp_path, "--mcp-config", str(path))
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert says in line and line.startswith("error: ")
