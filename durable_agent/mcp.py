"""MCP tool servers as an agent's tools (Model Context Protocol, through the official
`mcp` SDK: `pip install -e ".[mcp]"`).

    servers = load_config("mcp.json")     # {"mcpServers": {"NAME": {...}, ...}}
    agent = Agent(name="desk", mcp_servers=servers, ...)
    python worker.py --agent desk:agent --mcp-config mcp.json

A server entry is the one other MCP clients read: `command`, `args`, `env` (and
`cwd`) for a server the worker starts over stdio, or `url` and `headers` for one
it reaches over Streamable HTTP; besides, `optional` (a server that cannot start
is left out with a warning rather than stopping the worker), `timeout` (seconds per
call, default 30), `attempts` (how often a read is tried, default 3; a write is
never sent again by itself) and `prefix` (the tools' name prefix, default the
server's name).

What runs where: the worker connects to every server as it starts (a stdio server
is a process of the worker, for as long as it runs), lists its tools and offers
them as `<prefix>__<tool>`; a server that cannot start or answer stops the worker
with one line naming it. Each call is a `dispatch` like any tool's, visible in the
Web UI and the trace. A server that dies is started again (stdio) or reconnected
(HTTP) at the next call.

Tools are pinned per turn: the list is read again between turns — at the start of
the next turn after the server said it changed (`notifications/tools/list_changed`)
or after it was started again — and a turn is offered, validated against and
dispatched with the list it started with (`LiveTools`; the turn records its
version, the agent's fingerprint, and what each server listed for it), so a list
that changes mid-turn never changes a running turn, whichever worker runs its next
step (`activities/_tools.py`).

What the runtime promises for writes: a tool whose annotations do not say
`readOnlyHint` (or say `destructiveHint`) is a write, and needs a person's consent
like any write. An MCP server takes no idempotency key, so a write whose attempt
may have reached the server and then failed (a timeout, a lost connection, a worker
that died mid-call) is never sent again by itself: it raises `OutcomeUnknown`, and the
turn asks a person whether to send it again (declined, the model reads so). Reads are
retried as usual. A result with `isError` is a failed observation the model reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_agent.errors import AgentDefinitionError, OutcomeUnknown, ToolError, ToolUnavailable
from durable_agent.tools import Tool, ToolContext, ToolRegistry, schema_tool

if TYPE_CHECKING:
    from durable_agent.agents import Agent

log = logging.getLogger("durable_agent.mcp")

SEPARATOR = "__"
"""Between a server's prefix and its tool's name: `time__get_current_time`."""
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KNOWN_KEYS = {
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "optional",
    "timeout",
    "attempts",
    "prefix",
}
DEFAULT_TIMEOUT = timedelta(seconds=30)
DEFAULT_ATTEMPTS = 3
"""How often a read is tried (each attempt after a dead connection goes on a fresh one)."""
MAX_ATTEMPTS = 20
WRITE_ATTEMPTS = 3
"""A write's activity attempts: only the first sends it; a later one (its worker died,
it timed out) finds the outcome unknown and the turn asks (`_caller`). So `attempts`
does not apply to writes, and a write needs more than one attempt for that question."""
START_TIMEOUT_S = 30.0
"""How long a server gets to start and list its tools."""


class MCPConfigError(AgentDefinitionError):
    """The MCP configuration, or a server it names, cannot work; the message says which
    server and what to fix."""


@dataclass(frozen=True)
class MCPServer:
    """One MCP server, as an entry of the usual `mcpServers` file describes it."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    optional: bool = False
    timeout: timedelta = DEFAULT_TIMEOUT
    attempts: int = DEFAULT_ATTEMPTS
    """How often a read is tried on transient trouble (a dead server, a timeout)."""
    prefix: str = ""

    def __post_init__(self) -> None:
        where = f"MCP server {self.name!r}"
        if not _NAME.fullmatch(self.name):
            raise MCPConfigError(f"{where}: a name is 1-64 letters, digits, _ or -")
        if bool(self.command) == bool(self.url):
            raise MCPConfigError(f"{where}: give either a command (stdio) or a url (HTTP)")
        if self.url and not re.match(r"https?://", self.url):
            raise MCPConfigError(f"{where}: url {self.url!r} is not http:// or https://")
        if self.prefix and not _NAME.fullmatch(self.prefix):
            raise MCPConfigError(f"{where}: prefix is 1-64 letters, digits, _ or -")
        if not timedelta(0) < self.timeout <= timedelta(hours=1):
            raise MCPConfigError(f"{where}: timeout is seconds, more than 0, at most 3600")
        if not 1 <= self.attempts <= MAX_ATTEMPTS:
            raise MCPConfigError(
                f"{where}: attempts is how often a read is tried, 1 to {MAX_ATTEMPTS} "
                "(a write is sent once in any case)"
            )

    @property
    def tool_prefix(self) -> str:
        return self.prefix or self.name

    @classmethod
    def from_entry(cls, name: str, entry: Any) -> MCPServer:
        where = f"MCP server {name!r}"
        if not isinstance(entry, dict):
            raise MCPConfigError(f"{where}: its entry is not an object")
        unknown = sorted(set(entry) - _KNOWN_KEYS)
        if unknown:
            raise MCPConfigError(
                f"{where}: unknown key {unknown[0]!r} (known: command, args, "
                "env, cwd, url, headers, optional, timeout, attempts, prefix)"
            )

        def strings(key: str) -> dict[str, str]:
            value = entry.get(key, {})
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise MCPConfigError(f"{where}: {key} is an object of strings")
            return value

        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise MCPConfigError(f"{where}: args is a list of strings")
        for key in ("command", "url", "prefix", "cwd"):
            if key in entry and not isinstance(entry[key], str):
                raise MCPConfigError(f"{where}: {key} is a string")
        timeout = entry.get("timeout", DEFAULT_TIMEOUT.total_seconds())
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise MCPConfigError(f"{where}: timeout is a number of seconds")
        attempts = entry.get("attempts", DEFAULT_ATTEMPTS)
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise MCPConfigError(f"{where}: attempts is a whole number (how often a read is tried)")
        if not isinstance(entry.get("optional", False), bool):
            raise MCPConfigError(f"{where}: optional is true or false")
        return cls(
            name=name,
            command=entry.get("command", ""),
            args=tuple(args),
            env=strings("env"),
            cwd=entry.get("cwd"),
            url=entry.get("url", ""),
            headers=strings("headers"),
            optional=entry.get("optional", False),
            timeout=timedelta(seconds=timeout) if timeout == timeout else timedelta(0),
            attempts=attempts,
            prefix=entry.get("prefix", ""),
        )


