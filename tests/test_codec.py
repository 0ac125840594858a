"""Payload encryption: the codec and its key ring, the codec server the Web UI calls,
and a real turn whose stored history holds no customer text while the turn still
answers and the codec server (the Web UI's path) reads it back."""

from __future__ import annotations

import base64
import binascii
import contextlib
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from durable_agent.activities.plan import PlanInput
from durable_agent.conversation import AssistantMessage, ToolResult, UserMessage
from durable_agent.runtime.codec import (
    ENCODING,
    KEY_ID_KEY,
    LEAN_DATA_CONVERTER,
    DecryptionError,
    EncryptionCodec,
    EncryptionConfigError,
    KeyRing,
    codec_endpoint,
    data_converter,
    fingerprint,
    key_ring_from_env,
)
from durable_agent.runtime.codec_server import MAX_CONNECTIONS, CodecServer, build_server
from durable_agent.runtime.server import (
    EmbeddedServer,
    ServerUnavailable,
    connect,
    free_port,
    temporal_cli,
)
from durable_agent.runtime.turns import start_turn
from durable_agent.types import Outcome, ToolCall, TurnInput

ROOT = Path(__file__).resolve().parent.parent
UI_ORIGIN = "http://localhost:8233"


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def json_payload(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(text).encode())


# -- key ring ----------------------------------------------------------------------


def test_key_ring_parses_ids_rotation_order_and_comments(tmp_path: Path) -> None:
    new, old, anonymous = new_key(), new_key(), new_key()
    ring = KeyRing.parse(f"k2:{new}, k1:{old}\n# retired keys below\n{anonymous}\n")
    assert list(ring.keys) == ["k2", "k1", fingerprint(base64.b64decode(anonymous))]
    assert ring.current_id == "k2"
    assert new not in repr(ring)  # key bytes never printed

    key_file = tmp_path / "keys"
    key_file.write_text(f"k2:{new}\nk1:{old}\n")
    ring = key_ring_from_env({"AGENT_ENCRYPTION_KEY_FILE": str(key_file)})
    assert ring is not None and list(ring.keys) == ["k2", "k1"]
    assert key_ring_from_env({}) is None
    assert key_ring_from_env({"AGENT_ENCRYPTION_KEY": "  "}) is None


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"AGENT_ENCRYPTION_KEY": "not base64!"}, "not base64"),
        ({"AGENT_ENCRYPTION_KEY": base64.b64encode(b"short").decode()}, "is 5 bytes"),
        ({"AGENT_ENCRYPTION_KEY": "bad id!:" + base64.b64encode(bytes(32)).decode()}, "key id"),
        ({"AGENT_ENCRYPTION_KEY": "a:" + new_key() + ",a:" + new_key()}, "appears twice"),
        ({"AGENT_ENCRYPTION_KEY": new_key(), "AGENT_ENCRYPTION_KEY_FILE": "/k"}, "set one"),
        ({"AGENT_ENCRYPTION_KEY_FILE": "/no/such/key/file"}, "cannot read the key file"),
        ({"AGENT_ENCRYPTION_KEY": "# only a comment"}, "holds no key"),
    ],
)
def test_bad_key_settings_say_what_to_fix(environ: dict[str, str], message: str) -> None:
    with pytest.raises(EncryptionConfigError, match=message):
        key_ring_from_env(environ)


async def test_a_client_with_a_bad_key_fails_with_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_ENCRYPTION_KEY", "not base64!")
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")
    with pytest.raises(ServerUnavailable, match="AGENT_ENCRYPTION_KEY: key 1 is not base64"):
        await connect()


# -- codec -------------------------------------------------------------------------


