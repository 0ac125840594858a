"""Schemas with patterns that backtrack (`durable_agent/schemas.py`). Python's `re`,
which `jsonschema` uses, takes hours over `^(a+)+$` and `"a" * 60 + "!"` while it holds
the GIL: a worker checking such a value answered nothing else, its turns' time limits
did not end them and SIGTERM did not stop it. Such a pattern comes from a turn's own
output type, an MCP server's tool list (its input and output schemas) or a tool
described by a JSON schema; here each is met with values that would backtrack, and
every check ends at once, on a worker that goes on serving and stops when told.
A pattern no linear-time engine takes (look-around, backreferences) is refused as the
schema is loaded, in one line naming it.

The checks that could freeze run under `cpu_guard`: past a minute of CPU a check is
interrupted (Python's `re` looks at signals as it backtracks), so a regression fails
the test instead of holding it until the suite's timeout."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentClient, tool
from durable_agent.agents import Agent
from durable_agent.conversation import Message, ToolResult, UserMessage
from durable_agent.errors import InvalidCall, InvalidOutputType
from durable_agent.model import Reply
from durable_agent.outputs import OUTPUT_TOOL
from durable_agent.tools import ToolContext, ToolRegistry, ToolSpec, schema_tool
from durable_agent.types import Outcome, OutputSpec, ToolCall, TurnInput
from tests.conftest import Harness
from tests.fakes.chat_completions import ChatCompletionsServer
from tests.test_mcp import RunningWorker, worker_environ, worker_process
from tests.test_mcp_misbehaving import FAKE, run_worker

HOSTILE = {
    r"^(a+)+$": "a" * 60 + "!",
    r"(a|aa)+$": "a" * 60 + "!",
    r"(x+x+)+y": "x" * 60,
    r"^(\w+\s?)*$": "a" * 60 + "!",
    r"(a|a)*b": "a" * 60,
}
"""Patterns, each with a value Python's `re` would take hours or years to refuse."""
FITTING = {
    r"^(a+)+$": "aaaa",
    r"(a|aa)+$": "baaa",
    r"(x+x+)+y": "--xxy",
    r"^(\w+\s?)*$": "two words",
    r"(a|a)*b": "aab",
}
"""A value each pattern takes: JSON Schema's `pattern` matches anywhere unless anchored."""
LOOKING_AROUND = {
    "look-ahead": (r"^(?!0)\d+$", "look-around"),
    "look-behind": (r"(?<=@)\w+", "look-around"),
    "backreference": (r"(\w)\1", "backreferences are not supported"),
}
GRACEFUL_S = 10
"""The worker's graceful shutdown timeout (`durable_agent/plugin.py`)."""


@pytest.fixture(autouse=True)
def cpu_guard() -> Iterator[None]:
    """A check that runs past a minute of CPU is interrupted (then every minute)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise TimeoutError("over a minute of CPU: a pattern is backtracking")

    before = signal.signal(signal.SIGVTALRM, interrupt)
    signal.setitimer(signal.ITIMER_VIRTUAL, 60, 60)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, before)


def object_with(schema: dict[str, Any], name: str = "code") -> dict[str, Any]:
    return {"type": "object", "properties": {name: schema}, "required": [name]}


def places(pattern: str) -> dict[str, tuple[dict[str, Any], Any]]:
    """Where a pattern may sit in a tool's schema, each with how a value reaches it."""
    return {
        "pattern": (object_with({"type": "string", "pattern": pattern}), lambda v: v),
        "patternProperties": (
            object_with(
                {
                    "type": "object",
                    "patternProperties": {pattern: {"type": "integer"}},
                    "additionalProperties": False,
                }
            ),
            lambda v: {v: 1},
        ),
        "$defs-items": (
            {
                **object_with({"type": "array", "items": {"$ref": "#/$defs/Code"}}),
                "$defs": {"Code": {"type": "string", "pattern": pattern}},
            },
            lambda v: [v],
        ),
        "propertyNames": (
            object_with({"type": "object", "propertyNames": {"pattern": pattern}}),
            lambda v: {v: True},
        ),
    }


def lookup(schema: dict[str, Any], name: str = "lookup") -> Any:
    return schema_tool(name, "Look a code up.", schema, lambda args, ctx: "found")


def check(t: Any, arguments: dict[str, Any]) -> tuple[str | None, float]:
    """What `ToolRegistry.validate` says of a call (None: it is valid), and the
    seconds it took to say it."""
    started = time.perf_counter()
    try:
        ToolRegistry([t]).validate(ToolCall(id="c1", name=t.name, arguments=arguments))
        said = None
    except InvalidCall as e:
        said = str(e)
    return said, time.perf_counter() - started


