"""The payload store trusts nothing and leaves no turn stuck (`durable_agent/runtime/
storage.py`): a stored payload deleted, altered, never written or refused ends its turn
within seconds with an outcome and one line, and is never served; a process that stores
nothing still reads what others stored; sweeping keeps the payloads of running workflows,
whatever their ids; instructions too large to carry end the turn at once."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.converter import (
    ActivitySerializationContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
    WorkflowSerializationContext,
)
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, AgentClient, answers
from durable_agent.bounds import MAX_INSTRUCTIONS_CHARS
from durable_agent.errors import PayloadUnavailable
from durable_agent.model import Reply
from durable_agent.runtime.codec import KeyRing, data_converter
from durable_agent.runtime.codec_server import build_server
from durable_agent.runtime.storage import external_storage, storing_folder, sweep
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import ShopStore
from durable_agent.types import Outcome, StepKind, ToolCall
from durable_agent.workflows import search
from tests.conftest import Harness, last_result
from tests.test_codec import UI_ORIGIN, call, new_key

ROOT = Path(__file__).resolve().parent.parent
LOOKUP = ToolCall(id="c1", name="order_status", arguments={"order_id": "234567"})
RETURN = ToolCall(
    id="c2", name="start_return", arguments={"order_id": "123456", "reason": "arrived damaged"}
)
ENDS_WITHIN_S = 20.0
"""A turn whose payload cannot be had ends within this (a busy machine, model retries)."""


def stored_in(folder: Path, threshold: str = "0", **more: str) -> dict[str, str]:
    """Settings of a process that stores every payload in `folder`."""
    return {
        "AGENT_PAYLOAD_STORE": f"local:{folder}",
        "AGENT_PAYLOAD_THRESHOLD": threshold,
        "AGENT_STATE_DIR": str(folder.parent / "state"),
        **more,
    }


def client_with(env: WorkflowEnvironment, environ: dict[str, str]) -> Client:
    """A client of the test server whose converter reads (and stores) as `environ` says."""
    config = env.client.config()
    config["data_converter"] = data_converter(environ)
    return Client(**config)


def files_holding(folder: Path, text: bytes) -> list[Path]:
    """The stored payloads (not the folders' `.workflow` files) whose bytes hold `text`."""
    return [
        p
        for p in folder.rglob("*")
        if p.is_file() and not p.name.startswith(".") and text in p.read_bytes()
    ]


async def cli(
    env: WorkflowEnvironment, environ: dict[str, str], *args: str
) -> subprocess.CompletedProcess:
    """`client.py ARGS` against the test server, with `environ`'s payload settings only
    (in a thread: a worker of the test's goes on meanwhile)."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TEMPORAL_", "OTEL_", "AGENT_PAYLOAD_", "AGENT_STATE_DIR"))
    }
    clean.update(
        TEMPORAL_ADDRESS=env.client.service_client.config.target_host,
        TEMPORAL_CONFIG_FILE="/nonexistent/temporal.toml",
        **environ,
    )
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "client.py", *args],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


async def until_waiting(turn: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await turn.pending():
        assert time.monotonic() < deadline, "the turn never asked for consent"
        await asyncio.sleep(0.1)


def lookup_then_return() -> ScriptedModel:
    """Reads an order (its result stored), then starts a return, which waits for consent."""
    return ScriptedModel(
        plans=[Reply(calls=[LOOKUP])],
        decisions=[Reply(calls=[RETURN]), lambda req: Reply(text=last_result(req))],
    )


async def first_event(handle: Any) -> Any:
    async for event in handle.fetch_history_events(page_size=1):
        return event
    raise AssertionError("no history")


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("harm", ["deleted", "altered"])
async def test_a_lost_payload_ends_the_running_turn_with_its_outcome_and_line(
    env: WorkflowEnvironment, store: ShopStore, tmp_path: Path, harm: str
) -> None:
    """A tool result stored while the turn ran, then deleted or altered in the store: at
    its next step the worker reads the history again (a worker without a cache does so
    every time; any worker after a restart), and the turn ends at once, saying which
    payload, which store and what to do; `show` says so in one line."""
    payloads = tmp_path / "payloads"
    environ = stored_in(payloads)
    harness = Harness(client_with(env, environ), store)
    async with harness.worker(lookup_then_return(), max_cached_workflows=0) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        turn = await agents.start("Return order 123456, it arrived damaged.", model="scripted")
        await until_waiting(turn)
        harmed = files_holding(payloads, b"234567")  # the read's call and its result
        assert harmed
        for path in harmed:
            path.unlink() if harm == "deleted" else _flip(path)
        # No worker can replay the turn to answer `show`'s query: it says why, one line.
        running = await cli(env, environ, "--task-queue", task_queue, "show", turn.id)
        assert running.returncode == 1 and "Traceback" not in running.stderr, running.stderr
        assert running.stderr.strip().splitlines()[-1].startswith("error: stored payload sha256:")
        started = time.monotonic()
        with contextlib.suppress(Exception):  # the decision meets a turn that ends under it
            await turn.approve(RETURN.id, by="test")
        result = await asyncio.wait_for(turn.result(), ENDS_WITHIN_S)
        took = time.monotonic() - started
        # Its story can no longer be replayed: read, it ends, and `result` says the rest.
        assert [s async for s in turn.events()] == []

    assert result.outcome is Outcome.PAYLOAD_UNAVAILABLE, result
    assert result.answer == answers.PAYLOAD_UNAVAILABLE
    (step,) = result.steps
    assert step.kind is StepKind.LIMIT
    said = {"deleted": "is not in the payload store", "altered": "does not match its hash"}
    assert said[harm] in step.text and str(payloads) in step.text
    assert f"of workflow {turn.id}" in step.text and "sha256:" in step.text
    if harm == "deleted":
        assert "every process must use the same AGENT_PAYLOAD_STORE" in step.text
    assert took < ENDS_WITHIN_S
    assert store.returns_for("123456") == []  # the write never ran
    # It awaits nothing now, and listing the calls that do is not broken by it (its
    # status stayed `awaiting_approval`, its memo unreadable).
    assert turn.id not in [p.workflow_id for p in await agents.pending()]

    shown = await cli(env, environ, "--task-queue", task_queue, "show", turn.id)
    assert shown.returncode == 3, shown.stderr  # ended without an answer
    assert "Traceback" not in shown.stderr
    assert f"answer (payload_unavailable): {answers.PAYLOAD_UNAVAILABLE}" in shown.stdout
    assert said[harm] in shown.stdout


async def test_an_altered_tool_result_is_never_served_by_replay(
    env: WorkflowEnvironment, store: ShopStore, tmp_path: Path
) -> None:
    """`replay` answers calls from the record: a recorded result altered in the store is
    refused, in one line, and the replay never starts."""
    payloads = tmp_path / "payloads"
    environ = stored_in(payloads)
    harness = Harness(client_with(env, environ), store)
    model = ScriptedModel(
        plans=[Reply(calls=[LOOKUP])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with harness.worker(model) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        original = await agents.ask("Where is order 234567?", model="scripted")
        assert original.outcome is Outcome.ANSWERED
        for path in files_holding(payloads, b"234567"):
            _flip(path)
        with pytest.raises(PayloadUnavailable, match="does not match its hash"):
            await agents.replay(original.workflow_id)
        replayed = await cli(
            env, environ, "--task-queue", task_queue, "replay", original.workflow_id
        )
    assert replayed.returncode == 1
    assert "Traceback" not in replayed.stderr
    (line,) = replayed.stderr.strip().splitlines()
    assert line.startswith("error: stored payload sha256:") and "does not match its hash" in line
    listed = [
        w
        async for w in harness.client.list_workflows(
            f"WorkflowId = '{original.workflow_id}-replay-1'"
        )
    ]
    assert listed == []  # no replay started


async def test_a_process_that_stores_nothing_reads_what_a_worker_stored(
    env: WorkflowEnvironment, store: ShopStore, tmp_path: Path
) -> None:
    """Storing is the only setting: the worker stores in the state folder's store
    (`local`); a client with the store off, on the same state folder, reads the turn;
    one on another folder says in one line what it cannot read."""
    state = tmp_path / "state"
    worker_env = {"AGENT_PAYLOAD_STORE": "local", "AGENT_PAYLOAD_THRESHOLD": "0"}
    harness = Harness(client_with(env, {**worker_env, "AGENT_STATE_DIR": str(state)}), store)
    model = ScriptedModel(
        plans=[Reply(calls=[LOOKUP])], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with harness.worker(model) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        asked = await agents.ask("Where is order 234567?", model="scripted")
    assert files_holding(state / "payloads", b"234567")

    reader = client_with(env, {"AGENT_PAYLOAD_STORE": "off", "AGENT_STATE_DIR": str(state)})
    again = await AgentClient(reader, task_queue=task_queue).turn(asked.workflow_id).result()
    assert again.answer == asked.answer and again.steps == asked.steps
    shown = await cli(env, {"AGENT_STATE_DIR": str(state)}, "show", asked.workflow_id)
    assert shown.returncode == 0, shown.stderr
    assert f"answer (answered): {asked.answer}" in shown.stdout

    elsewhere = {"AGENT_STATE_DIR": str(tmp_path / "elsewhere")}
    with pytest.raises(PayloadUnavailable, match="every process must use the same"):
        await AgentClient(client_with(env, elsewhere)).turn(asked.workflow_id).result()
    shown = await cli(env, elsewhere, "show", asked.workflow_id)
    assert shown.returncode == 1 and "Traceback" not in shown.stderr
    (line,) = shown.stderr.strip().splitlines()
    assert (
        line.startswith("error: stored payload sha256:") and "is not in the payload store" in line
    )


def unwritable(tmp_path: Path) -> Path:
    """A store folder no process can create (its parent is a file), root or not."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the store's folder would be")
    return blocker / "payloads"


