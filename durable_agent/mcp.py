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
server's name), `elicitation` (whether the server may ask the person a turn serves
for input during a call, default true) and `elicitation_timeout` (seconds a turn
waits for that answer before the server gets `cancel`; default: the agent's approval
timeout) and `sampling` (whether the server may ask the agent's model for a message
during a call: `ask`, the default, `allow` or `deny`; `durable_agent.sampling`).

What runs where: the worker connects to every server as it starts (a stdio server
is a process of the worker, for as long as it runs), lists its tools and offers
them as `<prefix>__<tool>`; a server that cannot start or answer stops the worker
with one line naming it. Each call is a `dispatch` like any tool's, visible in the
Web UI and the trace. A server that dies is started again (stdio) or reconnected
(HTTP) at the next call.

What a server cannot do to the worker: a list is read within a time, a number of
pages, a number of tools and a size (`MAX_PAGES`, `MAX_TOOLS`, `MAX_LIST_BYTES`; past
one, the server's list is refused in one line naming it); a tool it lists that no
model could call (a schema that is not one, or with a pattern no linear-time engine
takes: `durable_agent.schemas`; a name a model API refuses, a name listed twice) is
left out with a warning; a list read again between turns that fails keeps
the tools as they were; lines on a stdio server's stdout that are not MCP messages
are dropped, and counted in one log line a minute at most.

Tools are pinned per turn: the list is read again between turns — at the start of
the next turn after the server said it changed (`notifications/tools/list_changed`)
or after it was started again — and a turn is offered, validated against and
dispatched with the list it started with (`LiveTools`; the turn records its
version, the agent's fingerprint, and the hash of what each server listed for it,
the lists themselves kept in the tool-list store, `durable_agent/runtime/tool_lists.py`),
so a list that changes mid-turn never changes a running turn, whichever worker runs
its next step (`activities/_tools.py`).

What the runtime promises for writes: a tool whose annotations do not say
`readOnlyHint` (or say `destructiveHint`) is a write, and needs a person's consent
like any write. An MCP server takes no idempotency key, so a write whose attempt
may have reached the server and then failed (a timeout, a lost connection, a worker
that died mid-call) is never sent again by itself: it raises `OutcomeUnknown`, and the
turn asks a person whether to send it again (declined, the model reads so). Reads are
retried as usual. A result with `isError` is a failed observation the model reads.

Elicitation (`durable_agent.elicitation`): a server's `elicitation/create` during a
call is answered from the answers the turn recorded for that call; with none, the
server's request gets an error, the call ends with the question, the turn waits for a
person's answer (workflow state: it survives a worker's death), then sends the call
again, and the server's same question now gets the answer. So the server runs the
call again: elicitation suits tools that are safe to ask again (a write keeps its
consent and its no-second-send rule). MCP does not say which call a server's request
belongs to (not over stdio), so a server that may elicit (or sample) takes one call
at a time from a worker; `"elicitation": false` (with `"sampling": "deny"`) lets calls
overlap again. Switched off, the client declares no elicitation capability (the SDK
answers a server that asks anyway with the error "Elicitation not supported"). An
accepted form's fields left out take the schema's defaults before the server gets it
(`elicitation.filled`). A program with its person at hand, not a turn, may answer
within the call instead (`Connection.call(..., ask=...)`: the conformance client,
tests/conformance/client.py).

