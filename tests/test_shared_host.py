"""Safe defaults on a shared host: the commands as a person runs them with no server
named (no TEMPORAL_* variable, no temporal.toml), through real processes and real dev
servers. Each folder gets its own server and its commands find it by the address it
recorded; a server nobody named, at Temporal's default address or on a recorded port
taken since, is never joined; the process that started a server warns before it stops
it under others."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    DescribeWorkerDeploymentRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.runtime.server import (
    DEFAULT_PORT,
    EmbeddedServer,
    free_port,
    is_free,
    is_listening,
)

BIN = Path(sys.executable).parent

SHELF = """
    from pydantic import BaseModel, Field
    from durable_agent import Agent, ToolContext, tool

    class Isbn(BaseModel):
        isbn: str = Field(pattern=r"^\\d{{13}}$", description="the book's ISBN (13 digits)")

    @tool(examples=["How much is the book 9780141187761?"], quick=True)
    def book_price(args: Isbn, ctx: ToolContext[None]) -> str:
        \"\"\"Price of one book, by its ISBN.\"\"\"
        return "Price: {price}. Isbn: " + args.isbn + "."

    agent = Agent(name="{name}", tools=[book_price])
"""
QUESTION = "How much is the book 9780141187761?"


def folder_with_agent(tmp_path: Path, name: str, price: str) -> Path:
    """A person's project folder holding an agent of its own (`shelf:agent`)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "shelf.py").write_text(textwrap.dedent(SHELF.format(name=name, price=price)))
    return folder


@pytest.fixture
def bare(tmp_path: Path) -> dict[str, str]:
    """An environment that names no server: no TEMPORAL_* variable, no AGENT_* setting,
    and a home with no temporal.toml."""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    }
    return env | {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "PYTHONUNBUFFERED": "1",
    }


class Running:
    """A long-running command, its stdout and stderr read all along (a full pipe never
    blocks it; a failure shows what it said)."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            into.append(line.rstrip("\n"))

    def said(self) -> str:
        return "\n".join(self.out + ["-- stderr --"] + self.err)[-4000:]

    def wait_for(self, text: str, timeout: float = 120) -> str:
        """The first line of stdout with `text`, once printed."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.out if text in line]
            if found:
                return found[0]
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.said()}"
            assert time.monotonic() < deadline, f"no {text!r} yet: {self.said()}"
            time.sleep(0.1)

    def stop(self) -> int:
        """SIGTERM, and the exit code once it has gone (SIGKILL after a minute)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for reader in self.readers:
            reader.join(10)
        return self.proc.returncode


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        r.stop()


def worker(cwd: Path, env: dict[str, str], *args: str) -> Running:
    return Running([str(BIN / "durable-agent-worker"), *args], cwd, env)


def command(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "durable-agent"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def address_in(ready: str) -> str:
    """The address a worker's ready line names: `(embedded server 127.0.0.1:41517)`."""
    found = re.search(r"\((?:embedded server|this folder's server) (\S+)\)", ready)
    assert found, ready
    return found.group(1)


def recorded(folder: Path) -> dict[str, object]:
    return dict(json.loads((folder / ".durable-agent" / "server.json").read_text()))