async def test_a_store_that_refuses_writes_ends_the_turn_not_a_stuck_task(
    env: WorkflowEnvironment, store: ShopStore, tmp_path: Path
) -> None:
    """The worker's store refuses every write (a read-only or full disk): its turn ends
    at its first step, and its result says why in one line. A client whose store refuses
    the turn's input: the worker ends the turn at once, with its outcome and line."""
    good = tmp_path / "payloads"
    asker = client_with(env, stored_in(good))
    worker_env = stored_in(unwritable(tmp_path), AGENT_PAYLOAD_READ=f"local:{good}")
    harness = Harness(client_with(env, worker_env), store)
    model = ScriptedModel(plans=[Reply(text="never said")])
    async with harness.worker(model) as task_queue:
        turn = await AgentClient(asker, task_queue=task_queue).start("Hello?", model="scripted")
        with pytest.raises(PayloadUnavailable, match="was never stored") as raised:
            await asyncio.wait_for(turn.result(), ENDS_WITHIN_S)
        assert "Not a directory" in str(raised.value) and "make the store writable" in str(
            raised.value
        )
        described = await turn.temporal.describe()
        assert described.status is not None and described.status.name == "COMPLETED"
        assert described.typed_search_attributes.get(search.OUTCOME) == "payload_unavailable"

        (tmp_path / "client").mkdir()
        refusing_env = stored_in(unwritable(tmp_path / "client"))
        refusing = client_with(env, refusing_env)
        turn = await AgentClient(refusing, task_queue=task_queue).start("Hi?", model="scripted")
        result = await asyncio.wait_for(turn.result(), ENDS_WITHIN_S)
        asked = await cli(
            env, refusing_env, "--task-queue", task_queue, "ask", "Hi?", "--model", "scripted"
        )
    assert result.outcome is Outcome.PAYLOAD_UNAVAILABLE
    (step,) = result.steps
    assert "was never stored" in step.text and "Not a directory" in step.text
    assert asked.returncode == 3 and "Traceback" not in asked.stderr, asked.stderr
    assert f"answer (payload_unavailable): {answers.PAYLOAD_UNAVAILABLE}" in asked.stdout