# -- a tool described by a JSON schema: each check at once ----------------------------


@pytest.mark.parametrize("place", ["pattern", "patternProperties", "$defs-items", "propertyNames"])
@pytest.mark.parametrize("pattern", list(HOSTILE))
def test_a_value_that_would_backtrack_is_refused_at_once_wherever_its_pattern_is(
    pattern: str, place: str
) -> None:
    schema, value_at = places(pattern)[place]
    t = lookup(schema)
    said, took = check(t, {"code": value_at(HOSTILE[pattern])})
    assert said and ("does not match" in said or "not match any of the regexes" in said), said
    assert took < 2 and "\n" not in said and len(said) < 1_000
    assert check(t, {"code": value_at(FITTING[pattern])})[0] is None  # what fits passes


def test_a_wide_pattern_is_refused_when_loaded_and_a_long_value_is_not_checked_for_long() -> None:
    """Rust's engine is linear, but a pattern with a large automaton costs per
    character: `(?:.{0,50}){0,50}x` took 7 s over 100,000 characters."""
    with pytest.raises(TypeError) as refused:
        lookup(object_with({"type": "string", "pattern": r"(?:.{0,50}){0,50}x"}))
    assert "(?:.{0,50}){0,50}x" in str(refused.value) and "too wide" in str(refused.value)

    wide = {"type": "string", "pattern": r"(?:.{0,30}){0,30}x"}  # 931 atoms wide
    said, took = check(lookup(object_with(wide)), {"code": "a" * 100_000})
    assert said and "too long to check against the schema's patterns" in said and took < 2
    said, took = check(lookup(object_with(wide)), {"code": "a" * 1_000 + "x"})
    assert said is None and took < 2
    # The budget is a value's: two strings, each within it, are over it together.
    many = lookup(object_with({"type": "array", "items": wide}))
    said, took = check(many, {"code": ["a" * 2_000] * 2})
    assert said and "too long to check" in said and took < 2


def test_unique_items_of_many_objects_are_compared_in_linear_time() -> None:
    """Compared pairwise, 3,000 objects took 18 s."""
    t = lookup(object_with({"type": "array", "uniqueItems": True}))
    said, took = check(t, {"code": [{"n": n, "tags": ["a", n]} for n in range(20_000)]})
    assert said is None and took < 2
    said, took = check(t, {"code": [{"n": n} for n in range(20_000)] + [{"n": 7.0}]})
    assert said and "non-unique" in said and took < 2
    # JSON's equality: true is not 1, at any depth.
    assert check(t, {"code": [1, True, [1], [True], {"a": 1}, {"a": True}]})[0] is None


def test_a_remote_ref_is_never_fetched() -> None:
    """`jsonschema` fetches a `$ref` to a URL as it checks, with no time limit."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"type": "string"}')

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/code.json"
        said, _ = check(lookup(object_with({"$ref": url})), {"code": "x"})
        assert said and "cannot be resolved" in said
    finally:
        server.shutdown()
        server.server_close()
    assert asked == []


# -- a pattern no linear engine takes: one line, as the schema is loaded --------------


@pytest.mark.parametrize("kind", list(LOOKING_AROUND))
def test_look_around_and_backreferences_are_refused_in_one_line_naming_them(kind: str) -> None:
    pattern, why = LOOKING_AROUND[kind]
    for schema, where in [
        (object_with({"type": "string", "pattern": pattern}), "at properties.code"),
        (
            {**object_with({"$ref": "#/$defs/C"}), "$defs": {"C": {"pattern": pattern}}},
            "at $defs.C",
        ),
        (object_with({"patternProperties": {pattern: {}}}), "at properties.code.patternProperties"),
    ]:
        with pytest.raises(TypeError) as refused:
            lookup(schema)
        said = str(refused.value)
        assert said.startswith("tool lookup: its JSON schema's pattern ") and "\n" not in said
        assert repr(pattern) in said and where in said and why in said


def test_unevaluated_properties_beside_pattern_properties_is_refused() -> None:
    """`jsonschema` matches `patternProperties` for `unevaluatedProperties` on its own."""
    schema = {"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False}
    with pytest.raises(TypeError, match="unevaluatedProperties and patternProperties"):
        lookup(schema)


class PythonRe(BaseModel):
    model_config = ConfigDict(regex_engine="python-re")
    code: str = Field(pattern=r"^(a+)+$")


def code_lookup(args: PythonRe, ctx: ToolContext[Any]) -> str:
    """Look a code up."""
    return "found"


@pytest.mark.parametrize("kind", ["schema tool, look-ahead", "pydantic model on python-re"])
def test_a_worker_with_such_a_tool_stops_at_start_with_one_line(tmp_path: Path, kind: str) -> None:
    """A schema tool with look-ahead, or a pydantic model that would run its pattern
    on Python's `re` (pydantic's own default is Rust's `regex`, which refuses
    look-around when the model is made)."""
    schema_tool_module = f"""
