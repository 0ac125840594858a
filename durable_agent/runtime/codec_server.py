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

A request from a browser page of any other origin is refused (403), so a web
page the operator happens to open cannot use the codec server to decrypt.
`GET /health` answers 200 for container health checks.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

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
from durable_agent.runtime.server import is_loopback

log = logging.getLogger("durable_agent.codec_server")

MAX_BODY_BYTES = 8 * 1024 * 1024
"""A request's body: the Web UI sends an event's payloads at a time (each at most 2 MB)."""
MAX_OBJECTS = 20_000
"""JSON objects in a request (a payload is two or three): a body of many tiny ones
would take gigabytes as protobuf messages, so it is refused before it is parsed."""
READ_TIMEOUT_S = 15.0
"""A connection that sends nothing for this long is closed."""
ORIGINS_ENV = "AGENT_CODEC_ORIGINS"
TOKEN_ENV = "AGENT_CODEC_TOKEN"
DEFAULT_ORIGINS = (
    "http://localhost:8233",
    "http://127.0.0.1:8233",
    "http://localhost:8080",
    "http://127.0.0.1:8080",
)
ALLOWED_HEADERS = "Content-Type, X-Namespace, Authorization"


class CodecServer(ThreadingHTTPServer):
    """An HTTP server holding the codec, the allowed origins and the optional token."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        codec: EncryptionCodec,
        origins: Iterable[str] = DEFAULT_ORIGINS,
        token: str | None = None,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, CodecHandler)
        self.codec = codec
        self.origins = frozenset(o.rstrip("/") for o in origins)
        self.token = token or None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin.rstrip("/") in self.origins


class CodecHandler(BaseHTTPRequestHandler):
    server: CodecServer
    protocol_version = "HTTP/1.1"  # keep-alive: the UI decodes a page in many requests
    server_version = "durable-agent-codec"
    timeout = READ_TIMEOUT_S

    def handle_one_request(self) -> None:
        """Whatever a request holds, it gets an answer, and the server stays up."""
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError):
            self.close_connection = True
        except Exception:
            log.exception("request from %s failed", self.address_string())
            self.close_connection = True
            with contextlib.suppress(Exception):
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "the codec server failed")

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
            self._error(HTTPStatus.NOT_FOUND, "not found: POST /encode or /decode")
            return
        if not self._origin_ok() or not self._authorized():
            return
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send Content-Type: application/json")
            return
        body = self._body()
        if body is None:
            return
        if body.count(b"{") > MAX_OBJECTS:
            self._error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"too many payloads in one request (at most about {MAX_OBJECTS // 3})",
            )
            return
        try:
            payloads = json_format.Parse(body, Payloads())
        except (json_format.ParseError, UnicodeDecodeError, RecursionError) as e:
            self._error(HTTPStatus.BAD_REQUEST, f'expected {{"payloads": [...]}}: {_short(e)}')
            return
        codec = self.server.codec
        try:
            if op == "encode":
                result = [codec.encrypt(p) for p in payloads.payloads]
            else:
                result = [codec.decrypt(p) for p in payloads.payloads]
        except DecryptionError as e:
            self._error(HTTPStatus.UNPROCESSABLE_ENTITY, str(e))
            return
        except (ValueError, TypeError) as e:
            self._error(HTTPStatus.BAD_REQUEST, f"a payload is malformed: {_short(e)}")
            return
        self._send(HTTPStatus.OK, {"payloads": [json_format.MessageToDict(p) for p in result]})

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
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), expected):
            return True
        self._error(
            HTTPStatus.UNAUTHORIZED,
            "missing or wrong bearer token: send Authorization: Bearer <AGENT_CODEC_TOKEN>",
            extra={"WWW-Authenticate": 'Bearer realm="codec"'},
        )
        return False

    def _body(self) -> bytes | None:
        length = self.headers.get("Content-Length", "").strip()
        if not length.isascii() or not length.isdigit():
            self._error(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length")
            return None
        if int(length) > MAX_BODY_BYTES:
            self._error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"at most {MAX_BODY_BYTES} bytes a request"
            )
            self.close_connection = True  # the unread body must not be taken as a request
            return None
        body = self.rfile.read(int(length))
        if len(body) < int(length):  # the peer stopped sending (or the read timed out)
            self.close_connection = True
            self._error(HTTPStatus.BAD_REQUEST, "the body is shorter than its Content-Length")
            return None
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
        data = json.dumps(body).encode() if body is not None else b""
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
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        # Request lines and status only; bodies (the customer's text) are never logged.
        log.info("%s %s", self.address_string(), format % args)


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def build_server(
    ring: KeyRing,
    host: str = "127.0.0.1",
    port: int = DEFAULT_CODEC_PORT,
    origins: Iterable[str] = DEFAULT_ORIGINS,
    token: str | None = None,
    *,
    open_network: bool = False,
) -> CodecServer:
    """A codec server bound to host:port (port 0: any free port); call `serve_forever`.
    Beyond loopback it decrypts only for holders of `token`, unless `open_network`
    says the network it listens on is trusted (a container's, published to loopback)."""
    if not token and not open_network and not is_loopback(host):
        raise EncryptionConfigError(
            f"--host {host} is not loopback: anyone who reaches it could decrypt; set "
            f"{TOKEN_ENV} (clients then send Authorization: Bearer <token>), or pass "
            "--trusted-network if only trusted peers can reach that address"
        )
    return CodecServer((host, port), EncryptionCodec(ring), origins, token)


def origins_from_env() -> list[str]:
    raw = os.environ.get(ORIGINS_ENV, "")
    return [o.strip() for o in raw.split(",") if o.strip()] or list(DEFAULT_ORIGINS)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m durable_agent.runtime.codec_server",
        description="Decrypt payloads for the Temporal Web UI and CLI (remote codec).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_CODEC_PORT, help="default: %(default)s")
    p.add_argument(
        "--origin",
        action="append",
        help=f"a Web UI origin allowed to call it (repeatable; default: {ORIGINS_ENV} "
        f"or {', '.join(DEFAULT_ORIGINS)})",
    )
    p.add_argument(
        "--trusted-network",
        action="store_true",
        help=f"serve beyond loopback without {TOKEN_ENV}: only when nobody untrusted can "
        "reach the address (a container network published to the host's loopback)",
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
            open_network=args.trusted_network,
        )
    except (EncryptionConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever to return: call it off the serving thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        f"codec server on {server.url} (keys: {', '.join(ring.keys)}; origins: "
        f"{', '.join(sorted(server.origins))}; token: {'required' if server.token else 'none'})",
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
