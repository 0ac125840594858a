"""Large payloads outside the history (`durable_agent/runtime/storage.py`): stored by
one worker, read by the next after a SIGKILL; encrypted in the store; references
resolved where people read turns; deleted with their workflow's history."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import subprocess
import sys
import threading
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from pydantic import BaseModel
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentClient
from durable_agent.model import Reply
from durable_agent.render import MAX_OBSERVATION_CHARS
from durable_agent.runtime.codec import EncryptionCodec, KeyRing, data_converter
from durable_agent.runtime.codec_server import build_server
from durable_agent.runtime.storage import (
    FolderStorageDriver,
    StorageConfigError,
    external_storage,
    keep_swept,
    retention_of,
    sweep,
)
from durable_agent.runtime.turns import start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import ShopStore
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, ToolCall, TurnInput
from tests.conftest import Harness
from tests.test_codec import UI_ORIGIN, as_json, call, new_key
from tests.test_crash import ROOT, wait_for


class Nothing(BaseModel):
    pass


def _spawn(env: WorkflowEnvironment, environ: dict[str, str], *args: str) -> subprocess.Popen[str]:
    address = env.client.service_client.config.target_host
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.worker", address, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | environ,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def test_a_payload_one_worker_stored_is_read_by_the_next_and_is_encrypted(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    store = tmp_path / "payloads"
    environ = {
        "AGENT_ENCRYPTION_KEY": key,
        "AGENT_PAYLOAD_STORE": f"local:{store}",
        "AGENT_PAYLOAD_THRESHOLD": "0",  # every payload: the store, not the history
    }
    converter = data_converter(environ)
    client = await Client.connect(
        env.client.service_client.config.target_host, data_converter=converter
    )
    task_queue = f"stored-{uuid.uuid4().hex[:6]}"
    db, log, marker = tmp_path / "shop.db", tmp_path / "activities.log", tmp_path / "hung"
    ShopStore(db)
    first = _spawn(
        env, environ, task_queue, str(db), "--log", str(log), "--crash-after", "interpret",
        "--marker", str(marker),
    )  # fmt: skip
    second = None
    try:
        turn = TurnInput(question="Has order 123456 shipped?")
        handle = await start_turn(client, turn, task_queue)
        await wait_for(marker)
        stored_before = {p for p in store.rglob("*") if p.is_file()}
        first.kill()
        first.wait()
        second = _spawn(env, environ, task_queue, str(db), "--log", str(log))
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        for proc in (first, second):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert result.outcome is Outcome.ANSWERED and "shipped on 2026-11-18" in result.answer
    assert Counter(log.read_text().split())["interpret"] == 2
    # The second worker read what the first stored: the turn's input and first steps.
    assert stored_before and all(p.exists() for p in stored_before)
    files = [p for p in store.rglob("*") if p.is_file()]
    assert len(files) > len(stored_before)
    for path in files:
        data = path.read_bytes()
        assert b"123456" not in data and b"2026-11-18" not in data
    # The history holds references only, and no plaintext either.
    history = await handle.fetch_history()
    assert b"123456" not in _raw(history)


async def test_retention_deletes_the_payloads_of_closed_workflows_only(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    environ = {"AGENT_PAYLOAD_STORE": f"local:{tmp_path}", "AGENT_PAYLOAD_THRESHOLD": "0"}
    storage = external_storage(environ)
    assert storage is not None
    driver = storage.drivers[0]
    assert isinstance(driver, FolderStorageDriver)
    client = await Client.connect(
        env.client.service_client.config.target_host, data_converter=data_converter(environ)
    )
    # Stored for a workflow that never ran here (closed and gone), and for one running.
    running = await client.start_workflow(
        "NoSuchWorkflow", "x" * 100, id=f"running-{uuid.uuid4().hex[:6]}", task_queue="nobody"
    )
    await client.start_workflow(
        "NoSuchWorkflow", "y" * 100, id="gone-" + uuid.uuid4().hex[:6], task_queue="nobody"
    )
    gone_id = [wf for _, wf, _ in driver.workflows() if wf.startswith("gone-")][0]
    await client.get_workflow_handle(gone_id).terminate()
    assert {wf for _, wf, _ in driver.workflows()} == {running.id, gone_id}
    # Within the retention: nothing goes; past it, only the closed workflow's payloads.
    assert await sweep(client, driver, timedelta(days=1)) == []
    assert await sweep(client, driver, timedelta(0)) == [gone_id]
    assert {wf for _, wf, _ in driver.workflows()} == {running.id}
    await running.terminate()


async def test_a_worker_keeps_the_store_swept_after_the_namespaces_retention(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    environ = {"AGENT_PAYLOAD_STORE": f"local:{tmp_path}", "AGENT_PAYLOAD_THRESHOLD": "0"}
    storage = external_storage(environ)
    assert storage is not None and isinstance(driver := storage.drivers[0], FolderStorageDriver)
    client = await Client.connect(
        env.client.service_client.config.target_host, data_converter=data_converter(environ)
    )
    # The namespace's retention, unless the setting names another.
    assert await retention_of(client, {}) > timedelta(0)
    assert await retention_of(client, {"AGENT_PAYLOAD_RETENTION": "36h"}) == timedelta(hours=36)
    with pytest.raises(StorageConfigError, match="AGENT_PAYLOAD_RETENTION"):
        await retention_of(client, {"AGENT_PAYLOAD_RETENTION": "a week"})
    closed = await client.start_workflow(
        "NoSuchWorkflow", "z" * 100, id=f"closed-{uuid.uuid4().hex[:6]}", task_queue="nobody"
    )
    await closed.terminate()
    sweeping = asyncio.create_task(
        keep_swept(client, driver, timedelta(0), every=timedelta(milliseconds=50))
    )

    async def swept() -> None:
        while any(wf == closed.id for _, wf, _ in driver.workflows()):
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(swept(), 60)
    finally:
        sweeping.cancel()


async def test_the_codec_server_resolves_references_to_stored_payloads(tmp_path: Path) -> None:
    ring = KeyRing.parse(f"k1:{new_key()}")
    environ = {"AGENT_PAYLOAD_STORE": f"local:{tmp_path}", "AGENT_PAYLOAD_THRESHOLD": "0"}
    storage = external_storage(environ)
    converter = dataclasses.replace(data_converter(environ), payload_codec=EncryptionCodec(ring))
    [reference] = await converter.encode(["the customer said 123456"])
    assert reference.external_payloads  # what the history holds
    server = build_server(ring, port=0, origins=[UI_ORIGIN], storage=storage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        status, _, body = await asyncio.to_thread(
            call, server, "POST", "/decode", {"payloads": [as_json(reference)]}
        )
        assert status == 200, body
        assert base64.b64decode(body["payloads"][0]["data"]) == b'"the customer said 123456"'
        (tmp_path / "x").write_text("")  # a key that leaves the store is refused
        forged = as_json(reference)
        status, _, body = await asyncio.to_thread(
            call, server, "POST", "/decode", {"payloads": [_claiming(forged, "../x")]}
        )
        assert status == 404, body
    finally:
        server.shutdown()
        server.server_close()


def _claiming(reference: dict[str, Any], key: str) -> dict[str, Any]:
    data = json.loads(base64.b64decode(reference["data"]))
    data["claimData"]["key"] = key
    return {**reference, "data": base64.b64encode(json.dumps(data).encode()).decode()}


async def test_the_s3_store_holds_the_payloads_a_turn_refers_to(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`AGENT_PAYLOAD_STORE=s3://BUCKET`: Temporal's S3 driver, over boto3, against
    moto's S3. The history holds references; the bucket holds the payloads, under the
    turn's workflow id, encrypted; a client of its own reads the turn's result."""
    from moto import mock_aws

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AGENT_PAYLOAD_STORE", "s3://agent-payloads"),
        ("AGENT_ENCRYPTION_KEY", base64.b64encode(os.urandom(32)).decode()),
    ):
        monkeypatch.setenv(name, value)

    @tool
    def dump(args: Nothing, ctx: ToolContext[object]) -> dict[str, str]:
        """Returns far too much."""
        return {"log": "secret-line " * 30_000}

    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="agent-payloads")
        config = harness.client.config()
        config["data_converter"] = data_converter()
        stored = Harness(Client(**config), harness.store)
        model = ScriptedModel(
            plans=[Reply(calls=[ToolCall(id="c1", name="dump")])], decisions=[Reply(text="ok")]
        )
        result, handle = await stored.ask_with_handle(
            "anything", model=model, tools=ToolRegistry([dump])
        )
        assert result.outcome is Outcome.ANSWERED and result.answer == "ok"
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="agent-payloads")["Contents"]]
        bodies = [s3.get_object(Bucket="agent-payloads", Key=k)["Body"].read() for k in keys]
        history = await handle.fetch_history()
        config["data_converter"] = data_converter()  # another client, as client.py is
        again = await AgentClient(Client(**config)).turn(handle.id).result()
        size = await AgentClient(Client(**config)).turn(handle.id).size()
    assert keys and all(f"/wi/{handle.id}/" in k for k in keys)
    # What the model read of the result (its 100,000 characters) is in the bucket once,
    # in the dispatch's result (the model call that carried it names it there)...
    assert MAX_OBSERVATION_CHARS < sum(map(len, bodies)) < 1.5 * MAX_OBSERVATION_CHARS
    assert not any(b"secret-line" in b for b in bodies)  # ...encrypted
    assert max(e.ByteSize() for e in history.events) < 16 * 1024  # references only
    assert b"secret-line" not in _raw(history)
    assert again.answer == "ok" and again.steps == result.steps
    # What `show` says of it: the bucket's bytes under the turn, listed.
    assert size.stored_bytes == sum(map(len, bodies)) and size.runs == 1
    assert "s3://agent-payloads" in size.stores


def test_an_s3_store_needs_a_bucket_name() -> None:
    for spec in ("s3://", "s3://Bad_Bucket", "s3:/x"):
        try:
            external_storage({"AGENT_PAYLOAD_STORE": spec})
        except StorageConfigError as e:
            assert "s3://a-bucket" in str(e)
        else:
            raise AssertionError(f"{spec} was taken")


def _raw(history: WorkflowHistory) -> bytes:
    """The history's events as the server keeps them: a payload's data is raw bytes
    there (its JSON form has them in base64, where no plaintext could ever be seen)."""
    return b"".join(event.SerializeToString() for event in history.events)
