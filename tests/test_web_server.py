"""The web chat's server refuses what it should not serve, on every address it
listens on: other host names (DNS rebinding), bodies too large to read, JSON too
deep to parse; and it will not listen beyond loopback unless told which host
names it answers to (it has no login)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent.chat import ConversationInput
from durable_agent.runtime.server import Connection, free_port, is_listening
from durable_agent.runtime.turns import AgentClientError
from frontends.web.app import MAX_BODY_BYTES
from frontends.web.server import serve


@asynccontextmanager
async def chat_server(env: WorkflowEnvironment, host: str) -> AsyncIterator[str]:
    """The chat on `host` and a free port; its base URL."""
    port = free_port()
    conn = Connection(client=env.client, ui_url="http://localhost:8233")
    serving = asyncio.create_task(
        serve(conn, ConversationInput(customer_id="demo"), host=host, port=port, task_queue="q")
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
        big = json.dumps({"text": "x" * (MAX_BODY_BYTES + 1)})
        response = await http.post(f"{url}/api/chats", content=big, headers=headers)
        assert response.status_code == 413

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: read, and stopped
            for _ in range(MAX_BODY_BYTES // 1024 + 2):
                yield b" " * 1024

        response = await http.post(f"{url}/api/chats", content=chunks(), headers=headers)
        assert response.status_code == 413

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