async def test_codec_encrypts_with_the_current_key_and_decrypts_with_any() -> None:
    old_ring = KeyRing.parse(f"k1:{new_key()}")
    rotated = KeyRing({"k2": base64.b64decode(new_key()), **old_ring.keys})
    before, after = EncryptionCodec(old_ring), EncryptionCodec(rotated)
    secret = json_payload("I want to return order 123456, it arrived damaged.")

    [sealed] = await before.encode([secret])
    assert sealed.metadata["encoding"] == ENCODING
    assert sealed.metadata[KEY_ID_KEY] == b"k1"
    assert b"123456" not in sealed.SerializeToString()
    [again] = await before.encode([secret])
    assert again.data != sealed.data  # a fresh nonce every time

    assert await after.decode([sealed]) == [secret]  # old payloads after rotation
    [resealed] = await after.encode([secret])
    assert resealed.metadata[KEY_ID_KEY] == b"k2"
    with pytest.raises(DecryptionError, match="key 'k2', which is not in the key ring"):
        await before.decode([resealed])


async def test_codec_refuses_altered_or_relabelled_payloads_and_passes_plain_ones() -> None:
    ring = KeyRing.parse(f"a:{new_key()},b:{new_key()}")
    codec = EncryptionCodec(ring)
    [sealed] = await codec.encode([json_payload("Herbal Handsoap")])

    flipped = Payload()
    flipped.CopyFrom(sealed)
    flipped.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    relabelled = Payload()
    relabelled.CopyFrom(sealed)
    relabelled.metadata[KEY_ID_KEY] = b"b"
    for bad in (flipped, relabelled):
        with pytest.raises(DecryptionError, match="does not decrypt"):
            await codec.decode([bad])

    plain = json_payload("written before encryption was switched on")
    assert await codec.decode([plain]) == [plain]


async def test_data_converter_encrypts_values_and_failure_messages_only_with_a_key() -> None:
    plain = data_converter({"AGENT_PAYLOAD_STORE": "off"})  # reads stores, stores nothing
    assert plain.payload_codec is None
    assert plain.payload_converter_class is LEAN_DATA_CONVERTER.payload_converter_class
    [inline] = await plain.encode(["Has order 123456 shipped? " * 1000])
    assert b"123456" in inline.data and not inline.external_payloads
    converter = data_converter({"AGENT_ENCRYPTION_KEY": new_key(), "AGENT_PAYLOAD_STORE": "off"})
    [payload] = await converter.encode([TurnInput(question="Has order 123456 shipped?")])
    assert b"123456" not in payload.SerializeToString()
    [back] = await converter.decode([payload], [TurnInput])
    assert back == TurnInput(question="Has order 123456 shipped?")

    failure = Failure()
    await converter.encode_failure(ApplicationError("order 123456 is damaged"), failure)
    assert b"123456" not in failure.SerializeToString()
    assert "123456" not in failure.message and "123456" not in failure.stack_trace
    error = await converter.decode_failure(failure)
    assert "order 123456 is damaged" in str(error)


def test_the_web_ui_gets_a_codec_endpoint_only_with_encryption_on() -> None:
    assert codec_endpoint({}) is None
    assert codec_endpoint({"AGENT_ENCRYPTION_KEY": "x"}) == "http://localhost:8888"
    assert (
        codec_endpoint({"AGENT_ENCRYPTION_KEY_FILE": "/k", "AGENT_CODEC_ENDPOINT": "https://c/"})
        == "https://c"
    )


# -- codec server ------------------------------------------------------------------