from durable_agent import Agent
from durable_agent.tools import schema_tool

code = {{"type": "string", "pattern": {LOOKING_AROUND["look-ahead"][0]!r}}}
schema = {{"type": "object", "properties": {{"code": code}}}}
lookup = schema_tool("lookup", "Look a code up.", schema, lambda args, ctx: "found")
agent = Agent(name="codes", tools=[lookup])
"""
    pydantic_module = """
from pydantic import BaseModel, ConfigDict, Field
from durable_agent import Agent, ToolContext, tool

class Code(BaseModel):
    model_config = ConfigDict(regex_engine="python-re")
    code: str = Field(pattern=r"^(a+)+$")

@tool
def lookup(args: Code, ctx: ToolContext) -> str:
    '''Look a code up.'''
    return "found"

agent = Agent(name="codes", tools=[lookup])
"""
    module = schema_tool_module if kind.startswith("schema") else pydantic_module
    (tmp_path / "codes.py").write_text(module)
    done = run_worker(tmp_path, "--agent", "codes:agent", PYTHONPATH=str(tmp_path))
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and "tool lookup: its" in line
    if kind.startswith("schema"):
        assert "'^(?!0)\\\\d+$' at properties.code cannot be used: look-around" in line
    else:
        assert "'^(a+)+$' would run on Python's backtracking `re`" in line


def test_types_whose_patterns_would_run_on_python_re_are_refused() -> None:
    """An agent's output type, a turn's, a tool's arguments: pydantic's `python-re`
    engine (or a compiled `re.Pattern`) would backtrack over the model's values."""
    with pytest.raises(ValueError, match=r"agent 'x': output type 'PythonRe': its pattern"):
        Agent(name="x", output_type=PythonRe)
    with pytest.raises(ValueError, match=r"tool code_lookup: its pattern '\^\(a\+\)\+\$'"):
        ToolRegistry([tool(code_lookup)])


async def test_a_turns_output_type_with_look_around_is_refused_before_the_turn_starts(
    env: WorkflowEnvironment,
) -> None:
    agents = AgentClient(env.client, task_queue="never-started")
    pattern = LOOKING_AROUND["look-behind"][0]
    spec = OutputSpec(name="Code", json_schema=object_with({"type": "string", "pattern": pattern}))
    with pytest.raises(InvalidOutputType) as refused:
        await agents.start("Give me the code", output_type=spec)
    said = str(refused.value)
    assert said.startswith("output type 'Code': its JSON schema's pattern '(?<=@)\\\\w+'")
    assert "look-around" in said and "\n" not in said
    with pytest.raises(InvalidOutputType, match="look-around"):
        await agents.start_turn(TurnInput(question="Give me the code", output=spec))
    with pytest.raises(InvalidOutputType, match=r"output type 'PythonRe': its pattern"):
        await agents.start("Give me the code", output_type=PythonRe)


# -- the offline model and shield search their customers' words by tools' patterns ----


async def test_the_offline_model_does_not_search_words_with_a_pattern_that_backtracks(
    harness: Harness,
) -> None:
    """The offline model (`argfill`) and the offline shield look for ids in what the
    customer wrote with a tool's pattern, on Python's `re`: one that could backtrack
    is not used so."""
    t = lookup(object_with({"type": "string", "pattern": r"^(\w+\s?)*$"}), "code_lookup")
    agent = Agent(name="codes", tools=[t])
    async with harness.worker(agents=[agent]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        async with asyncio.timeout(60):
            result = await agents.ask("Look up code " + "a" * 60 + "-", model="offline")
    assert result.outcome is Outcome.ANSWERED, result.answer


# -- through worker processes: a turn's output type, an MCP server --------------------

OUTPUT_TYPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    **{
        f"Give code {n}": (object_with({"type": "string", "pattern": p}), {"code": v})
        for n, (p, v) in enumerate(HOSTILE.items())
    },
    "Give codes by key": (
        object_with(
            {
                "type": "object",
                "patternProperties": {r"^(a+)+$": {"type": "integer"}},
                "additionalProperties": False,
            },
            "codes",
        ),
        {"codes": {"a" * 60 + "!": 1}},
    ),
    "Give nested codes": (
        {
            **object_with({"type": "array", "items": {"$ref": "#/$defs/Code"}}, "codes"),
            "$defs": {"Code": {"type": "string", "pattern": r"(x+x+)+y"}},
        },
        {"codes": ["x" * 60]},
    ),
}
"""A turn's output type (its question: the schema, and the value the model gives)."""

