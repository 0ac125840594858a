"""The codec server: the Temporal Web UI (and `temporal --codec-endpoint`) show
encrypted payloads in clear text by sending them here.

    python -m durable_agent.runtime.codec_server [--host 127.0.0.1] [--port 8888] [--origin URL]...

Why a process of its own: the server and its UI hold only ciphertext; the
*browser* posts the payloads it shows to this endpoint and renders the answer,
so the text is decrypted next to the operator, by whoever holds the key, and
never passes through the Temporal server. It implements Temporal's remote-codec
contract: `POST /encode` and `POST /decode` (also under a prefix, e.g.
`/{namespace}/decode`), body and answer `{"payloads": [...]}` in protobuf JSON.

    AGENT_ENCRYPTION_KEY / AGENT_ENCRYPTION_KEY_FILE   the key ring (required; see runtime.codec)
    AGENT_CODEC_ORIGINS  comma-separated origins whose pages may call it (CORS);
                         default: the local Web UI (http://localhost:8233, :8080)
    AGENT_CODEC_TOKEN    if set, requests need `Authorization: Bearer <token>`
    AGENT_CODEC_HOSTS    comma-separated host names it answers to (`*`: any); default,
                         on loopback: the loopback names; beyond loopback it must be set
    AGENT_PAYLOAD_STORE  the payload stores it reads (`runtime/storage.py`): a history's
    AGENT_PAYLOAD_READ   reference to a stored payload decodes to that payload, checked
                         against its hash; one it cannot have is answered 404, one line

A request from a browser page of any other origin is refused (403), so a web
page the operator happens to open cannot use the codec server to decrypt; a
request to any other host name (a name rebound to this address) too (400).
Beyond loopback it will not start without AGENT_CODEC_HOSTS and a token (or
`--trusted-network`). `GET /health` answers 200 for container health checks.

What a request may hold, checked before it is parsed: a body of at most 8 MiB with
a Content-Length; at most 1,000 payloads, 32 metadata entries each and 4,000 in
all, short keys and values. It must arrive whole within 15 s of the connection
being ready for it (an idle connection is closed then too). At most 32
connections and 16 MiB of bodies are served at once; beyond that a 503 says to
try again. So memory stays bounded whatever is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import http.client
import io
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import DataConverter, ExternalStorage, PayloadConverter

from durable_agent.errors import PayloadUnavailable
from durable_agent.runtime.cli import OneLineParser, port_number
from durable_agent.runtime.codec import (
    DEFAULT_CODEC_PORT,
    KEY_ENV,
    KEY_FILE_ENV,
    DecryptionError,
    EncryptionCodec,
    EncryptionConfigError,
    KeyRing,
    key_ring_from_env,
)
from durable_agent.runtime.server import answered_hosts, host_allowed, is_loopback
from durable_agent.runtime.storage import StorageConfigError, external_storage

log = logging.getLogger("durable_agent.codec_server")

MAX_BODY_BYTES = 8 * 1024 * 1024
"""A request's body: the Web UI sends an event's payloads at a time (each at most 2 MB)."""
MAX_HEAD_BYTES = 32 * 1024
"""The request line and headers together."""
MAX_PAYLOADS = 1000
MAX_ENTRIES = 32
"""Metadata entries (or external payload details) of one payload; a payload has two
or three."""
MAX_ENTRIES_TOTAL = 4000
"""Metadata entries in a whole request."""
MAX_KEY_CHARS = 256
MAX_VALUE_CHARS = 8192
"""A metadata value, as base64."""
MAX_JSON_VALUES = 3 * MAX_PAYLOADS + MAX_ENTRIES_TOTAL + 16
"""Objects, arrays and list or object members a body may hold, counted before it is
parsed (a member is one comma): a body of many tiny ones would take hundreds of
megabytes as Python objects and protobuf messages."""
MAX_CONNECTIONS = 32
"""Connections served at once, each by a thread; more are answered 503 at once."""
MAX_BYTES_IN_FLIGHT = 16 * 1024 * 1024
"""Bodies being read or decoded at once: a request's Content-Length is reserved from
this before its body is read (a few copies of each live while it is decoded)."""
LINGER_S = 2.0
"""After an answer that closes the connection with the body unread (a refusal), what
the peer still sends is read and dropped, so it reads the answer rather than a reset
connection: until it has sent nothing for this long, or `LINGER_MAX_S` have passed
(a peer on a busy machine may take longer than this to send a large body)."""
LINGER_MAX_S = 10.0
"""Bounds how long a peer that keeps trickling bytes holds a connection's thread."""
REQUEST_TIMEOUT_S = 15.0
"""From the moment a connection is ready for a request until the request has arrived
whole (headers and body): whatever the pace of the bytes, then it is closed."""
ORIGINS_ENV = "AGENT_CODEC_ORIGINS"
TOKEN_ENV = "AGENT_CODEC_TOKEN"
HOSTS_ENV = "AGENT_CODEC_HOSTS"
DEFAULT_ORIGINS = (
    "http://localhost:8233",
    "http://127.0.0.1:8233",
    "http://localhost:8080",
    "http://127.0.0.1:8080",
)
ALLOWED_HEADERS = "Content-Type, X-Namespace, Authorization"