def load_config(path: str | Path) -> list[MCPServer]:
    """The servers of an `mcpServers` file; MCPConfigError, in one line, if it is not one."""
    try:
        raw = json.loads(Path(path).read_text(), object_pairs_hook=_unique_keys)
    except OSError as e:
        raise MCPConfigError(f"--mcp-config {path}: {e.strerror or e}") from None
    except _KeyTwice as e:
        raise MCPConfigError(f"--mcp-config {path}: {e}") from None
    except ValueError as e:
        raise MCPConfigError(f"--mcp-config {path}: not JSON ({e})") from None
    servers = raw.get("mcpServers") if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        raise MCPConfigError(f'--mcp-config {path}: expected {{"mcpServers": {{"NAME": ...}}}}')
    return [MCPServer.from_entry(name, entry) for name, entry in servers.items()]


class _KeyTwice(Exception):
    """A JSON object of the config with one key twice (JSON keeps the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            # Which server, or which key of an entry: either way, one of them is lost.
            raise _KeyTwice(
                f"{key!r} appears twice in one object (JSON would keep only the last): "
                "rename or remove one"
            )
        seen[key] = value
    return seen


class Connection:
    """One server, connected for as long as the worker runs. The transport lives in a
    task of its own (the SDK's transports must be closed by the task that opened
    them), so any activity may call through it, and a dead one is started again."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self._session: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()
        self.listed: list[Any] = []
        """The server's tools as last listed (`mcp.types.Tool`)."""
        self.stale = True
        """The list may have changed since: the server said so, or was started again."""

    async def open(self) -> list[Any]:
        """Connect and list the server's tools (`mcp.types.Tool`)."""
        await self._connect()
        return await self.tools()

    async def tools(self) -> list[Any]:
        """The server's tools: listed again if they may have changed, after starting the
        server again (or reconnecting) if it died. A server that cannot answer keeps
        its last list (the calls will say what is wrong)."""
        if not self.stale and self.alive:
            return self.listed
        try:
            async with self._lock:
                if not self.alive:
                    await self.close()
                    await self._connect()
                self.stale = False
                self.listed = await self._list()
        except Exception as e:
            self.stale = True
            log.warning("MCP server %s: could not list its tools: %s", self.server.name, _brief(e))
            if not self.listed:
                raise
        return self.listed

    async def _list(self) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        while True:
            from mcp.types import PaginatedRequestParams

            params = PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await asyncio.wait_for(self._session.list_tools(params=params), START_TIMEOUT_S)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    @property
    def alive(self) -> bool:
        return self._session is not None and self._owner is not None and not self._owner.done()

    async def _connect(self) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._owner = asyncio.create_task(self._run(ready), name=f"mcp:{self.server.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            await self.close()
            raise MCPConfigError(
                f"MCP server {self.server.name!r}: no answer within {START_TIMEOUT_S:g} s"
            ) from None

    async def _heard(self, message: Any) -> None:
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self.stale = True  # listed again before the next turn starts

    async def _run(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        ended = asyncio.Event()
        try:
            async with (
                self._transport() as (read, write),
                ClientSession(_Watched(read, ended), write, message_handler=self._heard) as session,
            ):
                await session.initialize()
                self._session = session
                self.stale = True  # a server started again may offer other tools
                ready.set_result(None)
                # Until the worker stops, or the server goes (its process died, the
                # connection dropped): then the next turn or call starts it again.
                stop, gone = (
                    asyncio.ensure_future(self._stop.wait()),
                    asyncio.ensure_future(ended.wait()),
                )
                try:
                    await asyncio.wait([stop, gone], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                    gone.cancel()
                if ended.is_set() and not self._stop.is_set():
                    log.warning(
                        "MCP server %s: it went away; started again when next needed",
                        self.server.name,
                    )
        except BaseException as e:  # noqa: BLE001 - reported to whoever waits
            if not ready.done():
                ready.set_exception(_start_error(self.server, e))
            elif not isinstance(e, asyncio.CancelledError):
                log.warning("MCP server %s: connection lost: %s", self.server.name, _brief(e))
        finally:
            self._session = None

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        server = self.server
        if server.command:
            import os

            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(
                command=server.command,
                args=list(server.args),
                env={**os.environ, **server.env},
                cwd=server.cwd,
            )
            return stdio_client(params)
        return _http(server)

    async def call(self, name: str, arguments: dict[str, Any], *, write: bool) -> Any:
        """The server's `CallToolResult`. A dead connection is opened again first; a
        write that fails once sent is never sent again (ToolError: outcome unknown)."""
        for fresh in (False, True):
            session = await self._session_now(fresh)
            try:
                return await asyncio.wait_for(
                    session.call_tool(name, arguments), self.server.timeout.total_seconds()
                )
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if _answered(e):
                    # The server said no (an unknown tool, bad arguments): the outcome
                    # is known, and the model reads it.
                    raise ToolError(f"{name} failed: {_brief(e)}") from None
                if write:
                    raise _unknown(self.server, name, _brief(e)) from None
                # The server may have died (a stdio process killed, a connection
                # dropped): a read goes again, once, on a fresh connection.
                failure = e
        raise ToolUnavailable(
            f"MCP server {self.server.name!r} failed: {_brief(failure)}; try again"
        ) from None

    async def _session_now(self, fresh: bool) -> Any:
        async with self._lock:
            if fresh or not self.alive:
                await self.close()
                try:
                    await self._connect()
                except MCPConfigError as e:
                    raise ToolUnavailable(str(e)) from None
            return self._session

    async def close(self) -> None:
        self._stop.set()
        owner, self._owner = self._owner, None
        if owner is not None:
            try:
                await asyncio.wait_for(owner, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                owner.cancel()
                await asyncio.gather(owner, return_exceptions=True)


def _answered(e: Exception) -> bool:
    """Whether the error is the server refusing the call before running it (an unknown
    tool, bad arguments): an answer the model reads, not a lost or failed one. Errors
    that stand for HTTP trouble (a session the server no longer knows, a 5xx) are not."""
    from mcp.shared.exceptions import MCPError
    from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND

    return isinstance(e, MCPError) and e.code in (INVALID_PARAMS, METHOD_NOT_FOUND)


class _Watched:
    """A transport's read stream that says when it ends (the server's process died, its
    connection dropped), so the connection knows before its next call or turn."""

    def __init__(self, stream: Any, ended: asyncio.Event) -> None:
        self._stream = stream
        self._ended = ended

    async def __aenter__(self) -> _Watched:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        self._ended.set()
        return await self._stream.__aexit__(*exc)

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._stream.__anext__()
        except BaseException:
            self._ended.set()
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _unknown(server: MCPServer, tool: str, why: str) -> OutcomeUnknown:
    """A write that reached (or may have reached) the server and whose answer was lost:
    not sent again unless a person says so (the turn asks)."""
    return OutcomeUnknown(
        f"the outcome of {tool} is unknown: the call may have reached MCP server "
        f"{server.name!r} before {why}; it was not sent again, since doing it twice could "
        "change things twice"
    )


@contextlib.asynccontextmanager
async def _http(server: MCPServer) -> AsyncIterator[Any]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers=dict(server.headers), timeout=30.0) as http,
        streamable_http_client(server.url, http_client=http) as streams,
    ):
        yield streams[0], streams[1]


def _start_error(server: MCPServer, e: BaseException) -> MCPConfigError:
    if server.command:
        how = f"{server.command} {' '.join(server.args)}".strip()
        return MCPConfigError(f"MCP server {server.name!r} ({how}) did not start: {_brief(e)}")
    return MCPConfigError(f"MCP server {server.name!r} ({server.url}) did not answer: {_brief(e)}")


def _brief(e: BaseException) -> str:
    while getattr(e, "exceptions", None):  # an exception group: its first
        e = e.exceptions[0]  # type: ignore[attr-defined]
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


def tools_of(connection: Connection, listed: Sequence[Any]) -> list[Tool]:
    """The server's tools as this project's tools: `<prefix>__<name>`, their own JSON
    schemas; reads (`readOnlyHint`, not `destructiveHint`) as quick reads; the rest as
    writes, which need consent."""
    server = connection.server
    made = []
    for listed_tool in listed:
        name = f"{server.tool_prefix}{SEPARATOR}{listed_tool.name}"
        if not _NAME.fullmatch(name):
            raise MCPConfigError(
                f"MCP server {server.name!r}: tool {listed_tool.name!r} makes the name {name!r}, "
                "which a model cannot call (1-64 letters, digits, _ or -): set a shorter prefix"
            )
        hints = listed_tool.annotations
        read_only = bool(hints and hints.read_only_hint) and not bool(
            hints and hints.destructive_hint
        )
        made.append(
            schema_tool(
                name,
                (listed_tool.description or listed_tool.title or listed_tool.name).strip(),
                dict(listed_tool.input_schema or {"type": "object", "properties": {}}),
                _caller(connection, listed_tool.name, write=not read_only),
                side_effects=not read_only,
                quick=read_only,
                timeout=server.timeout + timedelta(seconds=5),
                max_attempts=server.attempts if read_only else WRITE_ATTEMPTS,
            )
        )
    return made


def _caller(connection: Connection, tool: str, *, write: bool) -> Any:
    async def call(arguments: dict[str, Any], ctx: ToolContext[Any]) -> str:
        from temporalio import activity

        if write and activity.in_activity() and activity.info().attempt > 1:
            # The earlier attempt may have reached the server (it timed out, or its
            # worker died mid-call): a server with no idempotency key may run it twice.
            raise _unknown(connection.server, tool, "the attempt that sent it ended")
        result = await connection.call(tool, arguments, write=write)
        text = render(result)
        if getattr(result, "is_error", False):
            raise ToolError(f"{tool} failed: {text}")
        return text

    return call


def render(result: Any) -> str:
    """A `CallToolResult` as the text the model reads: its text blocks, then its
    structured content as JSON, and a note for what is neither."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None):
            parts.append(block.resource.text)
        elif kind == "resource_link":
            parts.append(f"(a resource: {block.uri})")
        else:
            parts.append(f"({kind or 'an item'} the model cannot read)")
    structured = getattr(result, "structured_content", None)
    if structured is not None and not any(_is_json_of(part, structured) for part in parts):
        # Servers often send the structured content as a text block as well: once.
        parts.append(json.dumps(structured, ensure_ascii=False, sort_keys=True))
    return "\n".join(parts) or "(no content)"


class LiveTools(ToolRegistry):
    """An agent's own tools and those its MCP servers offer, as listed at one moment: a
    version that never changes once made. `refresh()` makes the next version when a
    server's list changed; the worker keeps the versions its running turns started
    with (`ServedAgent.tools_at`)."""

    def __init__(
        self,
        agent: str,
        own: Sequence[Tool],
        connections: Sequence[Connection],
        listed: Sequence[Sequence[Any]] | None = None,
    ) -> None:
        self.agent = agent
        self.own = list(own)
        self.connections = list(connections)
        self.listed = (
            [list(c.listed) for c in self.connections]
            if listed is None
            else [list(tools) for tools in listed]
        )
        """What each server listed for this version (default: as last listed)."""
        super().__init__()
        pairs = zip(self.connections, self.listed, strict=True)
        made = (t for connection, tools in pairs for t in tools_of(connection, tools))
        for tool in [*self.own, *made]:
            if tool.name in self.tools:
                raise MCPConfigError(
                    f"agent {agent!r}: two tools are named {tool.name!r} (an MCP "
                    "server's and another's): give one of the servers its own prefix"
                )
            self.add(tool)

    def recorded(self) -> dict[str, list[dict[str, Any]]]:
        """What each server listed for this version, as a turn records it (by server
        name: each tool's name, title, description, input schema and hints)."""
        return {
            c.server.name: [_recorded(tool) for tool in tools]
            for c, tools in zip(self.connections, self.listed, strict=True)
            if tools
        }

    def recall(self, recorded: Mapping[str, Sequence[Mapping[str, Any]]]) -> LiveTools | None:
        """The version a turn recorded (`recorded()`), served by this worker's
        connections; None if it names a server this worker does not have, or cannot
        be served (a name taken twice)."""
        from mcp.types import Tool as Listed

        by_name = {c.server.name for c in self.connections}
        if not set(recorded) <= by_name:
            return None
        try:
            listed = [
                [Listed.model_validate(t) for t in recorded.get(c.server.name, ())]
                for c in self.connections
            ]
            return LiveTools(self.agent, self.own, self.connections, listed)
        except (MCPConfigError, ValueError, TypeError) as e:
            log.warning("agent %s: a recorded version cannot be served: %s", self.agent, e)
            return None

    async def refresh(self) -> LiveTools | None:
        """The next version if a server's list changed since this one, else None. A new
        list that cannot be served (a name taken twice) is left out, with a warning."""
        listed = [
            list(tools) for tools in await asyncio.gather(*(c.tools() for c in self.connections))
        ]
        if listed == self.listed:
            return None
        try:
            return LiveTools(self.agent, self.own, self.connections)
        except MCPConfigError as e:
            log.warning("%s; the tools stay as they were", e)
            return None


def _recorded(tool: Any) -> dict[str, Any]:
    """A listed tool (`mcp.types.Tool`) as a turn records it: what its spec and its
    kind (read or write) are made of, in the protocol's own field names."""
    made: dict[str, Any] = {"name": tool.name, "inputSchema": tool.input_schema}
    for key, value in (("title", tool.title), ("description", tool.description)):
        if value:
            made[key] = value
    hints = tool.annotations
    kept = {
        "readOnlyHint": hints.read_only_hint if hints else None,
        "destructiveHint": hints.destructive_hint if hints else None,
    }
    if any(v is not None for v in kept.values()):
        made["annotations"] = {k: v for k, v in kept.items() if v is not None}
    return made


def _is_json_of(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False


@contextlib.asynccontextmanager
async def connected(
    agents: Sequence[Agent], servers: Sequence[MCPServer] = ()
) -> AsyncIterator[list[Agent]]:
    """The agents with the tools of their MCP servers (their own `mcp_servers`, and
    `servers` for every agent), connected for as long as the block runs. A server that
    cannot start stops it with MCPConfigError (an optional one is left out, with a
    warning); so does a tool name used twice."""
    wanted: dict[str, MCPServer] = {}
    for server in [*servers, *(s for a in agents for s in a.mcp_servers)]:
        if wanted.get(server.name, server) != server:
            raise MCPConfigError(f"two MCP servers are named {server.name!r}: rename one")
        wanted[server.name] = server
    if not wanted:
        yield list(agents)
        return
    connections: dict[str, Connection] = {}
    try:
        for name, server in wanted.items():
            connection = Connection(server)
            try:
                await connection.open()
            except MCPConfigError:
                await connection.close()
                if not server.optional:
                    raise
                log.warning("MCP server %s is optional and did not start: left out", name)
                continue
            connections[name] = connection
        served = []
        for agent in agents:
            names = [s.name for s in servers] + [s.name for s in agent.mcp_servers]
            mine = [connections[n] for n in dict.fromkeys(names) if n in connections]
            tools = LiveTools(agent.name, list(agent.registry.tools.values()), mine)
            served.append(dataclasses.replace(agent, tools=tools, mcp_servers=()))
        yield served
    finally:
        for connection in connections.values():
            await connection.close()