Sampling (`durable_agent.sampling`) goes the same way: a server's
`sampling/createMessage` is answered from the replies the turn recorded for the call;
with none, the call ends with the request, the turn serves it with the agent's model
(or refuses it) and sends the call again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_agent import elicitation, sampling, schemas
from durable_agent.elicitation import NeedsAnswer
from durable_agent.errors import (
    AgentDefinitionError,
    InvalidAnswer,
    OutcomeUnknown,
    ToolError,
    ToolUnavailable,
    UnusableQuestion,
)
from durable_agent.runtime.tool_lists import list_hash
from durable_agent.sampling import NeedsSampling, UnusableSampling
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
    "elicitation",
    "elicitation_timeout",
    "sampling",
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
"""How long a server gets to start (a process spawned, or a connection, initialized)."""
LIST_TIMEOUT_S = 30.0
"""How long a server started gets to list its tools, every page."""
RELIST_TIMEOUT_S = 3.0
"""How long a turn's first step (the `shield` local activity, 10 s) waits for a list
read again between turns: past it, that turn has the tools as they were, and the list,
once read, is a later turn's."""
RELIST_PAUSE_S = 60.0
"""After a list read again failed, how long the turns keep the tools as they were
before it is tried again (a server that hangs does not slow every turn)."""
MAX_PAGES = 50
"""Pages of one `tools/list`: a cursor that never ends is refused past it."""
MAX_TOOLS = 200
"""Tools of one server: more is a list no model chooses well from (OpenAI takes 128
tools a request)."""
MAX_LIST_BYTES = 256 * 1024
"""What one server's list may weigh (names, descriptions, schemas, as the tool-list
store keeps it): every model call of a turn carries the specs, and every worker
keeps each version in memory. A turn's history holds only the list's hash."""
MAX_OFFERED_BYTES = 1024 * 1024
"""What all of an agent's servers' lists may weigh together: what a model call
carries of them."""
TURN_WAIT_S = 4.0
"""How long a call waits for its turn on a server that may elicit (one call at a time):
a dispatch's timeout is the server's `timeout` plus 5 s, so the wait and the call fit
in it, and a call that waited too long was never sent (a write is not left unknown)."""
STRAY_LOG_INTERVAL_S = 60.0
"""At most one log line this often, per server, about stdout lines that are not MCP."""


class MCPConfigError(AgentDefinitionError):
    """The MCP configuration, or a server it names, cannot work; the message says which
    server and what to fix."""