class _Busy(Exception):
    """The server is reading or decoding as many bytes of bodies as it may at once."""


class _Refused(Exception):
    """A request refused with `status` before its body is read or parsed."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class CodecServer(ThreadingHTTPServer):
    """An HTTP server holding the codec, the allowed origins and host names, the
    optional token, and the limits on what it serves at once."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        codec: EncryptionCodec,
        origins: Iterable[str] = DEFAULT_ORIGINS,
        token: str | None = None,
        hosts: Sequence[str] = ("*",),
        *,
        request_timeout: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        max_bytes_in_flight: int = MAX_BYTES_IN_FLIGHT,
        storage: ExternalStorage | None = None,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, CodecHandler)
        self.codec = codec
        self.storage = storage
        """Where references to stored payloads lead (`runtime/storage.py`): decoding
        one answers the payload it refers to, decrypted."""
        self.origins = frozenset(o.rstrip("/") for o in origins)
        self.token = token or None
        self.hosts = tuple(hosts)
        self.request_timeout = request_timeout
        self._connections = threading.BoundedSemaphore(max_connections)
        self._bytes_left = max_bytes_in_flight
        self._bytes_lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin.rstrip("/") in self.origins

    # -- what it serves at once -------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, up to the limit; beyond it, a 503 at once."""
        if not self._connections.acquire(blocking=False):
            _turn_away(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connections.release()  # no thread took it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()

    @contextlib.contextmanager
    def reserved(self, size: int) -> Iterator[None]:
        """`size` bytes of the in-flight budget while the block runs; `_Busy` if the
        budget has not that much left."""
        with self._bytes_lock:
            if size > self._bytes_left:
                raise _Busy
            self._bytes_left -= size
        try:
            yield
        finally:
            with self._bytes_lock:
                self._bytes_left += size


BUSY_MESSAGE = "the codec server is busy with other requests: try again in a moment"


def _turn_away(request: socket.socket) -> None:
    """A 503 for a connection over the limit, sent from the accepting thread without
    waiting for anything (what has arrived is read first, so closing does not reset
    the connection before the answer is read)."""
    body = json.dumps({"error": BUSY_MESSAGE}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        request.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            request.recv(65536)
        request.sendall(head.encode() + body)


def _drain(sock: socket.socket, idle: float, most: float) -> None:
    """Read and drop what the peer sends (a lingering close): until it closes, sends
    nothing for `idle` seconds, or `most` seconds have passed."""
    deadline = time.monotonic() + most
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(min(idle, left))
            if not sock.recv(65536):
                return


class _Deadline(io.RawIOBase):
    """A connection's reads, each waiting only for what is left of the request's time,
    and no further than the request's byte allowance."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = math.inf
        self.allowance = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        if self.allowance <= 0:
            raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "the request is too long")
        self._sock.settimeout(left)
        view = memoryview(buffer)[: self.allowance]
        n = self._sock.recv_into(view)
        self.allowance -= n
        return n


class CodecHandler(BaseHTTPRequestHandler):
    server: CodecServer
    protocol_version = "HTTP/1.1"  # keep-alive: the UI decodes a page in many requests
    server_version = "durable-agent-codec"

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self._reads = _Deadline(self.connection)
        self.rfile = io.BufferedReader(self._reads)

    def handle_one_request(self) -> None:
        """Whatever a request holds, it gets an answer, and the server stays up. Each
        request has `request_timeout` to arrive whole, counted from the moment the
        connection is ready for it (the base class closes the connection then)."""
        self._reads.deadline = time.monotonic() + self.server.request_timeout
        self._reads.allowance = MAX_HEAD_BYTES
        # What an answer refers to before the request line and headers are read.
        self.requestline, self.request_version = "", "HTTP/1.1"
        self.headers = http.client.HTTPMessage()
        self._linger = self._timed_out = False
        try:
            super().handle_one_request()
        except _Refused as e:
            self.close_connection = True
            with contextlib.suppress(Exception):
                self._error(e.status, str(e))
        except (TimeoutError, ConnectionError):
            self.close_connection = True
            self._linger = False
        except Exception:
            log.exception("request from %s failed", self.address_string())
            self.close_connection = True
            with contextlib.suppress(Exception):
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "the codec server failed")

    def finish(self) -> None:
        super().finish()
        if self._linger:
            _drain(self.connection, LINGER_S, LINGER_MAX_S)

    def parse_request(self) -> bool:
        """The request line and headers; a request to a host name this server does not
        answer to goes no further."""
        if not super().parse_request():
            return False
        if host_allowed(self.headers.get("Host", ""), self.server.hosts):
            return True
        self.close_connection = True  # its body is not read
        self._error(
            HTTPStatus.BAD_REQUEST,
            f"this server does not answer to that host name (add it to {HOSTS_ENV})",
            cors=False,
        )
        return False

    # -- routes ----------------------------------------------------------------

    def do_OPTIONS(self) -> None:
        """CORS preflight: browsers send it without credentials, so no token check."""
        if not self._origin_ok():
            return
        self._send(HTTPStatus.NO_CONTENT, None, preflight=True)

    def do_GET(self) -> None:
        if self._route() == "health":
            self._send(HTTPStatus.OK, {"status": "ok"})
        else:
            self._error(HTTPStatus.NOT_FOUND, "not found: POST /encode or /decode")

    def do_POST(self) -> None:
        op = self._route()
        if op not in ("encode", "decode"):
            self.close_connection = True  # its body is not read
            self._error(HTTPStatus.NOT_FOUND, "not found: POST /encode or /decode")
            return
        if not self._origin_ok() or not self._authorized():
            self.close_connection = True
            return
        try:
            length = self._length()
            with self.server.reserved(length):
                # Each stage's input is let go as soon as the next has it: what lives at
                # once is a few copies of the body at most.
                payloads = _parse(self._body(length))
                if op == "decode" and self.server.storage is not None:
                    payloads = _resolved(self.server.storage, payloads)
                result = _apply(self.server.codec, op, payloads)
                del payloads
                text = json.dumps({"payloads": result})
                del result
                self._send(HTTPStatus.OK, text.encode())
        except _Busy:
            self.close_connection = True
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, BUSY_MESSAGE, extra={"Retry-After": "1"})
        except _Refused as e:
            self._error(e.status, str(e))

    # -- helpers ---------------------------------------------------------------

    def _route(self) -> str:
        """The last path segment: `/decode`, `/default/decode` and `/codec/decode` alike."""
        segments = [s for s in urlsplit(self.path).path.split("/") if s]
        return segments[-1] if segments else ""

    def _origin_ok(self) -> bool:
        """No Origin header: not a browser (the CLI, curl). Else it must be allowed."""
        origin = self.headers.get("Origin")
        if origin is None or self.server.origin_allowed(origin):
            return True
        self._error(
            HTTPStatus.FORBIDDEN,
            f"origin {origin} is not allowed: add it to {ORIGINS_ENV} on the codec server",
            cors=False,
        )
        return False

    def _authorized(self) -> bool:
        expected = self.server.token
        if expected is None:
            return True
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("latin-1", "replace"), expected.encode()
        ):
            return True
        self._error(
            HTTPStatus.UNAUTHORIZED,
            "missing or wrong bearer token: send Authorization: Bearer <AGENT_CODEC_TOKEN>",
            extra={"WWW-Authenticate": 'Bearer realm="codec"'},
        )
        return False

    def _length(self) -> int:
        """The body's declared length, checked; every refusal here closes the connection
        (the unread body must not be taken for the next request)."""
        self.close_connection = True
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise _Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send Content-Type: application/json")
        if "Transfer-Encoding" in self.headers:
            raise _Refused(HTTPStatus.BAD_REQUEST, "send the body with a Content-Length only")
        lengths = self.headers.get_all("Content-Length") or []
        length = lengths[0].strip() if len(lengths) == 1 else ""
        if not (length.isascii() and length.isdigit() and len(length) <= 12):
            raise _Refused(HTTPStatus.LENGTH_REQUIRED, "send one Content-Length")
        if int(length) > MAX_BODY_BYTES:
            raise _Refused(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"at most {MAX_BODY_BYTES} bytes a request"
            )
        self.close_connection = False
        return int(length)

    def _body(self, length: int) -> bytes:
        self._reads.allowance += length
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            self.close_connection = True
            self._timed_out = True  # the answer below is written, not lingered on
            raise _Refused(
                HTTPStatus.REQUEST_TIMEOUT,
                f"the request did not arrive whole within {self.server.request_timeout:g} s",
            ) from None
        if len(body) < length:  # the peer stopped sending
            self.close_connection = True
            raise _Refused(HTTPStatus.BAD_REQUEST, "the body is shorter than its Content-Length")
        return body

    def _error(
        self,
        status: HTTPStatus,
        message: str,
        *,
        cors: bool = True,
        extra: dict[str, str] | None = None,
    ) -> None:
        self._send(status, {"error": message}, cors=cors, extra=extra)

    def _send(
        self,
        status: HTTPStatus,
        body: Any,
        *,
        preflight: bool = False,
        cors: bool = True,
        extra: dict[str, str] | None = None,
    ) -> None:
        if isinstance(body, bytes):
            data = body
        else:
            data = json.dumps(body).encode() if body is not None else b""
        # A reader that does not read gets as long to take the answer as a request has.
        self.connection.settimeout(self.server.request_timeout)
        self.send_response(status)
        origin = self.headers.get("Origin")
        if cors and origin and self.server.origin_allowed(origin):
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Access-Control-Allow-Credentials", "true")
            self.send_header("Vary", "Origin")
            if preflight:
                self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
                self.send_header("Access-Control-Allow-Headers", ALLOWED_HEADERS)
                self.send_header("Access-Control-Max-Age", "600")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")  # decrypted text stays out of caches
        if self.close_connection:
            self.send_header("Connection", "close")
            self._linger = not self._timed_out
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        # Request lines and status only; bodies (the customer's text) are never logged.
        log.info("%s %s", self.address_string(), format % args)


def _parse(body: bytes) -> Payloads:
    """`{"payloads": [...]}` as protobuf, within the limits: counted before the body is
    parsed at all, then checked member by member before protobuf sees it."""
    if body.count(b",") + body.count(b"{") + body.count(b"[") > MAX_JSON_VALUES:
        raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _TOO_MANY)
    try:
        parsed = json.loads(body)
    except RecursionError:
        raise _Refused(HTTPStatus.BAD_REQUEST, "the body is nested too deeply") from None
    except ValueError as e:
        raise _Refused(
            HTTPStatus.BAD_REQUEST, f'expected {{"payloads": [...]}}: {_short(e)}'
        ) from None
    del body
    payloads = parsed.get("payloads", []) if isinstance(parsed, dict) else None
    if not isinstance(payloads, list):
        raise _Refused(HTTPStatus.BAD_REQUEST, 'expected {"payloads": [...]}')
    if len(payloads) > MAX_PAYLOADS:
        raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _TOO_MANY)
    entries = 0
    for payload in payloads:
        if not isinstance(payload, dict):
            raise _Refused(HTTPStatus.BAD_REQUEST, "a payload is not an object")
        metadata = payload.get("metadata", {})
        if not isinstance(metadata, dict):
            raise _Refused(HTTPStatus.BAD_REQUEST, "a payload's metadata is not an object")
        external = payload.get("externalPayloads", payload.get("external_payloads", []))
        count = len(metadata) + (len(external) if isinstance(external, list) else 1)
        entries += count
        if count > MAX_ENTRIES or entries > MAX_ENTRIES_TOTAL:
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _TOO_MANY)
        for key, value in metadata.items():
            long_value = isinstance(value, str) and len(value) > MAX_VALUE_CHARS
            if len(key) > MAX_KEY_CHARS or long_value:
                raise _Refused(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"a metadata key is over {MAX_KEY_CHARS} characters or its value over "
                    f"{MAX_VALUE_CHARS}",
                )
    try:
        return json_format.ParseDict(parsed, Payloads())
    except (json_format.ParseError, UnicodeDecodeError, RecursionError, ValueError) as e:
        raise _Refused(
            HTTPStatus.BAD_REQUEST, f'expected {{"payloads": [...]}}: {_short(e)}'
        ) from None


_TOO_MANY = (
    f"too many payloads or metadata entries in one request (at most {MAX_PAYLOADS} payloads, "
    f"{MAX_ENTRIES} metadata entries each and {MAX_ENTRIES_TOTAL} in all)"
)


class _AsStored(PayloadConverter):
    """Payloads as they are: a converter's decode then only reads the store."""

    def to_payloads(self, values: Sequence[Any]) -> list[Payload]:
        return list(values)

    def from_payloads(
        self, payloads: Sequence[Payload], type_hints: list[type] | None = None
    ) -> list[Any]:
        return list(payloads)


def _resolved(storage: ExternalStorage, payloads: Payloads) -> Payloads:
    """References to stored payloads replaced by the payloads (still encrypted)."""
    reader = DataConverter(payload_converter_class=_AsStored, external_storage=storage)
    try:
        return Payloads(payloads=asyncio.run(reader.decode(payloads.payloads)))
    except PayloadUnavailable as e:
        raise _Refused(HTTPStatus.NOT_FOUND, str(e)) from None
    except RuntimeError as e:  # a store that may answer in a moment (S3 unreachable)
        raise _Refused(HTTPStatus.SERVICE_UNAVAILABLE, f"the payload store: {_short(e)}") from None
    except (ValueError, TypeError) as e:
        raise _Refused(HTTPStatus.BAD_REQUEST, f"a reference is malformed: {_short(e)}") from None


def _apply(codec: EncryptionCodec, op: str, payloads: Payloads) -> list[dict[str, Any]]:
    try:
        if op == "encode":
            result = [codec.encrypt(p) for p in payloads.payloads]
        else:
            result = [codec.decrypt(p) for p in payloads.payloads]
    except DecryptionError as e:
        raise _Refused(HTTPStatus.UNPROCESSABLE_ENTITY, str(e)) from None
    except (ValueError, TypeError) as e:
        raise _Refused(HTTPStatus.BAD_REQUEST, f"a payload is malformed: {_short(e)}") from None
    return [json_format.MessageToDict(p) for p in result]


def _origin(text: str) -> str:
    """An argparse type: `scheme://host[:port]`, or `*` for any."""
    origin = text.strip().rstrip("/")
    parts = urlsplit(origin) if origin != "*" else None
    if parts is not None and not (
        parts.scheme in ("http", "https") and parts.netloc and not parts.path
    ):
        raise argparse.ArgumentTypeError(f"give an origin like http://localhost:8233, not {text!r}")
    return origin


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def build_server(
    ring: KeyRing,
    host: str = "127.0.0.1",
    port: int = DEFAULT_CODEC_PORT,
    origins: Iterable[str] = DEFAULT_ORIGINS,
    token: str | None = None,
    *,
    hosts: Sequence[str] = (),
    open_network: bool = False,
    request_timeout: float = REQUEST_TIMEOUT_S,
    storage: ExternalStorage | None = None,
) -> CodecServer:
    """A codec server bound to host:port (port 0: any free port); call `serve_forever`.
    It answers to the host names `hosts` (`*`: any; default, on loopback: the loopback
    names). Beyond loopback it needs `hosts`, and decrypts only for holders of
    `token` unless `open_network` says the network it listens on is trusted (a
    container's, published to loopback). `request_timeout`: seconds a request has to
    arrive whole."""
    if not 0 <= port <= 65535:
        raise EncryptionConfigError(f"port {port}: give a port from 0 to 65535")
    answered = answered_hosts(host, hosts)
    if not is_loopback(host):
        missing = []
        if not answered:
            missing.append(
                f"set {HOSTS_ENV} to the host names clients use to reach it (else a name "
                "rebound to this address reaches it too)"
            )
        if not token and not open_network:
            missing.append(
                f"set {TOKEN_ENV} (clients then send Authorization: Bearer <token>), or pass "
                "--trusted-network if only trusted peers can reach that address"
            )
        if missing:
            raise EncryptionConfigError(
                f"--host {host} is not loopback: anyone who reaches it could decrypt; "
                + "; and ".join(missing)
            )
    try:
        return CodecServer(
            (host, port),
            EncryptionCodec(ring),
            origins,
            token,
            answered,
            request_timeout=request_timeout,
            storage=storage,
        )
    except (OSError, OverflowError) as e:
        why = os.strerror(e.errno) if isinstance(e, OSError) and e.errno else str(e)
        raise EncryptionConfigError(
            f"cannot listen on {host}:{port} ({why}); pick another with --port or --host"
        ) from None


def origins_from_env() -> list[str]:
    raw = os.environ.get(ORIGINS_ENV, "")
    return [o.strip() for o in raw.split(",") if o.strip()] or list(DEFAULT_ORIGINS)


def hosts_from_env() -> list[str]:
    raw = os.environ.get(HOSTS_ENV, "")
    return [h.strip() for h in raw.split(",") if h.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser(
        prog="python -m durable_agent.runtime.codec_server",
        description="Decrypt payloads for the Temporal Web UI and CLI (remote codec).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument(
        "--port", type=port_number, default=DEFAULT_CODEC_PORT, help="default: %(default)s"
    )
    p.add_argument(
        "--origin",
        action="append",
        type=_origin,
        help=f"a Web UI origin allowed to call it (repeatable; default: {ORIGINS_ENV} "
        f"or {', '.join(DEFAULT_ORIGINS)})",
    )
    p.add_argument(
        "--trusted-network",
        action="store_true",
        help=f"serve beyond loopback without {TOKEN_ENV}: only when nobody untrusted can "
        f"reach the address (a container network published to the host's loopback); "
        f"{HOSTS_ENV} is still needed there",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        ring = key_ring_from_env()
        if ring is None:
            raise EncryptionConfigError(
                f"no key: set {KEY_ENV} (or {KEY_FILE_ENV}) to the workers' key ring"
            )
        server = build_server(
            ring,
            args.host,
            args.port,
            args.origin or origins_from_env(),
            os.environ.get(TOKEN_ENV),
            hosts=hosts_from_env(),
            open_network=args.trusted_network,
            storage=external_storage(),
        )
    except (EncryptionConfigError, StorageConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever to return: call it off the serving thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"codec server on {server.url} (keys: {', '.join(ring.keys)}; origins: "
        f"{', '.join(sorted(server.origins))}; hosts: {', '.join(server.hosts)}; token: "
        f"{'required' if server.token else 'none'})",
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