async def test_instructions_too_large_to_carry_end_the_turn_at_once(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """3 MB of instructions would be a payload Temporal refuses, the turn retrying its
    task forever; over the bound, the turn ends at its first step, as a failed
    instructions function does: the step says so by its kind, the operator's log says
    by how much."""
    model = ScriptedModel(plans=[Reply(text="never asked")])
    agent = Agent(
        name="verbose",
        instructions=lambda context, deps: "Be thorough. " * 250_000,
        model="scripted",
        models={"scripted": lambda _: model},
    )
    started = time.monotonic()
    async with harness.worker(agents=[agent]) as task_queue:
        result = await asyncio.wait_for(
            AgentClient(harness.client, task_queue=task_queue).ask("Hi"), ENDS_WITHIN_S
        )
    assert result.outcome is Outcome.MODEL_ERROR
    assert result.steps[-1].kind is StepKind.LIMIT
    assert "instructions: could not be prepared" in result.steps[-2].text
    assert f"3,250,000 characters, over the {MAX_INSTRUCTIONS_CHARS:,}" in caplog.text
    assert model.requests == []
    assert time.monotonic() - started < ENDS_WITHIN_S


async def test_sweep_keeps_running_workflows_whatever_their_ids(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Ids of 300 characters are stored under a hashed folder name, which records its
    workflow: sweeping keeps a running one's payloads and deletes a closed one's; a
    hashed folder that does not say whose it is stays."""
    payloads = tmp_path / "payloads"
    environ = stored_in(payloads)
    client = client_with(env, environ)
    driver = storing_folder(external_storage(environ))
    assert driver is not None
    tag = uuid.uuid4().hex
    running_id = (f"running-{tag}-" + "é/" * 200)[:300]
    closed_id = (f"closed-{tag}-" + "x" * 300)[:300]
    running = await client.start_workflow(
        "NoSuchWorkflow", "x" * 100, id=running_id, task_queue="nobody"
    )
    closed = await client.start_workflow(
        "NoSuchWorkflow", "y" * 100, id=closed_id, task_queue="nobody"
    )
    await closed.terminate()
    orphan = payloads / "default" / ("h-" + "0" * 64)
    orphan.mkdir(parents=True)
    (orphan / ("1" * 64)).write_bytes(b"whose?")
    folders = {wf: folder for _, wf, folder in driver.workflows()}
    assert all(
        f.name.startswith("h-") for wf, f in folders.items() if wf in (running_id, closed_id)
    )
    assert set(folders) == {running_id, closed_id, None}

    gone = await sweep(client, driver, timedelta(0))

    assert gone == [closed_id]
    assert folders[running_id].is_dir() and any(folders[running_id].iterdir())
    assert not folders[closed_id].exists()
    assert orphan.is_dir()
    # The running workflow's payloads are still its own to read.
    started = await first_event(running)
    reader = client.data_converter.with_context(
        WorkflowSerializationContext(namespace=client.namespace, workflow_id=running_id)
    )
    attributes = started.workflow_execution_started_event_attributes
    assert await reader.decode(list(attributes.input.payloads), [str]) == ["x" * 100]
    await running.terminate()


async def test_a_childs_payloads_stay_while_its_parent_runs(
    env: WorkflowEnvironment, store: ShopStore, tmp_path: Path
) -> None:
    """A conversation's turn is its child: the turn's result is read again whenever the
    conversation replays, so sweeping keeps it until the conversation has closed too."""
    payloads = tmp_path / "payloads"
    environ = stored_in(payloads)
    harness = Harness(client_with(env, environ), store)
    driver = storing_folder(external_storage(environ))
    assert driver is not None
    async with harness.worker(ScriptedModel(plans=[Reply(text="hello")])) as task_queue:
        chat = AgentClient(harness.client, task_queue=task_queue).chat(
            model="scripted", stream=False
        )
        answered = await chat.send("Hi")
        assert answered.answer == "hello"
        assert await sweep(harness.client, driver, timedelta(0)) == []
        assert {answered.workflow_id, chat.id} <= {wf for _, wf, _ in driver.workflows()}
        await chat.end()
        await harness.client.get_workflow_handle(chat.id).result()
    gone = await sweep(harness.client, driver, timedelta(0))
    assert sorted(gone) == sorted([answered.workflow_id, chat.id])


def reference_to(key: str, driver: str = "durable-agent.folder") -> Payload:
    """A reference to the folder store's `key`, as a history holds one."""
    claim = {"driverName": driver, "claimData": {"key": key}}
    return Payload(
        metadata={
            "encoding": b"json/protobuf",
            "messageType": b"temporal.api.sdk.v1.ExternalStorageReference",
        },
        data=json.dumps(claim).encode(),
        external_payloads=[Payload.ExternalPayloadDetails(size_bytes=100)],
    )


def keys_of(history_payloads: Iterator[Payload]) -> list[str]:
    return [json.loads(p.data)["claimData"]["key"] for p in history_payloads if p.external_payloads]


async def test_a_reference_to_another_workflows_payload_or_outside_the_store_is_refused(
    env: WorkflowEnvironment, store: ShopStore, tmp_path: Path
) -> None:
    """A client that can start turns slips references into a turn's input: to another
    customer's stored question, out of the store with `..`, and to a store the worker does
    not have. The worker reads none: each turn ends at once, its line saying why."""
    payloads = tmp_path / "payloads"
    environ = stored_in(payloads)
    harness = Harness(client_with(env, environ), store)
    inline = client_with(env, {"AGENT_PAYLOAD_STORE": "off", "AGENT_STATE_DIR": str(tmp_path)})
    async with harness.worker(ScriptedModel(plans=[Reply(text="ok")])) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        victim = await agents.ask("My secret question", customer="alice", model="scripted")
        victim_handle = harness.client.get_workflow_handle(victim.workflow_id)
        started = await first_event(victim_handle)
        [key] = keys_of(iter(started.workflow_execution_started_event_attributes.input.payloads))
        assert (payloads / key).is_file()
        sha = key.rsplit("/", 1)[1]
        (payloads / sha).write_bytes((payloads / key).read_bytes())  # outside any folder
        forged = {
            "another's": reference_to(key),
            "..": reference_to(f"default/../{sha}"),
            "a store it does not have": reference_to(key, driver="someone.elses"),
        }
        ended = {}
        for name, reference in forged.items():
            attacker = await inline.start_workflow(
                "AgentTurn",
                RawValue(reference),
                id=f"forged-{uuid.uuid4().hex[:8]}",
                task_queue=task_queue,
            )
            ended[name] = await asyncio.wait_for(agents.turn(attacker.id).result(), ENDS_WITHIN_S)
    said = {
        "another's": "refused",
        "..": "refused",
        "a store it does not have": "a payload store this process does not have",
    }
    for name, result in ended.items():
        assert result.outcome is Outcome.PAYLOAD_UNAVAILABLE, name
        assert said[name] in result.steps[0].text, (name, result.steps[0].text)
        assert "secret" not in result.model_dump_json()


async def test_the_converter_binds_a_context_and_a_run_once(tmp_path: Path) -> None:
    """The converter binds the store to a context once, encrypted or not; a workflow's
    activity reads its payloads, another workflow's refuses them; where to store is
    bound once a run."""
    for more in ({}, {"AGENT_ENCRYPTION_KEY": f"k1:{new_key()}"}):
        converter = data_converter(stored_in(tmp_path / "payloads", **more))

        def activity(workflow_id: str, n: int, converter: Any = converter) -> Any:
            return converter.with_context(
                ActivitySerializationContext(
                    namespace="default",
                    activity_id=str(n),
                    activity_type="dispatch",
                    activity_task_queue="agent",
                    workflow_id=workflow_id,
                    workflow_type="AgentTurn",
                    is_local=bool(n % 2),
                )
            )

        own = converter.with_context(WorkflowSerializationContext("default", "wf-1"))
        assert activity("wf-1", 1) is activity("wf-1", 1)
        other = activity("wf-2", 1)
        [reference] = await activity("wf-1", 3).encode(["the customer said 123456"])
        assert await own.decode([reference], [str]) == ["the customer said 123456"]
        with pytest.raises(PayloadUnavailable, match="refused"):
            await other.decode([reference], [str])
        # Where to store is bound once a run, for its every task and activity.
        runs = [
            StorageDriverStoreContext(
                target=StorageDriverWorkflowInfo(
                    namespace="default", id="wf-1", run_id=run, type="AgentTurn"
                )
            )
            for run in ("r1", "r2")
        ]
        first = own._with_store_context(runs[0])
        assert first is own._with_store_context(runs[0]) is not own._with_store_context(runs[1])
        assert first.external_storage._store_context == runs[0]  # type: ignore[union-attr]
        [stored] = await first.encode(["x" * 99])
        assert stored.external_payloads and await own.decode([stored], [str]) == ["x" * 99]


async def test_the_codec_server_refuses_keys_that_leave_the_store_and_altered_payloads(
    tmp_path: Path,
) -> None:
    """The codec server reads for the Web UI: a key with `..`, `.`, an absolute path or
    a segment too many is refused, an altered payload is not served; each a 404 with
    one line."""
    payloads = tmp_path / "payloads"
    environ = stored_in(payloads)
    ring = KeyRing.parse(f"k1:{new_key()}")
    converter = data_converter(environ).with_context(
        WorkflowSerializationContext(namespace="default", workflow_id="wf-1")
    )
    [reference] = await converter.encode(["the customer said 123456"])
    [key] = keys_of(iter([reference]))
    sha = key.rsplit("/", 1)[1]
    for copy in (payloads / sha, payloads / "default" / sha):  # where `..` and `.` lead
        copy.write_bytes((payloads / key).read_bytes())
    server = build_server(ring, port=0, origins=[UI_ORIGIN], storage=external_storage(environ))
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def decode(payload: Payload) -> tuple[int, Any]:
        status, _, body = await asyncio.to_thread(
            call, server, "POST", "/decode", {"payloads": [json_format.MessageToDict(payload)]}
        )
        return status, body

    try:
        status, body = await decode(reference)
        assert status == 200, body
        assert base64.b64decode(body["payloads"][0]["data"]) == b'"the customer said 123456"'
        for bad in (f"default/../{sha}", f"default/./{sha}", f"/{payloads}/{key}", f"../{key}"):
            status, body = await decode(reference_to(bad))
            assert status == 404 and "refused" in body["error"], (bad, body)
        _flip(payloads / key)
        status, body = await decode(reference)
        assert status == 404 and "does not match its hash" in body["error"], body
    finally:
        server.shutdown()
        server.server_close()


async def test_the_s3_store_checks_every_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In S3: a reference to another workflow's payload, to a bucket this process was not
    told of, or with a key whose hash is not the claim's is refused; an altered object is
    not served; a process that stores nothing reads a bucket named for reading; a
    bucket that refuses writes leaves a reference that says so."""
    from moto import mock_aws

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    state = str(tmp_path / "state")
    writer_env = {"AGENT_PAYLOAD_STORE": "s3://agent-payloads", "AGENT_PAYLOAD_THRESHOLD": "0"}

    def as_workflow(environ: dict[str, str], workflow_id: str) -> Any:
        converter = data_converter({**environ, "AGENT_STATE_DIR": state})
        return converter.with_context(
            WorkflowSerializationContext(namespace="default", workflow_id=workflow_id)
        )

    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="agent-payloads")
        [ref] = await as_workflow(writer_env, "wf-1").encode(["a tool's result"])
        claim = json.loads(ref.data)["claimData"]
        assert "/wi/wf-1/" in claim["key"]
        assert await as_workflow(writer_env, "wf-1").decode([ref], [str]) == ["a tool's result"]
        with pytest.raises(PayloadUnavailable, match="refused"):
            await as_workflow(writer_env, "wf-2").decode([ref], [str])
        reader_env = {"AGENT_PAYLOAD_READ": "s3://agent-payloads"}
        assert await as_workflow(reader_env, "wf-1").decode([ref], [str]) == ["a tool's result"]
        with pytest.raises(PayloadUnavailable, match="AGENT_PAYLOAD_READ=s3://BUCKET"):
            await as_workflow({}, "wf-1").decode([ref], [str])

        def forged(**changes: str) -> Payload:
            data = json.loads(ref.data)
            data["claimData"].update(changes)
            return Payload(metadata=ref.metadata, data=json.dumps(data).encode())

        for bad in (
            forged(bucket="someone-elses"),
            forged(hash_value="0" * 64),
            forged(key=claim["key"].replace("/wi/wf-1/", "/wi/../")),
        ):
            with pytest.raises(PayloadUnavailable, match="refused|does not read"):
                await as_workflow(writer_env, "wf-1").decode([bad], [str])
        body = bytearray(s3.get_object(Bucket="agent-payloads", Key=claim["key"])["Body"].read())
        body[-1] ^= 0x01
        s3.put_object(Bucket="agent-payloads", Key=claim["key"], Body=bytes(body))
        with pytest.raises(PayloadUnavailable, match="does not match its hash"):
            await as_workflow(writer_env, "wf-1").decode([ref], [str])
        missing = {**writer_env, "AGENT_PAYLOAD_STORE": "s3://no-such-bucket"}
        [never] = await as_workflow(missing, "wf-1").encode(["lost"])
        with pytest.raises(PayloadUnavailable, match="was never stored: s3://no-such-bucket"):
            await as_workflow(missing, "wf-1").decode([never], [str])
