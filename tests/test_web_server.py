"""The web chat's server refuses what it should not serve, on every address it
listens on: other host names (DNS rebinding), bodies too large to read, JSON too
deep to parse; and it will not listen beyond loopback unless told which host
names it answers to (it has no login). Its page speaks in the words of the agent
that answers on its task queue, never another's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent
from durable_agent.chat import ConversationInput
from durable_agent.commands.worker import build_worker
from durable_agent.errors import AgentClientError
from durable_agent.frontends.web.app import MAX_BODY_BYTES, create_app
from durable_agent.frontends.web.server import serve
from durable_agent.runtime.server import Connection, free_port, is_listening
from durable_agent.settings import Settings
from tests.conftest import Harness


@asynccontextmanager
async def chat_server(env: WorkflowEnvironment, host: str, **limits: Any) -> AsyncIterator[str]:
    """The chat on `host` and a free port (with `limits`: request_timeout,
    max_connections); its base URL."""
    port = free_port()
    conn = Connection(client=env.client, ui_url="http://localhost:8233")
    chat = ConversationInput(customer_id="demo")
    serving = asyncio.create_task(serve(conn, chat, host=host, port=port, task_queue="q", **limits))
    shown = f"[{host}]" if ":" in host else host
    probe = "127.0.0.1" if host == "0.0.0.0" else host
    while not is_listening(probe, port):
        assert not serving.done(), serving
        await asyncio.sleep(0.05)
    try:
        yield f"http://{shown}:{port}"
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1"])
async def test_the_host_check_holds_on_every_loopback_address(
    env: WorkflowEnvironment, host: str
) -> None:
    async with chat_server(env, host) as url, httpx.AsyncClient() as http:
        port = url.rsplit(":", 1)[1]
        ok = await http.get(f"{url}/api/session")
        assert ok.status_code == 200 and ok.json()["customer_id"] == "demo"
        for rebound in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            refused = await http.get(f"{url}/api/session", headers={"Host": rebound})
            assert refused.status_code == 400, rebound
            assert "host name" in refused.json()["error"]


async def test_beyond_loopback_it_needs_the_host_names_it_answers_to(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_WEB_HOSTS", raising=False)
    conn = Connection(client=env.client, ui_url="http://localhost:8233")
    with pytest.raises(AgentClientError, match="AGENT_WEB_HOSTS"):
        await serve(conn, None, host="0.0.0.0", port=free_port(), task_queue="q")

    monkeypatch.setenv("AGENT_WEB_HOSTS", "chat.example.com")
    async with chat_server(env, "0.0.0.0") as url, httpx.AsyncClient() as http:
        local = url.replace("0.0.0.0", "127.0.0.1")
        named = await http.get(f"{local}/api/session", headers={"Host": "chat.example.com"})
        assert named.status_code == 200
        assert (await http.get(f"{local}/api/session")).status_code == 400


async def test_bodies_too_large_or_too_deep_are_refused_before_they_are_used(
    env: WorkflowEnvironment,
) -> None:
    async with chat_server(env, "127.0.0.1") as url, httpx.AsyncClient() as http:
        headers = {"Content-Type": "application/json"}
        big = json.dumps({"text": "x" * (MAX_BODY_BYTES + 1)})
        response = await http.post(f"{url}/api/chats", content=big, headers=headers)
        assert response.status_code == 413

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: read, and stopped
            for _ in range(MAX_BODY_BYTES // 1024 + 2):
                yield b" " * 1024

        response = await http.post(f"{url}/api/chats", content=chunks(), headers=headers)
        assert response.status_code == 413

        long_headers = {f"X-Filler-{n}": "x" * 1000 for n in range(20)}  # over 16 KiB
        response = await http.post(f"{url}/api/chats", content="{}", headers=long_headers)
        assert response.status_code == 431

        deep = "[" * 20_000 + "]" * 20_000
        response = await http.post(f"{url}/api/chats", content=deep, headers=headers)
        assert response.status_code == 400 and "nested too deeply" in response.json()["error"]

        for bad in (
            "",
            "[]",
            '{"text": 5}',
            "\x00",
            '{"text": "  "}',
            '{"text": "%s"}' % ("x" * 4001),
        ):
            response = await http.post(f"{url}/api/chats", content=bad, headers=headers)
            assert response.status_code == 400, bad
            response = await http.post(
                f"{url}/api/chats/chat-demo-0a/messages", content=bad, headers=headers
            )
            assert response.status_code == 400, bad

        assert (await http.get(f"{url}/api/session")).status_code == 200  # still well


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host.strip("[]"), int(port)), timeout=10)


async def until_closed(sock: socket.socket, within: float) -> bytes:
    """What the server sends until it closes the connection; fails if it is still
    open after `within` seconds."""

    def read() -> bytes:
        sock.settimeout(within)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(4096):
                got += chunk
        return got

    started = time.monotonic()
    try:
        got = await asyncio.to_thread(read)
    except TimeoutError:
        raise AssertionError(f"still open after {within:g} s") from None
    assert time.monotonic() - started < within, "still open"
    return got


HEAD = (
    b"POST /api/chats HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n"
)


@pytest.mark.parametrize(
    ("sent", "trickle"),
    [
        pytest.param(b"", b"", id="nothing"),
        pytest.param(HEAD[:30], b"a", id="half-the-headers"),
        pytest.param(HEAD + b"{", b" ", id="one-byte-of-the-body"),
    ],
)
async def test_a_request_has_a_deadline_whatever_its_pace(
    env: WorkflowEnvironment, sent: bytes, trickle: bytes
) -> None:
    """A request must arrive whole within the deadline, counted from the moment the
    connection is ready for it: a peer that sends nothing, stops halfway, or sends a
    byte now and then (each well within the deadline) is answered 408 and closed."""
    async with chat_server(env, "127.0.0.1", request_timeout=1.0) as url:
        with connect(url) as sock:
            started = time.monotonic()
            sock.sendall(sent)
            reading = asyncio.ensure_future(until_closed(sock, 10))
            while trickle and not reading.done() and time.monotonic() - started < 6:
                await asyncio.sleep(0.3)
                with contextlib.suppress(OSError):  # closed by the server meanwhile
                    sock.sendall(trickle)
            answer = await reading
            assert time.monotonic() - started < 4, "the trickle kept the connection open"
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        assert b"did not arrive whole within 1 s" in answer
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url}/api/session")).status_code == 200  # still well


async def test_a_body_length_told_twice_is_refused(env: WorkflowEnvironment) -> None:
    async with chat_server(env, "127.0.0.1") as url:
        for lengths in (
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            b"Content-Length: 5\r\nContent-Length: 6\r\n",
        ):
            with connect(url) as sock:
                sock.sendall(
                    b"POST /api/chats HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\n" + lengths + b"\r\n{}"
                )
                answer = await until_closed(sock, 5)
            assert answer.startswith(b"HTTP/1.1 400 "), (lengths, answer[:80])


async def test_connections_beyond_the_limit_are_turned_away(env: WorkflowEnvironment) -> None:
    async with chat_server(env, "127.0.0.1", max_connections=4) as url:
        idle = [connect(url) for _ in range(4)]
        try:
            deadline = time.monotonic() + 20
            while True:  # the server takes the idle connections as its loop gets to them
                with connect(url) as sock:
                    sock.sendall(
                        b"GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                    )
                    answer = await until_closed(sock, 10)
                if answer.startswith(b"HTTP/1.1 503 "):
                    break
                assert time.monotonic() < deadline, "never turned away"
                await asyncio.sleep(0.05)
            assert b"too many connections" in answer
        finally:
            for sock in idle:
                sock.close()
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + 20
            while (await http.get(f"{url}/api/session")).status_code != 200:
                assert time.monotonic() < deadline, "still turned away after the others left"
                await asyncio.sleep(0.05)


BOOKSTORE = Agent(
    name="bookstore",
    title="The Bookstore",
    description="book prices and holds",
    examples=["How much is the book 9780141187761?"],
)


async def shown_card(harness: Harness, task_queue: str, agent: str = "") -> dict:
    """What the page is told about the agent, by a chat that names `agent` (or none)."""
    app = create_app(
        Connection(client=harness.client, ui_url=None),
        ConversationInput(agent=agent),
        task_queue=task_queue,
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        response = await http.get("/api/session")
    assert response.status_code == 200, response.text
    return dict(response.json()["agent"])


async def test_the_page_speaks_in_the_words_of_the_agent_that_answers(harness: Harness) -> None:
    """A chat started with no agent's definition (`web` with no --agent, beside a worker
    of another agent) reads the agent from the current version of its task queue."""
    versioned = replace(Settings.from_env(), versioning=True, promote="always")
    task_queue = f"card-{uuid.uuid4().hex[:6]}"
    async with build_worker(harness.client, task_queue, agents=[BOOKSTORE], settings=versioned):
        first = await shown_card(harness, task_queue)
        named = await shown_card(harness, task_queue, "bookstore")
        other = await shown_card(harness, task_queue, "helpdesk")
    assert (
        first
        == named
        == {
            "name": "bookstore",
            "title": "The Bookstore",
            "description": "book prices and holds",
            "examples": ["How much is the book 9780141187761?"],
        }
    )
    # An agent it does not serve: its name, and nobody else's words.
    assert other == {"name": "helpdesk", "title": "helpdesk", "description": "", "examples": []}

    # Workers without versions say nothing of their agents: a neutral page.
    async with harness.worker(agents=[BOOKSTORE]) as unversioned:
        assert await shown_card(harness, unversioned) == {
            "name": "",
            "title": "Assistant",
            "description": "",
            "examples": [],
        }