class MCPListError(MCPConfigError):
    """A server's tool list cannot be read, or is more than an agent can be offered (too
    many pages, tools or bytes); the message names the server."""


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
    elicitation: bool = True
    """The server may ask the person a turn serves for input during a call."""
    elicitation_timeout: timedelta | None = None
    """How long a turn waits for that answer (None: the agent's approval timeout)."""
    sampling: sampling.Policy = "ask"
    """Whether the server may ask the agent's model for a message during a call:
    `ask` (a person's consent, once per turn), `allow`, `deny`."""

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
        if self.sampling not in ("ask", "allow", "deny"):
            raise MCPConfigError(f"{where}: sampling is ask, allow or deny")
        wait = self.elicitation_timeout
        if wait is not None and not timedelta(0) < wait <= timedelta(days=30):
            raise MCPConfigError(
                f"{where}: elicitation_timeout is seconds, more than 0, at most 30 days"
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
                f"{where}: unknown key {unknown[0]!r} (known: command, args, env, cwd, "
                "url, headers, optional, timeout, attempts, prefix, elicitation, "
                "elicitation_timeout, sampling)"
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
        if not (math.isfinite(timeout) and 0 < timeout <= 3600):  # Infinity, NaN, 1e308
            raise MCPConfigError(f"{where}: timeout is seconds, more than 0, at most 3600")
        attempts = entry.get("attempts", DEFAULT_ATTEMPTS)
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise MCPConfigError(f"{where}: attempts is a whole number (how often a read is tried)")
        for key in ("optional", "elicitation"):
            if not isinstance(entry.get(key, False), bool):
                raise MCPConfigError(f"{where}: {key} is true or false")
        wait = entry.get("elicitation_timeout")
        if wait is not None and (
            isinstance(wait, bool)
            or not isinstance(wait, int | float)
            or not (math.isfinite(wait) and 0 < wait <= 30 * 86400)
        ):
            raise MCPConfigError(
                f"{where}: elicitation_timeout is seconds, more than 0, at most 30 days"
            )
        return cls(
            name=name,
            command=entry.get("command", ""),
            args=tuple(args),
            env=strings("env"),
            cwd=entry.get("cwd"),
            url=entry.get("url", ""),
            headers=strings("headers"),
            optional=entry.get("optional", False),
            timeout=timedelta(seconds=timeout),
            attempts=attempts,
            prefix=entry.get("prefix", ""),
            elicitation=entry.get("elicitation", True),
            sampling=entry.get("sampling", "ask"),
            elicitation_timeout=None if wait is None else timedelta(seconds=wait),
        )


MAX_CONFIG_BYTES = 1024 * 1024
"""An `mcpServers` file is a few hundred bytes a server."""


def load_config(path: str | Path) -> list[MCPServer]:
    """The servers of an `mcpServers` file; MCPConfigError, in one line, if it is not one."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise MCPConfigError(
                f"--mcp-config {path}: over {MAX_CONFIG_BYTES // 2**20} MB; is it the right file?"
            )
        raw = json.loads(data, object_pairs_hook=_unique_keys)
    except OSError as e:
        raise MCPConfigError(f"--mcp-config {path}: {e.strerror or e}") from None
    except _KeyTwice as e:
        raise MCPConfigError(f"--mcp-config {path}: {e}") from None
    except RecursionError:
        raise MCPConfigError(
            f"--mcp-config {path}: nested too deeply to be an mcpServers file"
        ) from None
    except ValueError as e:
        raise MCPConfigError(f"--mcp-config {path}: not JSON ({_brief(e)})") from None
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
        """The server's tools as last listed (`mcp.types.Tool`), those a model can call."""
        self.stale = True
        """The list may have changed since: the server said so, or was started again."""
        self._quiet_until = 0.0
        """After a failed list: not tried again before this (`time.monotonic()`)."""
        self._relisting: asyncio.Task[None] | None = None
        self._slow: asyncio.Task[None] | None = None
        self._strays = 0
        self._strays_told = -math.inf
        self._calling = asyncio.Lock()
        """Held by a call while the server may elicit (`_elicit` must know whose it is)."""
        self._asking: _Asking | None = None
        """The call under way on a server that may elicit: its answers, its question."""

    async def open(self) -> list[Any]:
        """Connect and list the server's tools (`mcp.types.Tool`); MCPConfigError, in
        one line naming the server, if it cannot start or its list cannot be read."""
        await self._connect()
        self.stale = False  # a change said while it lists: listed again before a turn
        self.listed = await self._read_list()
        return self.listed

    async def tools(self) -> list[Any]:
        """The server's tools, between turns: listed again if they may have changed,
        after starting the server again (or reconnecting) if it died. It runs in a
        turn's first step, so it waits `RELIST_TIMEOUT_S` at most: a list not read by
        then is the next turn's, and this turn has the tools as they were. A list that
        fails leaves them as they were too (with a warning), and is not tried again
        for `RELIST_PAUSE_S`; the calls will say what is wrong."""
        if not self.stale and self.alive:
            return self.listed
        if time.monotonic() < self._quiet_until:
            return self.listed
        if self._relisting is None or self._relisting.done():
            self._relisting = asyncio.create_task(
                self._relist(), name=f"mcp-list:{self.server.name}"
            )
        relisting = self._relisting
        done, _ = await asyncio.wait({relisting}, timeout=RELIST_TIMEOUT_S)
        if not done and self._slow is not relisting:
            self._slow = relisting  # said once a listing
            log.warning(
                "MCP server %s: listing its tools again takes more than %g s; the turns "
                "have them as they were until it is done",
                self.server.name,
                RELIST_TIMEOUT_S,
            )
        return self.listed

    async def _relist(self) -> None:
        try:
            async with self._lock:
                if not self.alive:
                    await self._disconnect()
                    await self._connect()
                self.stale = False  # a change said while it lists: listed again after
                self.listed = await self._read_list()
        except Exception as e:
            self.stale = True
            self._quiet_until = time.monotonic() + RELIST_PAUSE_S
            log.warning(
                "%s; its tools stay as they were, listed again in %g s at the earliest",
                e
                if isinstance(e, MCPConfigError)
                else f"MCP server {self.server.name}: {_brief(e)}",
                RELIST_PAUSE_S,
            )

    async def _read_list(self) -> list[Any]:
        """The server's list within `LIST_TIMEOUT_S`; MCPListError naming it if not."""
        try:
            return await asyncio.wait_for(self._list(), LIST_TIMEOUT_S)
        except MCPConfigError:
            raise
        except asyncio.TimeoutError:
            raise MCPListError(
                f"MCP server {self.server.name!r}: its tools/list did not answer within "
                f"{LIST_TIMEOUT_S:g} s"
            ) from None
        except Exception as e:
            raise MCPListError(
                f"MCP server {self.server.name!r}: its tools/list failed: {_brief(e)}"
            ) from None

    async def _list(self) -> list[Any]:
        """Every page of the server's list, within `MAX_PAGES`, `MAX_TOOLS` and
        `MAX_LIST_BYTES` (MCPListError past one); then the tools a model can call."""
        from mcp.types import PaginatedRequestParams

        where = f"MCP server {self.server.name!r}"
        tools: list[Any] = []
        size = 0
        cursor = None
        for _ in range(MAX_PAGES):
            params = PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._session.list_tools(params=params)
            tools.extend(page.tools)
            if len(tools) > MAX_TOOLS:
                raise MCPListError(
                    f"{where}: it lists more than {MAX_TOOLS} tools, more than an agent is "
                    "offered of one server: have it offer fewer (most servers take a list "
                    "of the tools to offer)"
                )
            size += sum(_weight(t) for t in page.tools)
            if size > MAX_LIST_BYTES:
                raise MCPListError(
                    f"{where}: its tool list weighs more than {MAX_LIST_BYTES // 1024} KB "
                    "(names, descriptions, schemas), more than an agent is offered of one server: "
                    "have it offer fewer tools"
                )
            cursor = page.next_cursor
            if not cursor:
                return self._callable(tools)
        raise MCPListError(
            f"{where}: its tools/list goes on past {MAX_PAGES} pages (its next cursor never "
            "ends): fix the server, or leave it out"
        )

    def _callable(self, listed: list[Any]) -> list[Any]:
        """The listed tools a model can call; the others (a schema that is not one, a
        name a model API refuses, a name listed twice) left out with one warning."""
        kept: dict[str, Any] = {}
        left_out: list[str] = []
        for tool in listed:
            try:
                if tool.name in kept:
                    raise MCPConfigError("it is listed twice")
                tools_of(self, [tool])
            except (MCPConfigError, TypeError) as e:
                why = str(e).removeprefix(f"MCP server {self.server.name!r}: ")
                left_out.append(f"{tool.name[:80]!r} ({why[:200]})")
                continue
            kept[tool.name] = tool
        if left_out:
            log.warning(
                "MCP server %s: left out %d tool(s) a model cannot call: %s",
                self.server.name,
                len(left_out),
                "; ".join(left_out[:5]) + ("; …" if len(left_out) > 5 else ""),
            )
        return list(kept.values())

    def _stray(self, item: Exception) -> None:
        """A line on a stdio server's stdout that is not an MCP message (a print, a log
        line): dropped. One warning says so, then at most one a minute, with the count."""
        self._strays += 1
        now = time.monotonic()
        if now - self._strays_told < STRAY_LOG_INTERVAL_S:
            return
        errors = getattr(item, "errors", None)
        line = errors()[0].get("input") if callable(errors) and errors() else None
        shown = f", such as {str(line)[:80]!r}" if line is not None else ""
        log.warning(
            "MCP server %s: %d line(s) on its stdout that are not MCP messages, ignored%s; "
            "a stdio server writes its logs to stderr",
            self.server.name,
            self._strays,
            shown,
        )
        self._strays, self._strays_told = 0, now

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
            await self._disconnect()
            raise MCPConfigError(
                f"MCP server {self.server.name!r}: no answer within {START_TIMEOUT_S:g} s"
            ) from None

    async def _heard(self, message: Any) -> None:
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self.stale = True  # listed again before the next turn starts

    async def _run(self, ready: asyncio.Future[None]) -> None:
        ended = asyncio.Event()
        try:
            # Over stdio, what the transport cannot read as a message is a stray line.
            stray = self._stray if self.server.command else None
            async with (
                self._transport() as (read, write),
                _session_class()(
                    _Watched(read, ended, stray),
                    write,
                    message_handler=self._heard,
                    # None: the SDK declares no elicitation capability, and answers a
                    # server that asks anyway with "Elicitation not supported".
                    elicitation_callback=self._elicit if self.server.elicitation else None,
                    # Likewise: `deny` declares no sampling capability.
                    sampling_callback=self._sample if self._samples else None,
                ) as session,
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

            _quiet_parse_errors()

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

    async def _elicit(self, context: Any, params: Any) -> Any:
        """A server's `elicitation/create`: the recorded answer of the call under way,
        or (none yet) an error for the server while the call ends with the question."""
        from mcp.types import INVALID_REQUEST, ElicitResult, ErrorData

        asking = self._asking
        if asking is None:  # between calls: nobody to ask
            return ErrorData(code=INVALID_REQUEST, message="no tool call is under way")
        try:
            question = elicitation.question_of(
                self.server.name, params, _seconds(self.server.elicitation_timeout)
            )
        except UnusableQuestion as e:
            asking.unusable = e
            return ErrorData(code=INVALID_REQUEST, message=str(e))
        answer = asking.answers.get(question.digest)
        if answer is None and asking.ask is not None:
            answer = await asking.ask(question)
        if answer is not None:
            content = elicitation.filled(question, answer.action, answer.content)
            try:  # checked by the client already; a server never gets one that breaks it
                elicitation.check_answer(question, answer.action, content)
            except InvalidAnswer as e:
                asking.unusable = UnusableQuestion(f"the answer was not sent: {e}")
                return ErrorData(code=INVALID_REQUEST, message="the answer was refused")
            return ElicitResult(action=answer.action, content=content)
        asking.question = asking.question or question
        # The call ends with the question: the turn asks the person and sends the call
        # again, and this same request then gets the recorded answer.
        return ErrorData(
            code=INVALID_REQUEST,
            message="the person has not answered yet: the client asks and calls again",
        )

    @property
    def _samples(self) -> bool:
        """The server may ask the agent's model (with consent or without)."""
        return self.server.sampling != "deny"

    async def _sample(self, context: Any, params: Any) -> Any:
        """A server's `sampling/createMessage`: the recorded reply of the call under way
        (the model's message, or the one line saying why not), an error for a request
        the model does not serve, or (no reply yet) an error while the call ends with
        the request."""
        from mcp.types import INVALID_REQUEST, CreateMessageResult, ErrorData, TextContent

        asking = self._asking
        if asking is None:  # between calls: no turn to ask
            return ErrorData(code=INVALID_REQUEST, message="no tool call is under way")
        try:
            request = sampling.request_of(self.server.name, params, self.server.sampling)
        except UnusableSampling as e:
            return ErrorData(code=INVALID_REQUEST, message=str(e))
        reply = asking.replies.get(request.digest)
        if reply is not None:
            if reply.refused:
                return ErrorData(code=INVALID_REQUEST, message=reply.refused)
            return CreateMessageResult(
                role="assistant",
                content=TextContent(type="text", text=reply.text),
                model=reply.model,
                stop_reason=reply.stop_reason or None,
            )
        asking.sample = asking.sample or request
        # The call ends with the request: the turn serves it and sends the call again,
        # and this same request then gets the recorded reply.
        return ErrorData(
            code=INVALID_REQUEST,
            message="the model has not been asked yet: the client asks it and calls again",
        )

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        write: bool,
        ask: Ask | None = None,
    ) -> Any:
        """The server's `CallToolResult`. A dead connection is opened again first; a
        write that fails once sent is never sent again (ToolError: outcome unknown).
        On a server that may elicit or sample, one call at a time: a question it asks
        ends the call with `NeedsAnswer` unless the call's recorded answers answer it
        (or `ask` does, while the call waits: for a program that has its person at
        hand; a turn never does, since its person may answer in days); a request for
        the model, with `NeedsSampling` unless a recorded reply does."""
        if not (self.server.elicitation or self._samples):
            return await self._call(name, arguments, write=write)
        try:
            await asyncio.wait_for(self._calling.acquire(), TURN_WAIT_S)
        except asyncio.TimeoutError:
            busy = (
                f"MCP server {self.server.name!r} is busy with another call (it takes one at "
                f"a time, since it may ask the person a question); {name} was not sent"
            )
            # A read is tried again (with backoff); a write's failure is the model's to read.
            raise (ToolError(busy + ": try again") if write else ToolUnavailable(busy)) from None
        try:
            asking = self._asking = _Asking(
                elicitation.ANSWERS.get() or {}, sampling.REPLIES.get() or {}, ask
            )
            try:
                result = await self._call(name, arguments, write=write)
            except ToolError:
                if asking.question is None and asking.unusable is None and not asking.sample:
                    raise
                result = None
            finally:
                self._asking = None
            if asking.unusable is not None:
                raise asking.unusable
            if asking.question is not None:
                raise NeedsAnswer(asking.question)
            if asking.sample is not None:
                raise NeedsSampling(asking.sample)
            return result
        finally:
            self._calling.release()

    async def _call(self, name: str, arguments: dict[str, Any], *, write: bool) -> Any:
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
                await self._disconnect()
                try:
                    await self._connect()
                except MCPConfigError as e:
                    raise ToolUnavailable(str(e)) from None
            return self._session

    async def close(self) -> None:
        """Disconnect for good (the worker stops)."""
        if self._relisting is not None:
            self._relisting.cancel()
            await asyncio.gather(self._relisting, return_exceptions=True)
        await self._disconnect()

    async def _disconnect(self) -> None:
        self._stop.set()
        owner, self._owner = self._owner, None
        if owner is not None:
            try:
                await asyncio.wait_for(owner, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                owner.cancel()
                await asyncio.gather(owner, return_exceptions=True)


Ask = Callable[[elicitation.Question], Awaitable[elicitation.Answer | None]]
"""Answers a server's question while its call waits (`Connection.call`); None: no
answer now, and the call ends with the question."""


@dataclass
class _Asking:
    """A call under way on a server that may elicit or sample."""

    answers: Mapping[str, elicitation.Answer]
    replies: Mapping[str, sampling.Reply]
    ask: Ask | None = None
    question: elicitation.Question | None = None
    """The first question the turn has no answer to yet."""
    unusable: UnusableQuestion | None = None
    sample: sampling.Request | None = None
    """The first sampling request the turn has no reply to yet."""


def _seconds(d: timedelta | None) -> float | None:
    return None if d is None else d.total_seconds()


def _answered(e: Exception) -> bool:
    """Whether the error is the server refusing the call before running it (an unknown
    tool, bad arguments): an answer the model reads, not a lost or failed one. Errors
    that stand for HTTP trouble (a session the server no longer knows, a 5xx) are not."""
    from mcp.shared.exceptions import MCPError
    from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND

    return isinstance(e, MCPError) and e.code in (INVALID_PARAMS, METHOD_NOT_FOUND)


class _Watched:
    """A transport's read stream that says when it ends (the server's process died, its
    connection dropped), so the connection knows before its next call or turn; and, with
    `stray`, hands it what the transport could not read as a message instead of the
    session."""

    def __init__(
        self,
        stream: Any,
        ended: asyncio.Event,
        stray: Callable[[Exception], None] | None = None,
    ) -> None:
        self._stream = stream
        self._ended = ended
        self._strayed = stray

    async def __aenter__(self) -> _Watched:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        self._ended.set()
        return await self._stream.__aexit__(*exc)

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        while True:
            try:
                item = await self._stream.__anext__()
            except BaseException:
                self._ended.set()
                raise
            if self._strayed is None or not isinstance(item, Exception):
                return item
            self._strayed(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _NotMCPLines(logging.Filter):
    """Drops the SDK's traceback for each stdout line of a stdio server that is not an
    MCP message: `Connection._stray` counts them, and says so once a minute at most."""

    MESSAGE = "Failed to parse JSONRPC message from server"

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != self.MESSAGE


def _quiet_parse_errors() -> None:
    sdk = logging.getLogger("mcp.client.stdio")
    if not any(isinstance(f, _NotMCPLines) for f in sdk.filters):
        sdk.addFilter(_NotMCPLines())


def _weight(tool: Any) -> int:
    """Bytes of a listed tool as the tool-list store keeps it (`_recorded`)."""
    return len(json.dumps(_recorded(tool), ensure_ascii=False).encode())


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
        if listed_tool.output_schema is not None:
            try:  # the SDK checks each result's structured content against it
                schemas.validator(listed_tool.output_schema)
            except schemas.UnusableSchema as e:
                raise TypeError(f"tool {name}: its output schema: {e}") from None
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


@functools.cache
def _session_class() -> Any:
    """The SDK's `ClientSession`, whose check of a result's structured content against
    its tool's output schema uses `durable_agent.schemas` (patterns on a linear-time
    engine, within a budget, no remote `$ref`): the SDK's own `jsonschema` validator
    runs a server's patterns on Python's backtracking `re`, where one result could hold
    the worker for hours."""
    from mcp import ClientSession

    class Session(ClientSession):
        def _output_schema_validator(self, name: str, output_schema: dict[str, Any]) -> Any:
            try:
                return schemas.validator(output_schema)
            except schemas.UnusableSchema as e:  # listed since: its tool is left out
                raise RuntimeError(f"Invalid schema for tool {name}: {e}") from None

    return Session


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
        prefixes: Sequence[str] = (),
    ) -> None:
        self.agent = agent
        self.own = list(own)
        self.connections = list(connections)
        self.prefixes = tuple(
            dict.fromkeys([*prefixes, *(c.server.tool_prefix for c in connections)])
        )
        """The tool-name prefixes of the agent's MCP servers, those left out included: an
        approval setting may name their tools (`time__get_current_time`, `time__*`)
        whether or not they are listed now."""
        self.listed = (
            [list(c.listed) for c in self.connections]
            if listed is None
            else [list(tools) for tools in listed]
        )
        """What each server listed for this version (default: as last listed)."""
        super().__init__()
        self._recorded: dict[str, list[dict[str, Any]]] | None = None
        self._hashes: dict[str, str] | None = None
        weight = sum(_weight(t) for tools in self.listed for t in tools)
        if weight > MAX_OFFERED_BYTES:
            raise MCPConfigError(
                f"agent {agent!r}: its MCP servers' tool lists weigh {weight // 1024} KB "
                f"together, more than a model call carries ({MAX_OFFERED_BYTES // 1024} KB): "
                "leave a server out, or have them offer fewer tools"
            )
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
        """What each server listed for this version, as the tool-list store keeps it
        (by server name: each tool's name, title, description, input schema and
        hints). Made once: a version never changes."""
        if self._recorded is None:
            self._recorded = {
                c.server.name: [_recorded(tool) for tool in tools]
                for c, tools in zip(self.connections, self.listed, strict=True)
                if tools
            }
        return self._recorded

    def hashes(self) -> dict[str, str]:
        """The hash of each server's list (`recorded()`), as a turn records it."""
        if self._hashes is None:
            self._hashes = {name: list_hash(tools) for name, tools in self.recorded().items()}
        return self._hashes

    def recall(self, recorded: Mapping[str, Sequence[Mapping[str, Any]]]) -> LiveTools | None:
        """The version whose lists are `recorded` (as `recorded()` gives them), served
        by this worker's connections; None if it names a server this worker does not
        have, or cannot be served (a name taken twice)."""
        from mcp.types import Tool as Listed

        by_name = {c.server.name for c in self.connections}
        if not set(recorded) <= by_name:
            return None
        try:
            listed = [
                [Listed.model_validate(t) for t in recorded.get(c.server.name, ())]
                for c in self.connections
            ]
            return LiveTools(self.agent, self.own, self.connections, listed, self.prefixes)
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
            return LiveTools(self.agent, self.own, self.connections, prefixes=self.prefixes)
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


def _require_sdk() -> None:
    """The official `mcp` SDK, or one line saying why not: it is missing, or a module of
    the person's own named `mcp` (an `mcp.py` in the current folder) stands in its way."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("mcp")
        found = (spec.origin if spec else None) or "a module named mcp"
        import mcp
    except ImportError as e:
        raise MCPConfigError(
            f'MCP servers need the `mcp` SDK ({e}): pip install -e ".[mcp]"'
        ) from None
    except Exception as e:  # noqa: BLE001 - someone's own mcp.py, failing as it loads
        raise MCPConfigError(
            f"`import mcp` failed in {found} ({_brief(e)}): if that is a module of your "
            "own, rename it (it shadows the MCP SDK, `mcp`)"
        ) from None
    if not hasattr(mcp, "ClientSession"):
        raise MCPConfigError(
            f"`import mcp` finds {getattr(mcp, '__file__', None) or found}, not the MCP "
            "SDK: rename that module (it shadows the `mcp` package), or run from another "
            "folder"
        )


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
    _require_sdk()
    connections: dict[str, Connection] = {}
    try:
        for name, server in wanted.items():
            connection = Connection(server)
            try:
                await connection.open()
            except MCPConfigError as e:
                await connection.close()
                if not server.optional:
                    raise
                log.warning("%s; it is optional: left out", e)
                continue
            connections[name] = connection
        served = []
        for agent in agents:
            names = [s.name for s in servers] + [s.name for s in agent.mcp_servers]
            mine = [connections[n] for n in dict.fromkeys(names) if n in connections]
            prefixes = [wanted[n].tool_prefix for n in names]
            own = list(agent.registry.tools.values())
            tools = LiveTools(agent.name, own, mine, prefixes=prefixes)
            served.append(dataclasses.replace(agent, tools=tools, mcp_servers=()))
        yield served
    finally:
        for connection in connections.values():
            await connection.close()
