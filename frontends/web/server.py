"""Serving the web chat with uvicorn, on a socket bound before anything is printed.

uvicorn closes a connection idle between requests (`timeout_keep_alive`), limits
a request's headers while they arrive in pieces (h11's incomplete-event size) and
refuses requests beyond `limit_concurrency`; it gives no deadline to a request that
is still arriving, keeps every connection it accepts, and h11 lets a head that
arrives in one read grow to 256 KiB. `ChatProtocol` adds these: a request must
arrive whole, headers and body, within REQUEST_TIMEOUT_S of the connection being
ready for it, and a body of declared length its length's time at
MIN_BODY_BYTES_PER_S more (else 408, closed); a connection beyond MAX_CONNECTIONS
gets a 503 at once; and a head over MAX_HEAD_BYTES a 431 however it arrives.
(Content-Length beside Transfer-Encoding is refused by the app:
`app.RequestFraming`.)
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from durable_agent.agents import Agent
from durable_agent.chat import ConversationInput
from durable_agent.errors import AgentClientError
from durable_agent.frontends.web.app import MAX_MESSAGE_BYTES, create_app
from durable_agent.frontends.web.auth import Authenticator
from durable_agent.frontends.web.limits import RateLimits
from durable_agent.runtime.server import Connection, answered_hosts, is_loopback

SHUTDOWN_S = 2
"""On Ctrl-C, requests in flight get this long to finish."""
REQUEST_TIMEOUT_S = 15.0
"""From the moment a connection is ready for a request until the request has arrived
whole (headers and body): whatever the pace of the bytes, then it is closed."""
MIN_BODY_BYTES_PER_S = 64 * 1024
"""A body that says its length (Content-Length) gets that long at this pace on top of
REQUEST_TIMEOUT_S: a message with 8 MB of files may take two minutes more on a slow
line, and a client that sends slower than this is still cut off."""
KEEP_ALIVE_S = 5
"""A connection idle between requests is closed after this long."""
MAX_CONNECTIONS = 256
"""Connections at once; more get a 503 at once. A browser opens up to six to a host
while a page loads, and each tab's event stream holds one: a hundred reloads, then
fifty tabs of browsers of their own (tests/test_web.py), reached 99 at once."""
MAX_HEAD_BYTES = 16 * 1024
"""The request line and headers together."""
HOSTS_SETTING = "AGENT_WEB_HOSTS"
"""Host names the chat answers to, comma-separated (`*`: any): the names a gateway in
front of it passes on. Default, on a loopback address: the loopback names (and the
address itself); elsewhere it must be set."""


class ChatProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with a whole-request deadline and a cap on
    connections (see the module's docstring)."""

    request_timeout: float = REQUEST_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    _deadline: asyncio.TimerHandle | None = None
    _armed_at: float = 0.0
    _sized: bool = False
    """This request's deadline already counts its declared body."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.connections) >= self.max_connections:
            self.transport = transport  # type: ignore[assignment]  # closed as it is lost
            _answer_and_close(
                transport, 503, "the chat server has too many connections: try again shortly"
            )
            return
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None:
            self._arm()  # the next request on a kept-alive connection begins
        if self._head_too_long(data):
            self._disarm()
            _answer_and_close(
                self.transport, 431, f"the request line and headers are over {MAX_HEAD_BYTES} bytes"
            )
            return
        super().data_received(data)
        if self._arrived():
            self._disarm()
        elif not self._sized and self.conn.their_state is h11.SEND_BODY:
            self._sized = True
            self._allow_for_body()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _head_too_long(self, data: bytes) -> bool:
        """h11 limits a head that arrives in pieces (`h11_max_incomplete_event_size`),
        not one that arrives in a single read (up to 256 KiB): both are held to
        MAX_HEAD_BYTES here."""
        if self.conn.their_state is not h11.IDLE:
            return False
        head = self.conn.trailing_data[0] + data[: MAX_HEAD_BYTES + 4]
        end = head.find(b"\r\n\r\n")
        return end > MAX_HEAD_BYTES or (end == -1 and len(head) > MAX_HEAD_BYTES)

    def _arrived(self) -> bool:
        """The request has arrived whole, or none has begun (idle: keep-alive's turn)."""
        state = self.conn.their_state
        if state is h11.IDLE:
            return not self.conn.trailing_data[0]
        return state is not h11.SEND_BODY

    def _arm(self) -> None:
        self._disarm()
        self._sized = False
        self._armed_at = self.loop.time()
        self._deadline = self.loop.call_later(self.request_timeout, self._expired)

    def _allow_for_body(self) -> None:
        """The head has arrived: a body of a declared length gets time for it
        (`MIN_BODY_BYTES_PER_S`); the app refuses one longer than it takes at once."""
        headers = dict(getattr(self, "scope", {}).get("headers", []))
        declared = headers.get(b"content-length", b"")
        if self._deadline is None or not declared.isdigit():
            return
        extra = min(int(declared), MAX_MESSAGE_BYTES) / MIN_BODY_BYTES_PER_S
        self._deadline.cancel()
        at = self._armed_at + self.request_timeout + extra
        self._deadline = self.loop.call_at(at, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            # Nobody has answered this request: say why it ends (the app, if it was
            # waiting for the body, hears that the client is gone).
            allowed = round(self.loop.time() - self._armed_at)
            message = f"the request did not arrive whole within {allowed:g} s"
            _answer_and_close(self.transport, 408, message)
        else:
            self.transport.close()


def _answer_and_close(transport: asyncio.BaseTransport, status: int, message: str) -> None:
    """A JSON error written straight to the socket, for a connection about to close."""
    body = json.dumps({"error": message}).encode()
    reason = {408: "Request Timeout", 431: "Request Header Fields Too Large"}.get(
        status, "Service Unavailable"
    )
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    if isinstance(transport, asyncio.WriteTransport):
        transport.write(head.encode() + body)
    transport.close()


def protocol(request_timeout: float, max_connections: int) -> type[ChatProtocol]:
    """`ChatProtocol` with these limits (uvicorn makes one per connection)."""
    limits: dict[str, Any] = {
        "request_timeout": request_timeout,
        "max_connections": max_connections,
    }
    return type("ChatProtocol", (ChatProtocol,), limits)


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
    request_timeout: float = REQUEST_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """See `frontends.web.serve`; `request_timeout` and `max_connections` as
    `ChatProtocol` applies them."""
    loopback = is_loopback(host)
    named = [h.strip() for h in os.environ.get(HOSTS_SETTING, "").split(",") if h.strip()]
    if not loopback and not named:
        raise AgentClientError(
            f"--host {host} is not a loopback address: the chat has no login, so say which "
            f"host names a browser uses to reach it ({HOSTS_SETTING}=chat.example.com, "
            f"behind your own gateway), or {HOSTS_SETTING}='*' for any"
        )
    hosts = answered_hosts(host, named)
    limits = RateLimits.from_env()  # a bad setting is one line, before anything listens
    auth = Authenticator.from_env()  # a JWKS that cannot be read: one line, before listening
    app = create_app(
        conn,
        chat,
        task_queue=task_queue,
        allowed_hosts=hosts,
        agent=agent,
        rate_limits=limits,
        auth=auth,
    )
    sock = _listen(host, port)
    config = uvicorn.Config(
        app,
        http=protocol(request_timeout, max_connections),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        # Who the client is, the app decides (`limits.py`): uvicorn's own reading of
        # X-Forwarded-For believes any local peer.
        proxy_headers=False,
        # Connections are capped as they come (ChatProtocol); this caps requests whose
        # handlers still run after their connection is gone.
        limit_concurrency=max_connections + 1,
    )
    server = ChatServer(config, app.state.closing)
    customer = (chat or ConversationInput()).customer_id
    if auth is not None:
        print(f"web chat for the users of verified bearer tokens: {_url(host, sock)}", flush=True)
    else:
        print(f"web chat for customer {customer}: {_url(host, sock)}", flush=True)
        login = "AGENT_WEB_JWT_SECRET or AGENT_WEB_JWKS"
        print(f"no login ({login} unset): it runs for one local user", flush=True)
    if not loopback and auth is None:
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
    except (OSError, OverflowError) as e:
        why = os.strerror(e.errno) if isinstance(e, OSError) and e.errno else str(e)
        raise AgentClientError(
            f"cannot listen on {host}:{port} ({why}); pick another with --port or --host"
        ) from None


def _url(host: str, sock: socket.socket) -> str:
    """Where a browser on this machine finds the chat."""
    shown = "localhost" if host in ("0.0.0.0", "::", "") else host
    return f"http://{f'[{shown}]' if ':' in shown else shown}:{sock.getsockname()[1]}/"