def test_two_folders_each_get_their_own_server_and_keep_their_turns(
    tmp_path: Path, bare: dict[str, str], running: list[Running]
) -> None:
    """Two projects on one machine, each serving its agent on the default task queue
    with no server named: each worker starts a server of its own, each folder's
    commands reach their own, and neither's turns reach the other's worker."""
    alpha = folder_with_agent(tmp_path, "alpha", "$9.99")
    beta = folder_with_agent(tmp_path, "beta", "$5.55")
    running += [worker(alpha, bare, "--agent", "shelf:agent")]
    running += [worker(beta, bare, "--agent", "shelf:agent")]
    ready = [w.wait_for("worker ready") for w in running]
    ui = [w.wait_for("Web UI: ") for w in running]
    addresses = [address_in(line) for line in ready]
    assert all("(embedded server " in line and "'agent-turns'" in line for line in ready)
    assert addresses[0] != addresses[1]
    assert f"127.0.0.1:{DEFAULT_PORT}" not in addresses
    assert [recorded(alpha)["address"], recorded(beta)["address"]] == addresses
    # The Web UI moved with the server: the link names the recorded UI port.
    assert ui[0].startswith(f"Web UI: http://localhost:{recorded(alpha)['ui_port']}/")

    # Each folder's command finds its folder's server by the recorded address.
    asked = {}
    for folder, price in ((alpha, "$9.99"), (beta, "$5.55")):
        out = command(folder, bare, "ask", "--agent", folder.name, QUESTION)
        assert out.returncode == 0, out.stdout + out.stderr
        assert (
            f"Price: {price}" in out.stdout and f"agent: {folder.name} (fingerprint" in out.stdout
        )
        asked[folder] = re.search(r"^workflow: (\S+)", out.stdout, re.M).group(1)  # type: ignore[union-attr]
    # Beta's agent is not served on alpha's server, though both serve `agent-turns`.
    crossed = command(alpha, bare, "ask", "--agent", "beta", QUESTION)
    assert crossed.returncode == 3 and "answer (unknown_agent)" in crossed.stdout, crossed.stdout
    for folder, other in ((alpha, beta), (beta, alpha)):
        listed = command(folder, bare, "list").stdout
        assert asked[folder] in listed and asked[other] not in listed, listed

    # Alone on its server, a stopping worker has nothing to warn of.
    assert running[0].stop() == 0, running[0].said()
    assert not [line for line in running[0].err if line.startswith("warning:")], running[0].said()
    assert not is_listening("127.0.0.1", int(addresses[0].rsplit(":", 1)[1]))


def test_a_stale_record_is_never_a_stranger_joined(
    tmp_path: Path, bare: dict[str, str], running: list[Running]
) -> None:
    """The folder's record names a server that has stopped, then a port another
    Temporal server has taken since: a command says so in one line; a worker starts
    the folder's server anew elsewhere, says why, and leaves the stranger untouched."""
    folder = folder_with_agent(tmp_path, "gamma", "$7.77")
    state = folder / ".durable-agent"
    state.mkdir()
    gone = f"127.0.0.1:{free_port()}"
    record = {"address": gone, "ui_port": free_port(), "cluster_id": "a-server-long-gone"}
    (state / "server.json").write_text(json.dumps(record))
    out = command(folder, bare, "ask", QUESTION)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: no Temporal server runs for this folder: the one ")
    assert f"({gone}) has stopped" in out.stderr

    stranger = EmbeddedServer(tmp_path / "stranger.db", port=free_port(), ui_port=free_port())
    stranger.start()
    try:
        taken = stranger.address
        (state / "server.json").write_text(json.dumps(record | {"address": taken}))
        out = command(folder, bare, "ask", QUESTION)
        assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
        assert f"{taken}, recorded in {state}, is now another server's" in out.stderr

        running.append(worker(folder, bare, "--agent", "shelf:agent"))
        own = address_in(running[0].wait_for("worker ready"))
        note = running[0].wait_for("note: ")
        assert own != taken and recorded(folder)["address"] == own
        assert f"{taken}, where this folder's Temporal server was, is now another" in note
        asked = command(folder, bare, "ask", QUESTION)
        assert asked.returncode == 0 and "Price: $7.77" in asked.stdout, asked.stderr
        asyncio.run(untouched(taken, "agent-turns"))
    finally:
        stranger.stop()


async def untouched(address: str, task_queue: str) -> None:
    """No worker of ours ever polled the server at `address`: no deployment for
    `task_queue` exists there, and no workflow ran on it."""
    client = await Client.connect(address)
    with pytest.raises(RPCError) as raised:
        await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace="default", deployment_name=task_queue)
        )
    assert raised.value.status == RPCStatusCode.NOT_FOUND
    assert (await client.count_workflows(f"TaskQueue = '{task_queue}'")).count == 0