READS = {"annotations": {"readOnlyHint": True}}
"""Every tool of the server reads: its calls run with no consent asked."""
MCP_TOOLS = [
    *(
        {"name": f"code{n}", "inputSchema": object_with({"type": "string", "pattern": p})}
        for n, p in enumerate(HOSTILE)
    ),
    {"name": "keys", "inputSchema": places(r"^(a+)+$")["patternProperties"][0]},
    {"name": "nested", "inputSchema": places(r"(x+x+)+y")["$defs-items"][0]},
    {
        "name": "noted",
        "inputSchema": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": r"^(a+)+$"},
                "note": {"type": "string"},
            },
            "required": ["code", "note"],
        },
    },
    {
        "name": "fetch",
        "inputSchema": {"type": "object", "properties": {}},
        "outputSchema": object_with({"type": "string", "pattern": r"(a|a)*b"}),
    },
    {"name": "ahead", "inputSchema": object_with({"pattern": LOOKING_AROUND["look-ahead"][0]})},
    {
        "name": "behind",
        "inputSchema": {"type": "object", "properties": {}},
        "outputSchema": object_with({"pattern": LOOKING_AROUND["look-behind"][0]}),
    },
]
MCP_CALLS: dict[str, tuple[str, dict[str, Any], str]] = {
    **{
        f"Look up code{n}": (f"evil__code{n}", {"code": v}, "does not match")
        for n, v in enumerate(HOSTILE.values())
    },
    "Look up keys": ("evil__keys", {"code": {"a" * 60 + "!": 1}}, "not match any of the regexes"),
    "Look up nested": ("evil__nested", {"code": ["x" * 60]}, "does not match"),
    # Valid: then the offline shield reads the note, an id of `code`'s pattern or not.
    "Look up noted": ("evil__noted", {"code": "aaa", "note": "a" * 60 + "b"}, "noted got"),
    # The server's structured result is checked against its output schema.
    "Look up fetch": ("evil__fetch", {}, "failed"),
}
"""An MCP turn's question: the call the model makes, and what the turn's answer says."""


def brain(messages: list[Message], tools: list[ToolSpec]) -> Reply:
    """The model: each question's value or call, scripted; a tool's result read back."""
    asked = next(m.text for m in messages if isinstance(m, UserMessage))
    if asked in OUTPUT_TYPES:
        value = OUTPUT_TYPES[asked][1]
        if any(t.name == OUTPUT_TOOL for t in tools):
            return Reply(calls=[ToolCall(id="out", name=OUTPUT_TOOL, arguments=value)])
        return Reply(text=json.dumps(value))
    if isinstance(messages[-1], ToolResult):
        return Reply(text=f"The tool said: {messages[-1].text}")
    if asked in MCP_CALLS:
        name, arguments, _ = MCP_CALLS[asked]
        return Reply(calls=[ToolCall(id="c1", name=name, arguments=arguments)])
    return Reply(text="Hello from the model.")


def mcp_config(directory: Path, spec: dict[str, Any]) -> Path:
    spec = {**spec, "tools": [{**READS, **t} for t in spec["tools"]]}
    (directory / "evil.json").write_text(json.dumps(spec))
    entry = {"command": sys.executable, "args": [str(FAKE), str(directory / "evil.json")]}
    config = directory / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"evil": {**entry, "attempts": 1}}}))
    return config


@pytest.fixture(scope="module")
def served(
    env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AgentClient, RunningWorker]]:
    """A worker process with the MCP server's tools, the fake chat model as its model."""
    directory = tmp_path_factory.mktemp("hostile")
    fake = ChatCompletionsServer(brain=brain)
    listed = {"tools": MCP_TOOLS, "structured": {"fetch": {"code": "a" * 60}}}
    config = mcp_config(directory, listed)
    environ = worker_environ(env, directory, fake)
    try:
        with worker_process(environ, "worker.py", "--mcp-config", str(config)) as worker:
            try:
                yield AgentClient(env.client, task_queue=environ["AGENT_TASK_QUEUE"]), worker
            finally:
                stopped(worker)
    finally:
        fake.close()