@pytest.fixture
def codec_server() -> Iterator[CodecServer]:
    server = build_server(KeyRing.parse(f"k1:{new_key()}"), port=0, origins=[UI_ORIGIN])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def call(
    server: CodecServer,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One HTTP request; (status, headers, parsed JSON body or None)."""
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), port, timeout=10)
    try:
        data = json.dumps(body).encode() if body is not None else None
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=all_headers)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, dict(resp.headers), json.loads(raw) if raw else None
    finally:
        conn.close()


def as_json(payload: Payload) -> dict[str, Any]:
    return {
        "metadata": {k: base64.b64encode(v).decode() for k, v in payload.metadata.items()},
        "data": base64.b64encode(payload.data).decode(),
    }


def data_of(payload_json: dict[str, Any]) -> bytes:
    return base64.b64decode(payload_json.get("data", ""))


def test_codec_server_encodes_and_decodes_like_the_web_ui_expects(
    codec_server: CodecServer,
) -> None:
    ui = {"Origin": UI_ORIGIN, "X-Namespace": "default"}
    status, headers, _ = call(
        codec_server,
        "OPTIONS",
        "/decode",
        headers={
            **ui,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace",
        },
    )
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == UI_ORIGIN
    assert "X-Namespace" in headers["Access-Control-Allow-Headers"]

    plain = json_payload("Which item was ordered for 123456?")
    status, headers, encoded = call(
        codec_server, "POST", "/encode", {"payloads": [as_json(plain)]}, ui
    )
    assert status == 200 and headers["Access-Control-Allow-Origin"] == UI_ORIGIN
    [sealed] = encoded["payloads"]
    assert b"123456" not in data_of(sealed)

    for path in ("/decode", "/default/decode"):  # the CLI's {namespace} template too
        status, _, decoded = call(codec_server, "POST", path, {"payloads": [sealed]}, ui)
        assert status == 200
        assert json.loads(data_of(decoded["payloads"][0])) == "Which item was ordered for 123456?"


def test_codec_server_refuses_other_origins_bad_bodies_and_unknown_keys(
    codec_server: CodecServer,
) -> None:
    evil = {"Origin": "https://evil.example"}
    for method in ("OPTIONS", "POST"):
        status, headers, body = call(codec_server, method, "/decode", {"payloads": []}, evil)
        assert status == 403 and "Access-Control-Allow-Origin" not in headers
    assert "AGENT_CODEC_ORIGINS" in body["error"]

    status, _, body = call(codec_server, "POST", "/decode", {"payloads": "nope"})
    assert status == 400 and "payloads" in body["error"]
    status, _, _ = call(codec_server, "POST", "/decode", {"payloads": []}, {"Content-Type": "x"})
    assert status == 415
    status, _, _ = call(codec_server, "POST", "/metrics", {"payloads": []})
    assert status == 404

    stranger = EncryptionCodec(KeyRing.parse(f"other:{new_key()}")).encrypt(json_payload("x"))
    status, _, body = call(codec_server, "POST", "/decode", {"payloads": [as_json(stranger)]})
    assert status == 422 and "'other'" in body["error"]

    status, _, body = call(codec_server, "GET", "/health")
    assert status == 200 and body == {"status": "ok"}


def test_codec_server_answers_malformed_payloads_and_odd_requests_and_stays_up(
    codec_server: CodecServer,
) -> None:
    sealed = as_json(EncryptionCodec(codec_server.codec.ring).encrypt(json_payload("hi")))
    short = sealed | {"data": base64.b64encode(b"abc").decode()}
    garbage = sealed | {"data": base64.b64encode(os.urandom(64)).decode()}
    for bad in (short, garbage):
        status, _, body = call(codec_server, "POST", "/decode", {"payloads": [bad]})
        assert status in (400, 422) and "error" in body, (status, body)
    nested = "[" * 100_000 + "]" * 100_000
    for headers, raw in (
        ({"Content-Length": "-1"}, b"{}"),
        ({"Content-Length": "\u00b2"}, b"{}"),  # a digit to str.isdigit, not a number
        ({"Content-Type": "application/json; charset=\x00"}, b'{"payloads": []}'),
        ({}, nested.encode()),
    ):
        host, port = codec_server.server_address[:2]
        conn = http.client.HTTPConnection(str(host), port, timeout=10)
        conn.putrequest("POST", "/decode", skip_accept_encoding=True)
        all_headers = {"Content-Type": "application/json", "Content-Length": str(len(raw))}
        for name, value in (all_headers | headers).items():
            conn.putheader(name, value.encode("latin-1"))
        conn.endheaders(raw)
        response = conn.getresponse()  # an answer, not a dropped connection
        assert response.status < 500 and json.loads(response.read()), headers
        conn.close()
    status, _, _ = call(codec_server, "POST", "/decode", {"payloads": [sealed]})
    assert status == 200  # still well


def test_codec_server_refuses_many_payloads_before_it_parses_them(
    codec_server: CodecServer,
) -> None:
    tiny = {"payloads": [{}] * 200_000}  # 0.6 MB, millions of objects were it parsed
    status, _, body = call(codec_server, "POST", "/decode", tiny)
    assert status == 413 and "too many payloads" in body["error"]
    plain = as_json(json_payload("x"))
    for crowded in (
        [plain | {"metadata": {str(n): "" for n in range(33)}}],  # one payload's entries
        [plain | {"metadata": {str(n): "" for n in range(30)}}] * 140,  # a request's
        [plain | {"metadata": {"k" * 257: ""}}],
        [plain | {"metadata": {"encoding": "A" * 8193}}],
    ):
        status, _, body = call(codec_server, "POST", "/decode", {"payloads": crowded})
        assert status == 413, body
    many = {"payloads": [as_json(json_payload("x"))] * 500}
    status, _, body = call(codec_server, "POST", "/encode", many)
    assert status == 200 and len(body["payloads"]) == 500


def read_until_closed(sock: socket.socket, deadline_s: float) -> bytes:
    """What the server sends until it closes the connection; fails if it is still open
    after `deadline_s`."""
    started = time.monotonic()
    sock.settimeout(deadline_s)
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(4096):
            got += chunk
    assert time.monotonic() - started < deadline_s, "still open"
    return got


HEAD = (
    b"POST /decode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n"
)


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param(b"", id="nothing"),
        pytest.param(HEAD[:30], id="half-the-headers"),
        pytest.param(HEAD + b"{", id="one-byte-of-the-body"),
    ],
)
def test_codec_server_gives_a_request_a_deadline_whatever_its_pace(sent: bytes) -> None:
    """A request must arrive whole within the server's request timeout, counted from
    the moment the connection is ready for it: a peer that sends nothing, stops, or
    sends a byte now and then (each well within the timeout) is closed then."""
    server = build_server(KeyRing.parse(new_key()), port=0, request_timeout=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    try:
        with socket.create_connection((str(host), port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(sent)
            closed = False
            while not closed and time.monotonic() - started < 6:
                time.sleep(0.3)
                try:
                    sock.sendall(b" ")
                    readable, _, _ = select.select([sock], [], [], 0)
                    closed = bool(readable)
                except OSError:
                    closed = True
            answer = read_until_closed(sock, 10)
            assert time.monotonic() - started < 4, "the trickle kept the connection open"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:80]
        status, _, _ = call(server, "GET", "/health")
        assert status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_codec_server_refuses_chunked_doubled_lengths_and_long_headers(
    codec_server: CodecServer,
) -> None:
    host, port = codec_server.server_address[:2]
    for extra, status in (
        (b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n", b"400"),
        (b"Transfer-Encoding: chunked\r\n", b"400"),
        (b"Content-Length: 2\r\nContent-Length: 3\r\n", b"411"),
        (b"".join(b"X-Filler-%d: %s\r\n" % (n, b"x" * 1000) for n in range(40)), b"431"),
    ):
        with socket.create_connection((str(host), port), timeout=10) as sock:
            sock.sendall(
                b"POST /decode HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\n" + extra + b"\r\n{}"
            )
            answer = read_until_closed(sock, 5)
        assert answer.split(b" ")[1] == status, (extra[:60], answer[:80])


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1"])
def test_codec_server_answers_only_to_its_host_names_on_every_loopback_address(
    host: str,
) -> None:
    server = build_server(KeyRing.parse(new_key()), host=host, port=0, origins=[UI_ORIGIN])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        for name in ("localhost", f"localhost:{port}", host if ":" not in host else f"[{host}]"):
            status, _, _ = call(server, "GET", "/health", headers={"Host": name})
            assert status == 200, name
        sealed = as_json(EncryptionCodec(server.codec.ring).encrypt(json_payload("hi")))
        for rebound in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            for method, path, body in (
                ("GET", "/health", None),
                ("POST", "/decode", {"payloads": [sealed]}),
            ):
                status, headers, answer = call(
                    server, method, path, body, {"Host": rebound, "Origin": UI_ORIGIN}
                )
                assert status == 400 and "host name" in answer["error"], (rebound, method)
                assert "Access-Control-Allow-Origin" not in headers
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_codec_server_beyond_loopback_needs_host_names_and_a_token(host: str) -> None:
    ring = KeyRing.parse(new_key())
    refusals: list[tuple[dict[str, Any], list[str]]] = [
        ({}, ["AGENT_CODEC_HOSTS", "AGENT_CODEC_TOKEN"]),
        ({"token": "t"}, ["AGENT_CODEC_HOSTS"]),
        ({"hosts": ["codec.example"]}, ["AGENT_CODEC_TOKEN"]),
        ({"open_network": True}, ["AGENT_CODEC_HOSTS"]),
    ]
    for settings, missing in refusals:
        with pytest.raises(EncryptionConfigError) as refused:
            build_server(ring, host=host, port=0, **settings)
        assert all(name in str(refused.value) for name in missing), refused.value
    server = build_server(ring, host=host, port=0, token="t", hosts=["codec.example"])
    server.server_close()
    server = build_server(ring, host=host, port=0, hosts=["localhost"], open_network=True)
    server.server_close()


def test_codec_server_turns_away_connections_beyond_its_limit() -> None:
    """Each connection has a thread: beyond the limit one gets a 503 saying to try
    again, at once; when the others go, it is served again."""
    server = build_server(KeyRing.parse(new_key()), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS):
            idle.append(socket.create_connection((str(host), port), timeout=10))
        deadline = time.monotonic() + 20
        while True:  # the server takes the idle connections one by one
            status, headers, body = call(server, "GET", "/health")
            if status == 503:
                break
            assert time.monotonic() < deadline, "never turned away"
            time.sleep(0.05)
        assert "busy" in body["error"] and headers["Retry-After"] == "1"
        for sock in idle:
            sock.close()
        deadline = time.monotonic() + 20
        while call(server, "GET", "/health")[0] != 200:
            assert time.monotonic() < deadline, "still busy after the others left"
            time.sleep(0.05)
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()
        server.server_close()


def peak_and_now_mb(pid: int) -> tuple[float, float]:
    """A process's peak resident memory and its resident memory now, in MB (Linux)."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmHWM"].split()[0]) / 1024, int(fields["VmRSS"].split()[0]) / 1024


MEMORY_BOUND_MB = 150
"""What a codec server may grow by under the heaviest requests, many at once (a body
of 690,000 metadata entries alone took 320 MB before it was bounded)."""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_codec_server_memory_stays_bounded_whatever_the_requests() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent.runtime.codec_server", "--port", str(port)],
        cwd=ROOT,
        env=env | {"AGENT_ENCRYPTION_KEY": "k1:" + new_key()},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )

    def post(path: str, body: bytes) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    try:
        assert proc.stdout is not None and "codec server on" in proc.stdout.readline()
        plain = json.dumps({"payloads": [as_json(json_payload("x"))]}).encode()
        assert post("/encode", plain) == 200  # everything it imports is in
        _, before = peak_and_now_mb(proc.pid)

        entries = ",".join(f'"{i}":""' for i in range(690_000))
        metadata = f'{{"payloads":[{{"metadata":{{{entries}}}}}]}}'.encode()  # 8.2 MB
        tiny = ('{"payloads":[' + ",".join(["{}"] * 2_700_000) + "]}").encode()  # 8.1 MB
        deep = b"[" * 8_000_000
        blob = Payload(metadata={"encoding": b"binary/plain"}, data=os.urandom(5_900_000))
        large = json.dumps({"payloads": [as_json(blob)]}).encode()  # 7.9 MB, allowed
        heavy = [("/decode", metadata), ("/decode", tiny), ("/decode", deep), ("/encode", large)]
        assert [post(path, body) for path, body in heavy] == [413, 413, 413, 200]

        statuses: list[int | str] = []

        def post_once(path: str, body: bytes) -> None:
            try:
                statuses.append(post(path, body))
            except ConnectionResetError:
                # A refusal's lingering close is bounded (LINGER_S idle, LINGER_MAX_S in
                # all): a peer still sending a refused body past it is reset, as on a
                # machine this loaded (16 bodies of 8 MB at once) it may be.
                statuses.append("reset")

        threads = [
            threading.Thread(target=post_once, args=(path, body)) for path, body in heavy * 4
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert len(statuses) == len(threads), statuses
        assert set(statuses) <= {200, 413, 503, "reset"}, statuses

        peak, _ = peak_and_now_mb(proc.pid)
        assert peak - before < MEMORY_BOUND_MB, f"grew {peak - before:.0f} MB"
        assert post("/decode", plain) == 200  # still well
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_codec_server_listens_on_ipv6_loopback() -> None:
    server = build_server(KeyRing.parse(new_key()), host="::1", port=0, origins=[UI_ORIGIN])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, _, body = call(server, "GET", "/health")
        assert status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_codec_server_with_a_token_needs_it_except_for_preflight() -> None:
    server = build_server(
        KeyRing.parse(new_key()), port=0, origins=[UI_ORIGIN], token="s3cret-token"
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ui = {"Origin": UI_ORIGIN}
        status, headers, _ = call(server, "OPTIONS", "/decode", headers=ui)
        assert status == 204
        for auth in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "s3cret-token"},
            {"Authorization": "Bearer s3cret-t\u00f6ken"},  # not ASCII: still just wrong
        ):
            status, headers, body = call(server, "POST", "/decode", {"payloads": []}, ui | auth)
            assert status == 401, auth
            assert headers["Access-Control-Allow-Origin"] == UI_ORIGIN  # the UI shows why
        ok = ui | {"Authorization": "Bearer s3cret-token"}
        status, _, body = call(server, "POST", "/decode", {"payloads": []}, ok)
        assert status == 200 and body == {"payloads": []}
    finally:
        server.shutdown()
        server.server_close()


