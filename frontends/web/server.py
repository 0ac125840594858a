"""Serving the web chat with uvicorn, on a socket bound before anything is printed."""

from __future__ import annotations

import asyncio
import os
import socket

import uvicorn

from durable_agent.agents import Agent
from durable_agent.chat import ConversationInput
from durable_agent.runtime.server import Connection, is_loopback
from durable_agent.runtime.turns import AgentClientError
from frontends.web.app import create_app

SHUTDOWN_S = 2
"""On Ctrl-C, requests in flight get this long to finish."""
LOOPBACK = ("127.0.0.1", "::1", "localhost")
HOSTS_SETTING = "AGENT_WEB_HOSTS"
"""Host names the chat answers to, comma-separated (`*`: any): the names a gateway in
front of it passes on. Default, on a loopback address: the loopback names (and the
address itself); elsewhere it must be set."""


class ChatServer(uvicorn.Server):
    """uvicorn, ending the page's event streams as it shuts down: they would keep
    their connections open until the graceful-shutdown timeout cancels them. The
    pages reconnect by themselves once a server is back."""

    def __init__(self, config: uvicorn.Config, closing: asyncio.Event) -> None:
        super().__init__(config)
        self.closing = closing

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.closing.set()
        await super().shutdown(sockets)


async def serve(
    conn: Connection,
    chat: ConversationInput | None,
    *,
    host: str,
    port: int,
    task_queue: str,
    agent: Agent | None = None,
) -> None:
    """See `frontends.web.serve`."""
    loopback = is_loopback(host)
    named = [h.strip() for h in os.environ.get(HOSTS_SETTING, "").split(",") if h.strip()]
    if not loopback and not named:
        raise AgentClientError(
            f"--host {host} is not a loopback address: the chat has no login, so say which "
            f"host names a browser uses to reach it ({HOSTS_SETTING}=chat.example.com, "
            f"behind your own gateway), or {HOSTS_SETTING}='*' for any"
        )
    hosts = named or sorted({*LOOPBACK, host})
    app = create_app(conn, chat, task_queue=task_queue, allowed_hosts=hosts, agent=agent)
    sock = _listen(host, port)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_S,
    )
    server = ChatServer(config, app.state.closing)
    customer = (chat or ConversationInput()).customer_id
    print(f"web chat for customer {customer}: {_url(host, sock)}", flush=True)
    if not loopback:
        print(
            f"note: listening on {host} with no authentication: anyone who reaches it chats "
            f"and approves as customer {customer}; put it behind your own gateway",
            flush=True,
        )
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        await asyncio.shield(serving)
    except asyncio.CancelledError:
        # Cancelled like any coroutine (the caller's own shutdown): stop as on Ctrl-C.
        server.should_exit = True
        await serving
        raise


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        why = os.strerror(e.errno) if e.errno else str(e)
        raise AgentClientError(
            f"cannot listen on {host}:{port} ({why}); pick another with --port or --host"
        ) from None


def _url(host: str, sock: socket.socket) -> str:
    """Where a browser on this machine finds the chat."""
    shown = "localhost" if host in ("0.0.0.0", "::", "") else host
    return f"http://{f'[{shown}]' if ':' in shown else shown}:{sock.getsockname()[1]}/"
