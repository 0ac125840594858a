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

from activities.plan import PlanInput
from client import start_turn
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
from durable_agent.runtime.codec_server import CodecServer, build_server
from durable_agent.runtime.server import (
    EmbeddedServer,
    ServerUnavailable,
    connect,
    free_port,
    temporal_cli,
)
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
    assert data_converter({}) is LEAN_DATA_CONVERTER
    converter = data_converter({"AGENT_ENCRYPTION_KEY": new_key()})
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
    many = {"payloads": [as_json(json_payload("x"))] * 500}
    status, _, body = call(codec_server, "POST", "/encode", many)
    assert status == 200 and len(body["payloads"]) == 500


def test_codec_server_closes_a_stalled_connection(
    codec_server: CodecServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent.runtime import codec_server as module

    monkeypatch.setattr(module.CodecHandler, "timeout", 0.5)
    host, port = codec_server.server_address[:2]
    with socket.create_connection((str(host), port), timeout=10) as sock:
        sock.sendall(b"POST /decode HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        started = time.monotonic()
        while sock.recv(4096):  # an answer, then the close; or the close at once
            pass
        assert time.monotonic() - started < 5
    status, _, _ = call(codec_server, "GET", "/health")
    assert status == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_codec_server_beyond_loopback_needs_a_token(host: str) -> None:
    ring = KeyRing.parse(new_key())
    with pytest.raises(EncryptionConfigError, match="AGENT_CODEC_TOKEN"):
        build_server(ring, host=host, port=0)
    server = build_server(ring, host=host, port=0, token="t")
    server.server_close()
    server = build_server(ring, host=host, port=0, open_network=True)
    server.server_close()


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
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
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