def test_codec_server_command_needs_a_key_and_serves_with_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    out = subprocess.run(
        [sys.executable, "-m", "durable_agent.runtime.codec_server", "--port", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and "set AGENT_ENCRYPTION_KEY" in out.stderr

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent.runtime.codec_server", "--port", str(port)],
        cwd=ROOT,
        env=env | {"AGENT_ENCRYPTION_KEY": "k9:" + new_key()},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "keys: k9" in proc.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            assert resp.status == 200
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- a real turn, encrypted end to end -----------------------------------------------

QUESTION = "Which item was ordered for 123456?"
CUSTOMER_TEXT = (QUESTION, "123456", "Herbal Handsoap")


def readable(history: Any, needles: tuple[str, ...]) -> set[str]:
    """The needles readable anywhere in a history: in any string as it stands, or in
    any string that is base64 (how payload data and metadata appear in JSON)."""
    found: set[str] = set()

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                visit(v)
        elif isinstance(value, list):
            for v in value:
                visit(v)
        elif isinstance(value, str):
            texts = [value]
            with contextlib.suppress(binascii.Error, ValueError):
                texts.append(base64.b64decode(value, validate=True).decode("utf-8", "replace"))
            found.update(n for n in needles for t in texts if n in t)

    visit(history)
    return found


def show(address: str, workflow_id: str, *extra: str) -> Any:
    """`temporal workflow show --output json`: the history as the server stores it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    out = subprocess.run(
        [
            temporal_cli(),
            "workflow",
            "show",
            "--address",
            address,
            "-w",
            workflow_id,
            "--output",
            "json",
            *extra,
        ],
        env=env | {"TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def worker_process(env: dict[str, str]) -> subprocess.Popen[str]:
    """`python worker.py` as a deployment runs it: every setting from the environment."""
    proc = subprocess.Popen(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "worker ready" in line, line + (proc.stderr.read() if proc.stderr else "")
    return proc


async def test_encrypted_turn_stores_no_customer_text_and_the_codec_server_reads_it(
    env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = env.client.service_client.config.target_host
    key = "k1:" + new_key()
    task_queue = f"encrypted-{uuid.uuid4().hex[:8]}"
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    }
    worker = worker_process(
        base
        | {
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_CONFIG_FILE": str(tmp_path / "no-temporal.toml"),
            "AGENT_ENCRYPTION_KEY": key,
            "AGENT_TASK_QUEUE": task_queue,
            "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
            "AGENT_STATE_DIR": str(tmp_path / "state"),
        }
    )
    try:
        # The client side, through the same settings `client.py ask` reads.
        monkeypatch.setenv("TEMPORAL_ADDRESS", address)
        monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "no-temporal.toml"))
        monkeypatch.setenv("AGENT_ENCRYPTION_KEY", key)
        conn = await connect()
        handle = await start_turn(conn.client, TurnInput(question=QUESTION), task_queue)
        result = await handle.result()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert result.outcome is Outcome.ANSWERED
    assert "Herbal Handsoap" in result.answer

    stored = show(address, handle.id)
    assert readable(stored, CUSTOMER_TEXT) == set()
    started = stored["events"][0]["workflowExecutionStartedEventAttributes"]
    [turn_input] = started["input"]["payloads"]
    assert base64.b64decode(turn_input["metadata"]["encoding"]) == ENCODING

    server = build_server(KeyRing.parse(key), port=0, origins=[UI_ORIGIN])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # What the Web UI posts for the turn's input, from the operator's browser.
        status, headers, body = call(
            server,
            "POST",
            "/decode",
            {"payloads": [turn_input]},
            {"Origin": UI_ORIGIN, "X-Namespace": "default"},
        )
        assert status == 200 and headers["Access-Control-Allow-Origin"] == UI_ORIGIN
        assert QUESTION in data_of(body["payloads"][0]).decode()
        # The whole history through the same endpoint, as the UI and the CLI decode it:
        # the question, the order's data and the summaries are all readable again.
        decoded = show(address, handle.id, "--codec-endpoint", server.url)
        assert readable(decoded, CUSTOMER_TEXT) == set(CUSTOMER_TEXT)
    finally:
        server.shutdown()
        server.server_close()


def test_embedded_server_points_its_web_ui_at_the_codec_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_ENCRYPTION_KEY", new_key())
    monkeypatch.setenv("AGENT_CODEC_ENDPOINT", "http://localhost:18888")
    server = EmbeddedServer(tmp_path / "temporal.db", port=free_port(), ui_port=free_port())
    server.start()
    try:
        url = f"http://127.0.0.1:{server.ui_port}/api/v1/settings"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    settings = json.load(resp)
                break
            except OSError:
                assert time.monotonic() < deadline, "the Web UI did not answer in 30 s"
                time.sleep(0.2)
        assert settings["Codec"]["Endpoint"] == "http://localhost:18888"
    finally:
        server.stop()


async def test_payloads_leave_defaults_out_and_read_back_the_same() -> None:
    call = ToolCall(id="call_1", name="order_status", arguments={"order_id": "123456"})
    request = PlanInput(
        model="offline",
        messages=[
            UserMessage(text="Has order 123456 shipped?"),
            AssistantMessage(calls=[call]),
            ToolResult(call_id="call_1", tool="order_status", ok=True, text="shipped"),
        ],
    )
    [payload] = await LEAN_DATA_CONVERTER.encode([request])
    assert b"null" not in payload.data and b"[]" not in payload.data  # no default written
    assert payload.data.count(b'"role"') == 3  # the union's tags always are
    assert await LEAN_DATA_CONVERTER.decode([payload], [PlanInput]) == [request]
    # and what the SDK's own pydantic converter wrote still reads
    [full] = await pydantic_data_converter.encode([request])
    assert len(full.data) > len(payload.data)
    assert await LEAN_DATA_CONVERTER.decode([full], [PlanInput]) == [request]