def stopped(worker: RunningWorker) -> float:
    """SIGTERM, and the seconds until the worker had gone (a frozen one is killed)."""
    started = time.monotonic()
    worker.process.send_signal(signal.SIGTERM)
    try:
        worker.process.wait(GRACEFUL_S + 10)
    except subprocess.TimeoutExpired:
        worker.process.kill()
        raise AssertionError("the worker did not stop on SIGTERM") from None
    return time.monotonic() - started


async def test_turns_whose_output_type_would_backtrack_end_invalid_output_while_others_answer(
    served: tuple[AgentClient, RunningWorker],
) -> None:
    agents, _ = served
    started = time.monotonic()
    typed = [
        await agents.start(q, output_type=OutputSpec(name="Codes", json_schema=schema))
        for q, (schema, _) in OUTPUT_TYPES.items()
    ]
    plain = await agents.start("Hello")
    async with asyncio.timeout(120):  # the worker, frozen, would answer none of them
        answered = await plain.result()
        results = await asyncio.gather(*(t.result() for t in typed))
    assert answered.outcome is Outcome.ANSWERED and answered.answer == "Hello from the model."
    assert time.monotonic() - started < 60
    for result in results:
        assert result.outcome is Outcome.INVALID_OUTPUT, result.answer
        assert "match" in result.answer and result.output is None


async def test_an_mcp_servers_patterns_refuse_hostile_values_at_once_and_the_worker_serves(
    served: tuple[AgentClient, RunningWorker],
) -> None:
    agents, worker = served
    # The calls the worker refuses go at once; the two it sends, one after the other: the
    # server takes one call at a time, and on a loaded machine one sent beside the other
    # can wait past its turn (`mcp.TURN_WAIT_S`) and not be sent, as designed.
    sent = [q for q, (_, _, says) in MCP_CALLS.items() if "match" not in says]
    refused = [q for q in MCP_CALLS if q not in sent]
    async with asyncio.timeout(180):  # the worker, frozen, would answer none of them
        answers = dict(zip(refused, await asyncio.gather(*map(agents.ask, refused)), strict=True))
        for question in sent:
            answers[question] = await agents.ask(question)
        after = await agents.ask("Hello")
    results = [answers[q] for q in MCP_CALLS]
    for (question, (_, _, says)), result in zip(MCP_CALLS.items(), results, strict=True):
        assert result.outcome is Outcome.ANSWERED, (question, result.answer)
        assert says in result.answer, (question, result.answer)
    assert after.answer == "Hello from the model."
    # The tools with look-around were left out as the worker started, in one line (and
    # so again each time the server's list is read: after its connection was renewed).
    lines = list(worker.lines)
    ready = next(n for n, line in enumerate(lines) if "worker ready" in line)
    said = [line for line in lines[:ready] if "left out" in line]
    assert len(said) == 1 and "left out 2 tool(s)" in said[0], lines[:ready]
    assert "'ahead' (tool evil__ahead: its JSON schema's pattern '^(?!0)" in said[0]
    assert "'behind' (tool evil__behind: its output schema: its JSON schema's pattern" in said[0]


def flood(messages: list[Message], tools: list[ToolSpec]) -> Reply:
    """A model that calls the tool with values that would backtrack, 32 a reply, always."""
    calls = [
        ToolCall(id=f"c{n}", name="evil__code0", arguments={"code": "a" * (60 + n) + "!"})
        for n in range(32)
    ]
    return Reply(calls=calls)


async def test_a_worker_checking_such_values_stops_on_sigterm_within_its_graceful_timeout(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    fake = ChatCompletionsServer(brain=flood)
    config = mcp_config(tmp_path, {"tools": MCP_TOOLS[:1]})
    environ = worker_environ(env, tmp_path, fake)
    agents = AgentClient(env.client, task_queue=environ["AGENT_TASK_QUEUE"])
    try:
        with worker_process(environ, "worker.py", "--mcp-config", str(config)) as worker:
            try:
                for n in range(3):
                    await agents.start(f"Look up code {n}")
                # The model has been told of values refused: the worker has checked
                # some, and checks more (every reply brings 32).
                async with asyncio.timeout(90):
                    while "does not match" not in json.dumps(fake.accepted[1:]):
                        await asyncio.sleep(0.05)
                took = await asyncio.to_thread(stopped, worker)
            finally:
                if worker.process.poll() is None:  # frozen: never left running
                    worker.process.kill()
    finally:
        fake.close()
    assert worker.process.returncode == 0, "".join(worker.lines)
    assert took < GRACEFUL_S + 5, took