def test_a_server_at_the_default_address_is_not_joined(
    tmp_path: Path, bare: dict[str, str], running: list[Running]
) -> None:
    """Someone's server on localhost:7233, which Temporal's tools reach by default: a
    worker with no server named starts its folder's own instead, says what it did not
    join and how to name it, and neither polls that server nor makes a version current
    there. (When 7233 is taken already, that listener is the stranger.)"""
    folder = folder_with_agent(tmp_path, "delta", "$3.33")
    queue = f"shared-host-{uuid.uuid4().hex[:8]}"  # never a deployment of the stranger's
    env = bare | {"AGENT_TASK_QUEUE": queue}
    stranger = None
    if is_free(DEFAULT_PORT):
        stranger = EmbeddedServer(tmp_path / "default.db", port=DEFAULT_PORT, ui_port=free_port())
        stranger.start()
    try:
        running.append(worker(folder, env, "--agent", "shelf:agent"))
        own = address_in(running[0].wait_for("worker ready"))
        note = running[0].wait_for("note: ")
        assert own != f"127.0.0.1:{DEFAULT_PORT}"
        assert f"a Temporal server listens on localhost:{DEFAULT_PORT}" in note
        assert f"TEMPORAL_ADDRESS=localhost:{DEFAULT_PORT} uses it" in note
        asked = command(folder, env, "ask", QUESTION)
        assert asked.returncode == 0 and "Price: $3.33" in asked.stdout, asked.stderr
        if stranger is not None:
            asyncio.run(untouched(stranger.address, queue))
    finally:
        if stranger is not None:
            stranger.stop()


def test_the_owner_warns_before_it_stops_a_server_others_use(
    tmp_path: Path, bare: dict[str, str], running: list[Running]
) -> None:
    """A second worker of the folder (another task queue) uses the server the first
    one started, and a turn waits there for consent: the first one, stopped, says so
    in one line on stderr before it takes the server with it."""
    folder = tmp_path / "epsilon"
    folder.mkdir()
    running.append(worker(folder, bare))
    owner_ready = running[0].wait_for("worker ready")
    running.append(worker(folder, bare | {"AGENT_TASK_QUEUE": "epsilon-other"}))
    guest_ready = running[1].wait_for("worker ready")
    address = address_in(owner_ready)
    assert "(embedded server " in owner_ready
    assert f"(this folder's server {address})" in guest_ready
    started = command(
        folder, bare, "ask", "--no-wait", "Please start a return for 123456: too small"
    )
    assert started.returncode == 0, started.stderr
    waiting = command(folder, bare, "pending")
    deadline = time.monotonic() + 60
    while started.stdout.strip() not in waiting.stdout:  # the write waits for consent
        assert time.monotonic() < deadline, waiting.stdout + waiting.stderr
        time.sleep(0.3)
        waiting = command(folder, bare, "pending")
    asyncio.run(in_use(address, "epsilon-other"))

    assert running[0].stop() == 0, running[0].said()
    warnings = [line for line in running[0].err if line.startswith("warning:")]
    assert len(warnings) == 1, running[0].said()
    assert warnings[0].startswith(
        f"warning: stopping the Temporal server this process started ({address}) while "
    )
    assert "1 worker of other programs polls it (task queue epsilon-other)" in warnings[0]
    assert "1 workflow runs on it" in warnings[0]


async def in_use(address: str, task_queue: str, timeout: float = 60) -> None:
    """Until the server at `address` shows what the owner is to see: a worker polling
    `task_queue`, and a running workflow (visibility lags a start a little)."""
    client = await Client.connect(address)
    deadline = time.monotonic() + timeout
    while True:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(namespace="default", task_queue=TaskQueue(name=task_queue))
        )
        running = await client.count_workflows("ExecutionStatus = 'Running'")
        if described.pollers and running.count:
            return
        assert time.monotonic() < deadline, f"pollers {described.pollers}, {running.count} running"
        await asyncio.sleep(0.2)
