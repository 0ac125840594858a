"""The web chat's server refuses what it should not serve, on every address it
listens on: other host names (DNS rebinding), bodies too large to read, JSON too
deep to parse; and it will not listen beyond loopback unless told which host
names it answers to (it has no login). Its page speaks in the words of the agent
that answers on its task queue, never another's."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import socket
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import httpx
import jwt
import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent
from durable_agent.chat import ConversationInput
from durable_agent.client import AgentClient, TurnHandle
from durable_agent.commands.worker import build_worker
from durable_agent.errors import AgentClientError
from durable_agent.frontends.web import auth
from durable_agent.frontends.web.app import (
    MAX_BODY_BYTES,
    MAX_FILES_BYTES,
    MAX_MESSAGE_BYTES,
    create_app,
)
from durable_agent.frontends.web.server import MIN_BODY_BYTES_PER_S, serve
from durable_agent.memory import MemoryAccess, MemorySettings
from durable_agent.memory._store import state_file
from durable_agent.model import ModelRequest, Reply
from durable_agent.principal import Principal
from durable_agent.runtime import turns
from durable_agent.runtime.server import Connection, free_port, is_listening
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.stream import StepEvent
from durable_agent.types import StepKind, ToolCall, TurnInput
from tests.conftest import Harness


@asynccontextmanager
async def chat_server(
    env: WorkflowEnvironment,
    host: str,
    task_queue: str = "q",
    customer: str = "demo",
    **limits: Any,
) -> AsyncIterator[str]:
    """The chat of `customer` on `host` and a free port (with `limits`: request_timeout,
    max_connections; or the agent), for turns on `task_queue`; its base URL."""
    port = free_port()
    conn = Connection(client=env.client, ui_url="http://localhost:8233")
    chat = ConversationInput(customer_id=customer)
    serving = asyncio.create_task(
        serve(conn, chat, host=host, port=port, task_queue=task_queue, **limits)
    )
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
        # A message may carry files: its body may be larger than a decision's.
        big = json.dumps({"text": "x" * (MAX_MESSAGE_BYTES + 1)})
        response = await http.post(f"{url}/api/chats", content=big, headers=headers)
        assert response.status_code == 413
        decision = json.dumps({"call_id": "x" * (MAX_BODY_BYTES + 1), "approved": True})
        response = await http.post(
            f"{url}/api/turns/t-1/decisions", content=decision, headers=headers
        )
        assert response.status_code == 413

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: read, and stopped
            for _ in range(MAX_MESSAGE_BYTES // 65536 + 2):
                yield b" " * 65536

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


async def test_a_declared_body_gets_time_for_its_length_and_no_more(
    env: WorkflowEnvironment,
) -> None:
    """A body that says its length (a message with files) gets that length's time at
    MIN_BODY_BYTES_PER_S on top of the deadline: 256 KiB over about 2 s arrives (past
    the 1 s deadline), and the same length sent far slower is still cut off."""
    size = 4 * MIN_BODY_BYTES_PER_S  # 4 s more than the 1 s deadline
    head = (
        b"POST /api/chats HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {size}\r\n\r\n".encode()
    )
    async with chat_server(env, "127.0.0.1", request_timeout=1.0) as url:
        for pieces, pause, arrives in ((8, 0.25, True), (400, 0.05, False)):
            with connect(url) as sock:
                started = time.monotonic()
                sock.sendall(head)
                reading = asyncio.ensure_future(until_closed(sock, 15))
                for _ in range(pieces):
                    if reading.done():
                        break
                    await asyncio.sleep(pause)
                    with contextlib.suppress(OSError):  # closed by the server meanwhile
                        sock.sendall(b" " * (size // pieces))
                answer = await reading
            took = time.monotonic() - started
            if arrives:  # whole: the app read it (not JSON: 400), past the bare deadline
                assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]
                assert took > 1.5, took
            else:
                assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
                assert 4.5 < took < 9, took


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
    worker = build_worker(harness.client, task_queue, agents=[BOOKSTORE], settings=versioned)
    async with worker:
        # Once its version is current: a busy machine may take a while to get there.
        await asyncio.wait_for(worker.plugin.promoted.wait(), 60)
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


async def test_new_conversations_and_messages_are_limited_per_client(
    env: WorkflowEnvironment, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its rate, a client's new conversation or message is answered 429 with
    Retry-After, and starts nothing; X-Forwarded-For names nobody unless the request
    comes from a gateway named as trusted, and then only its rightmost hop counts (an
    IPv6 client by its /64)."""
    monkeypatch.setenv("AGENT_WEB_CHAT_RATE", "2/hour")
    monkeypatch.setenv("AGENT_WEB_MESSAGE_RATE", "3/hour")
    monkeypatch.delenv("AGENT_WEB_TRUSTED_PROXIES", raising=False)
    hi = {"text": "Has order 123456 shipped?"}
    async with (
        harness.worker() as task_queue,
        chat_server(env, "127.0.0.1", task_queue) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        started = [await http.post("/api/chats", json=hi) for _ in range(2)]
        assert [r.status_code for r in started] == [201, 201], started[-1].text
        chats_before = await _chats(harness)
        refused = await http.post("/api/chats", json=hi)
        spoofed = await http.post("/api/chats", json=hi, headers={"X-Forwarded-For": "192.0.2.1"})
        for response in (refused, spoofed):
            assert response.status_code == 429, response.text
            assert 1 <= int(response.headers["Retry-After"]) <= 1800
            assert "too many new conversations" in response.json()["error"]
            assert "at most 2 an hour" in response.json()["error"]
        assert await _chats(harness) == chats_before  # nothing started
        # Each new conversation's first message counted: one message is left.
        chat_id = started[0].json()["chat_id"]
        sent = await http.post(f"/api/chats/{chat_id}/messages", json={"text": "Thanks!"})
        assert sent.status_code == 202, sent.text
        again = await http.post(f"/api/chats/{chat_id}/messages", json={"text": "Thanks!"})
        assert again.status_code == 429 and "too many messages" in again.json()["error"]
        assert int(again.headers["Retry-After"]) >= 1
        # A request that would start nothing is refused for what it is.
        empty = await http.post(f"/api/chats/{chat_id}/messages", json={"text": " "})
        assert empty.status_code == 400

    monkeypatch.setenv("AGENT_WEB_CHAT_RATE", "1/hour")
    monkeypatch.setenv("AGENT_WEB_TRUSTED_PROXIES", "127.0.0.0/8")
    async with (
        harness.worker() as task_queue,
        chat_server(env, "127.0.0.1", task_queue) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):

        async def via_gateway(forwarded: str | None) -> int:
            headers = {"X-Forwarded-For": forwarded} if forwarded else {}
            return (await http.post("/api/chats", json=hi, headers=headers)).status_code

        assert await via_gateway("2001:db8::1") == 201
        assert await via_gateway("2001:db8::2") == 429  # the same /64
        assert await via_gateway("2001:db8:0:1::5, 2001:db8::3") == 429  # its own hop counts
        assert await via_gateway("203.0.113.9") == 201  # another client
        assert await via_gateway("203.0.113.9, 127.0.0.1") == 429  # through two gateways
        assert await via_gateway(None) == 201  # the gateway's own requests


async def _chats(harness: Harness) -> int:
    """Conversations of customer demo the server knows."""
    query = "WorkflowType = 'Conversation' AND WorkflowId STARTS_WITH 'chat-demo-'"
    return (await harness.client.count_workflows(query)).count


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("AGENT_WEB_CHAT_RATE", "lots", "AGENT_WEB_CHAT_RATE='lots': give a rate"),
        ("AGENT_WEB_MESSAGE_RATE", "0/minute", "AGENT_WEB_MESSAGE_RATE='0/minute'"),
        ("AGENT_WEB_TRUSTED_PROXIES", "gateway", "'gateway' is not an address or network"),
    ],
)
async def test_a_bad_rate_setting_is_one_line_before_the_chat_listens(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv(name, value)
    port = free_port()
    conn = Connection(client=env.client, ui_url=None)
    with pytest.raises(AgentClientError, match=re.escape(says)):
        await serve(conn, None, host="127.0.0.1", port=port, task_queue="q")
    assert not is_listening("127.0.0.1", port)


async def test_a_decision_reason_over_its_limit_is_a_bad_request(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """A reason over 500 characters is refused as the bad request it is (400), on a
    turn that waits for consent (which goes on waiting) as on one that has ended."""
    async with (
        harness.worker() as task_queue,
        chat_server(env, "127.0.0.1", task_queue) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        started = await http.post(
            "/api/chats",
            json={"text": "Please start a return for order 123456, the soap arrived damaged"},
        )
        assert started.status_code == 201, started.text
        turn = AgentClient(harness.client).turn(started.json()["turn_id"])
        call_id = await _awaiting_consent(turn)
        decisions = f"/api/turns/{turn.id}/decisions"
        for reason in ("x" * 501, "why " * 200):
            body = {"call_id": call_id, "approved": False, "reason": reason}
            refused = await http.post(decisions, json=body)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"].startswith("reason: "), refused.text
        assert [p.call.id for p in await turn.pending()] == [call_id]
        body = {"call_id": call_id, "approved": False, "reason": "not now"}
        assert (await http.post(decisions, json=body)).status_code == 200
        await turn.result()
        body["reason"] = "x" * 501
        ended = await http.post(decisions, json=body)
        assert ended.status_code == 400, ended.text


async def _awaiting_consent(turn: TurnHandle) -> str:
    """The id of the turn's first call to await consent, once it does."""
    async for streamed in turn.events():
        if isinstance(streamed.event, StepEvent) and streamed.event.step.kind is StepKind.APPROVAL:
            return streamed.event.step.calls[0].id
    raise AssertionError(f"turn {turn.id} ended without asking for consent")


async def test_a_fork_of_a_chat_turn_is_read_and_decided_by_its_own_id(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """A fork is in no conversation: its events are read by its id, headed by what it
    was forked from, and a call of its awaiting consent is decided by its id."""
    async with (
        harness.worker() as task_queue,
        chat_server(env, "127.0.0.1", task_queue) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        question = "Please start a return for order 123456, the soap arrived damaged"
        started = await http.post("/api/chats", json={"text": question})
        agents = AgentClient(harness.client, task_queue=task_queue)
        parent = agents.turn(started.json()["turn_id"])
        await parent.decide(await _awaiting_consent(parent), approved=False, by="test")
        await parent.result()
        # Declined, the write never ran: in the fork it is a new write, and waits.
        fork = await agents.rerun(parent.id, from_step=1)
        call_id = await _awaiting_consent(fork)
        body = {"call_id": call_id, "approved": False, "reason": "not now either"}
        decided = await http.post(f"/api/turns/{fork.id}/decisions", json=body)
        assert decided.status_code == 200, decided.text
        await fork.result()

        events = await _sse(http, f"/api/turns/{fork.id}/events")
        missing = await _sse(http, "/api/turns/turn-someone-9/events")
    (name, head), *rest = events
    assert name == "turn" and head["question"] == question
    assert head["origin"] == {
        "parent": parent.id,
        "step": 1,
        "replay": False,
        "line": f"fork of {parent.id} from step 1",
    }
    assert [n for n, _ in rest][-2:] == ["done", "ended"]
    assert any(
        n == "step" and e["step"]["text"] == "start_return: declined by web: not now either"
        for n, e in rest
    )
    assert missing == [("missing", {"message": "no turn turn-someone-9 of customer demo"})]


async def _sse(http: httpx.AsyncClient, path: str) -> list[tuple[str, Any]]:
    """The named events of a stream that ends by itself (keepalives and retries left out)."""
    events: list[tuple[str, Any]] = []
    async with http.stream("GET", path) as response:
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    return events


async def test_a_customers_chat_reaches_nothing_of_another_customer(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """The chat of `bob` neither reads, streams, decides nor writes into what is
    `bob-x`'s (their conversation, its turn awaiting consent; their ids began with
    `chat-bob-` once): each is answered as for an id that does not exist, and `bob-x`'s
    call still waits, their chat unchanged."""
    with sqlite3.connect(harness.store.path) as db:  # an order of bob-x's to return
        db.execute(
            "INSERT INTO orders VALUES (?,?,?,?,?,?,?,?)",
            ("777777", "bob-x", "Herbal Handsoap", 1, 999, "delivered", "2026-11-18", "2026-11-21"),
        )
    async with (
        harness.worker() as task_queue,
        chat_server(env, "127.0.0.1", task_queue, customer="bob") as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        agents = AgentClient(harness.client, task_queue=task_queue)
        theirs = agents.chat(customer="bob-x")
        question = "Please start a return for order 777777, the soap arrived damaged"
        turn = await theirs.start(question)
        call_id = await _awaiting_consent(turn)
        nowhere = f"chat-bob-{uuid.uuid4().hex[:8]}"
        tries = [(theirs.id, nowhere), (turn.id, f"{nowhere}-1")]
        for real, missing in tries:
            kind = "chats" if real == theirs.id else "turns"
            seen = await _sse(http, f"/api/{kind}/{real}/events")
            unseen = await _sse(http, f"/api/{kind}/{missing}/events")
            assert [n for n, _ in seen] == [n for n, _ in unseen] == ["missing"], seen
            told = seen[0][1]["message"].replace(real, "ID")
            assert told == unseen[0][1]["message"].replace(missing, "ID"), told
        body = {"call_id": call_id, "approved": True}
        said = [await http.post(f"/api/turns/{i}/decisions", json=body) for i in (turn.id, nowhere)]
        assert [r.status_code for r in said] == [404, 404], [r.text for r in said]
        assert said[0].json()["error"].replace(turn.id, "ID") == said[1].json()["error"].replace(
            nowhere, "ID"
        )
        text = {"text": "Approve it, please"}
        sent = [
            await http.post(f"/api/chats/{i}/messages", json=text) for i in (theirs.id, nowhere)
        ]
        assert [r.status_code for r in sent] == [410, 410], [r.text for r in sent]
        assert [p.call.id for p in await turn.pending()] == [call_id]
        state = await theirs.state()
        assert state.turns == 1
        own = await http.post("/api/chats", json={"text": "Has order 123456 shipped?"})
        assert own.status_code == 201, own.text
        await theirs.end()


async def test_a_message_carries_its_files_and_bad_ones_are_refused_in_one_line(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """A message's files reach its turn (the offline model answers from a text file)
    and its conversation's stream names them; a file that is not what its name says,
    data that is not base64, a malformed list or too many bytes are refused, one line
    each, and start nothing."""
    hours = b"Our returns desk is open until 6pm on weekdays."
    note = {"name": "hours.txt", "data": base64.b64encode(hours).decode()}
    async with (
        harness.worker() as task_queue,
        chat_server(env, "127.0.0.1", task_queue) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        question = "Until when is the returns desk open?"
        started = await http.post("/api/chats", json={"text": question, "files": [note]})
        assert started.status_code == 201, started.text
        chat_id, turn_id = started.json()["chat_id"], started.json()["turn_id"]
        agents = AgentClient(harness.client, task_queue=task_queue)
        result = await agents.turn(turn_id).result()
        assert result.answer == f"From hours.txt: {hours.decode()}"

        script = {"name": "photo.png", "data": base64.b64encode(b"#!/bin/sh\nexit 0\n").decode()}
        for files, status, said in (
            ([script], 422, "photo.png"),
            ([{"name": "a.txt", "data": "not base64!"}], 400, "file 1: its data is not base64"),
            ([{"name": "a.txt"}], 400, "file 1: give its name and data"),
            ("hours.txt", 400, "files: a list of at most"),
            ([{"name": "big.txt", "data": _b64(MAX_FILES_BYTES + 1)}], 413, "are at most"),
        ):
            sent = await http.post(
                f"/api/chats/{chat_id}/messages", json={"text": "And this?", "files": files}
            )
            assert sent.status_code == status, sent.text
            error = sent.json()["error"]
            assert said in error and "\n" not in error, error
        await agents.conversation(chat_id).end()  # its stream ends: read it whole
        named = [
            data
            for name, data in await _sse(http, f"/api/chats/{chat_id}/events")
            if name == "turn"
        ]
        assert [t["files"] for t in named] == [["hours.txt"]]  # the refused ones started nothing


def _b64(size: int) -> str:
    return base64.b64encode(b"x" * size).decode()


SECRET = "a-shared-secret-of-at-least-32-bytes"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg"><script>parent.document.title="owned"</script></svg>'
)


def _bearer(user: str, tenant: str = "acme") -> dict[str, str]:
    claims = {"sub": user, "tenant": tenant, "exp": time.time() + 300}
    return {"Authorization": f"Bearer {jwt.encode(claims, SECRET, algorithm='HS256')}"}


async def test_a_turns_files_are_served_to_its_asker_only_and_run_nothing(
    env: WorkflowEnvironment, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message's files come back to its asker by the turn's id and their place, as
    the type sniffed when attached: an image shown in place, anything else saved, never
    sniffed again, under a policy that runs nothing (an SVG with a script is served as
    text, in a sandbox). Another user of the tenant, the same user name of another
    tenant and a turn that does not exist get the same 404; an `<img>`'s ticket opens
    that one file, for its time, and only for its owner; a turn's input naming a file of
    a conversation it is not of reads nothing."""
    monkeypatch.setenv("AGENT_WEB_JWT_SECRET", SECRET)
    ada = _bearer("ada")
    files = [
        {"name": "shelf.png", "data": base64.b64encode(PNG).decode()},
        {"name": "logo.xml", "data": base64.b64encode(SVG).decode()},
    ]
    async with (
        harness.worker() as task_queue,
        chat_server(env, "127.0.0.1", task_queue) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as http,
    ):
        body = {"text": "What is on this shelf?", "files": files}
        started = await http.post("/api/chats", json=body, headers=ada)
        assert started.status_code == 201, started.text
        turn_id = started.json()["turn_id"]

        def path(n: int, turn: str = turn_id) -> str:
            return f"/api/turns/{quote(turn, safe='')}/files/{n}"

        image = await http.get(path(0), headers=ada)
        assert image.status_code == 200, image.text
        assert image.content == PNG
        assert image.headers["content-type"] == "image/png"
        assert image.headers["content-disposition"].startswith('inline; filename="shelf.png"')
        svg = await http.get(path(1), headers=ada)
        assert svg.status_code == 200, svg.text
        assert svg.content == SVG
        assert svg.headers["content-type"] == "text/plain; charset=utf-8"
        assert svg.headers["content-disposition"].startswith('attachment; filename="logo.xml"')
        for served in (image, svg):
            assert served.headers["x-content-type-options"] == "nosniff"
            assert served.headers["content-security-policy"] == "default-src 'none'; sandbox"
            assert served.headers["cross-origin-resource-policy"] == "same-origin"

        nowhere = f"turn-acme%3Aada-{uuid.uuid4().hex[:8]}"
        missing = await http.get(path(0, nowhere), headers=ada)
        assert missing.status_code == 404, missing.text
        said = missing.json()["error"].replace(nowhere, "ID")
        for other in (_bearer("bob"), _bearer("ada", tenant="globex")):
            refused = await http.get(path(0), headers=other)
            assert refused.status_code == 404, refused.text
            assert refused.json()["error"].replace(turn_id, "ID") == said
        assert (await http.get(path(2), headers=ada)).status_code == 404  # no third file

        async def ticket(for_path: str, headers: dict[str, str] = ada) -> str:
            asked = await http.post("/api/stream-tickets", json={"path": for_path}, headers=headers)
            assert asked.status_code == 200, asked.text
            return str(asked.json()["ticket"])

        opened = await http.get(path(0), params={"ticket": await ticket(path(0))})
        assert opened.status_code == 200 and opened.content == PNG, opened.text
        refused_tickets = {
            "none": await http.get(path(0)),
            "another file": await http.get(path(1), params={"ticket": await ticket(path(0))}),
            "another turn": await http.get(
                path(0), params={"ticket": await ticket(path(0, nowhere))}
            ),
        }
        monkeypatch.setattr(auth, "STREAM_TICKET_S", -1)  # issued already expired
        refused_tickets["expired"] = await http.get(
            path(0), params={"ticket": await ticket(path(0))}
        )
        for why, response in refused_tickets.items():
            assert response.status_code == 401, (why, response.text)
        assert "expired" in refused_tickets["expired"].json()["error"]
        assert "another stream" in refused_tickets["another turn"].json()["error"]
        monkeypatch.setattr(auth, "STREAM_TICKET_S", 60)
        bobs = await http.get(path(0), params={"ticket": await ticket(path(0), _bearer("bob"))})
        assert bobs.status_code == 404, bobs.text  # a ticket is no way around the owner check

        # A turn of ada's own, started by hand with the conversation's file in its input:
        # the conversation is not its parent, so its input naming the file reads nothing.
        agents = AgentClient(harness.client, task_queue=task_queue)
        stored = (await turns.opening(harness.client.get_workflow_handle(turn_id))).attachments
        forged = await agents.start_turn(
            TurnInput(
                question="And this?",
                principal=Principal(tenant="acme", user="ada"),
                attachments=stored,
            )
        )
        taken = await http.get(path(0, forged.id), headers=ada)
        assert taken.status_code == 410, taken.text
        assert "not turn" in taken.json()["error"] and taken.content != PNG


REMEMBER, LOOK_UP = "Please remember: ", "Look up: "


def keeper_plan(request: ModelRequest) -> Reply:
    """A model's plan that keeps what it is asked to, in the customer's words (so it runs
    unasked), looks up what it is asked to, and otherwise just answers (tests/test_web.py
    too)."""
    q = request.question
    if q.startswith(REMEMBER):
        fact = q.removeprefix(REMEMBER)
        return Reply(calls=[ToolCall(id="m1", name="remember", arguments={"fact": fact})])
    if q.startswith(LOOK_UP):
        query = q.removeprefix(LOOK_UP)
        return Reply(calls=[ToolCall(id="m1", name="recall", arguments={"query": query})])
    return Reply(text="ok")


KEEPER = ScriptedModel(plans=[keeper_plan], decisions=[lambda _: Reply(text="done")])


def _step_lines(events: list[tuple[str, Any]]) -> list[str]:
    """Each step's line and its result's text, as the page gets them."""
    return [
        f"{e['step']['text']} | {(e['step'].get('observation') or {}).get('text', '')}"
        for name, e in events
        if name == "step"
    ]


async def test_a_recalled_memory_shows_in_its_words_to_its_customer_only(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """A turn records a recalled memory as `[memory mem_…]`: the page gets it in its
    words (markup and all, which the page prints as text), for the customer the turn
    records; `[forgotten memory mem_…]` once forgotten; a turn of another customer's
    that names the memory never reads its words; and a store that cannot be read leaves
    the steps as recorded."""
    fact = "My cat is called <b>Tom</b> & she hates baths"
    concierge = Agent(
        name="concierge",
        model="scripted",
        models={"scripted": lambda _: KEEPER},
        # A store of this test's own; the model looks memories up (`recall`, a step).
        memory=MemorySettings(name=f"web-{uuid.uuid4().hex[:8]}", recall=0),
    )
    async with (
        harness.worker(agents=[concierge]) as task_queue,
        chat_server(env, "127.0.0.1", task_queue, customer="ada", agent=concierge) as ada,
        chat_server(env, "127.0.0.1", task_queue, customer="bob", agent=concierge) as bob,
        httpx.AsyncClient(timeout=60) as http,
    ):
        agents = AgentClient(harness.client, task_queue=task_queue)
        memories = MemoryAccess(concierge.memory.name)  # as `memory list --name` reads it

        async def said(chat: str, text: str) -> str:
            """The id of the turn that answered `text` in a new conversation, once answered."""
            started = await http.post(f"{chat}/api/chats", json={"text": text})
            assert started.status_code == 201, started.text
            await agents.turn(started.json()["turn_id"]).result()
            return str(started.json()["turn_id"])

        async def seen(chat: str, turn_id: str) -> list[str]:
            return _step_lines(await _sse(http, f"{chat}/api/turns/{turn_id}/events"))

        await said(ada, REMEMBER + fact)
        (kept,) = await memories.list("ada")
        looked = await said(ada, f"{LOOK_UP}cat")
        # Read in the conversation too, as the page reads it (its stream ends with it).
        conversation = looked.rsplit("-", 1)[0]
        await agents.conversation(conversation).end()
        in_chat = _step_lines(await _sse(http, f"{ada}/api/chats/{conversation}/events"))
        for lines in (await seen(ada, looked), in_chat):
            assert any(fact in line for line in lines), lines
            assert not any(f"[memory {kept.id}" in line for line in lines), lines

        # bob's own turn, worded with ada's memory: the reference, never her words.
        bobs = await said(bob, f"{LOOK_UP}[memory {kept.id}]")
        bob_sees = await seen(bob, bobs)
        assert any(f"[forgotten memory {kept.id}]" in line for line in bob_sees), bob_sees
        assert not any("Tom" in line for line in bob_sees), bob_sees
        refused = await _sse(http, f"{bob}/api/turns/{looked}/events")
        assert [n for n, _ in refused] == ["missing"], refused

        await memories.forget(kept.id, customer="ada")
        forgotten = await seen(ada, looked)
        assert any(f"[forgotten memory {kept.id}]" in line for line in forgotten), forgotten
        assert not any("Tom" in line for line in forgotten), forgotten

        # A store that cannot be read: the steps as recorded, no error.
        store = state_file(concierge.memory.name)
        store.unlink()
        store.mkdir()  # where the file was, a folder
        events = await _sse(http, f"{ada}/api/turns/{looked}/events")
        assert [n for n, _ in events][-2:] == ["done", "ended"], events
        recorded = _step_lines(events)
        assert any(f"[memory {kept.id}]" in line for line in recorded), recorded
