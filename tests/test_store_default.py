"""The payload store on by default (`durable_agent/runtime/storage.py`): a worker with no
setting stores large payloads in the state folder, beside the embedded server's database;
a process with no setting (a client, `show`) reads them; `show` and `ask --sizes` say what
a turn costs the server and the store; a long turn's history stays small; a sweep never
deletes the payloads of another server's workflows."""

from __future__ import annotations

import os
import re
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, AgentClient
from durable_agent.conversation import ToolResult
from durable_agent.model import ModelRequest, Reply
from durable_agent.runtime import turns
from durable_agent.runtime.storage import (
    SERVER_FILE,
    FolderStorageDriver,
    TurnSize,
    sweep,
)
from durable_agent.shop import ShopStore
from durable_agent.testing import TestModel, agent_test, check_replays, record_turn
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, ToolCall, TurnInput, TurnLimits
from tests.conftest import Harness
from tests.test_long import _page
from tests.test_shared_host import QUESTION, Running, command, recorded, worker
from tests.test_store_hardening import cli, client_with

DOC_CHARS = 20_000
SIZE_LINE = re.compile(
    r"^history: (?P<history>[\d.]+ [KM]?B) in (?P<runs>\d+) runs? \((?P<events>[\d,]+) events\); "
    r"payload store: (?P<stored>[\d.]+ [KM]?B) \((?P<stores>.+)\)$",
    re.M,
)


class Doc(BaseModel):
    n: int


@tool
def read_document(args: Doc, ctx: ToolContext[object]) -> str:
    """A 20,000-character document."""
    return _page(args.n, DOC_CHARS)


class Reader:
    """Reads documents 1..`docs`, one a round, then answers with the last one's last
    word (its reply depends on the conversation only: a retried call gets the same)."""

    provider = "scripted"
    name = "reader"

    def __init__(self, docs: int) -> None:
        self.docs = docs

    async def plan(self, request: ModelRequest, stream: object = None) -> Reply:
        return self._next(request)

    async def interpret(self, request: ModelRequest, stream: object = None) -> Reply:
        return self._next(request)

    def _next(self, request: ModelRequest) -> Reply:
        read = [m for m in request.messages if isinstance(m, ToolResult)]
        if len(read) < self.docs:
            n = len(read) + 1
            return Reply(calls=[ToolCall(id=f"c{n}", name="read_document", arguments={"n": n})])
        return Reply(text=read[-1].text.split()[-1])


def stored_files(folder: Path) -> list[Path]:
    """The stored payloads (not the `.workflow` and `.server` files) under `folder`."""
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")]


async def read_documents(
    env: WorkflowEnvironment, store: ShopStore, environ: dict[str, str], docs: int, **limits: int
) -> tuple[str, str, TurnSize]:
    """A turn that reads `docs` documents, on a worker whose payload settings are
    `environ`'s only: its workflow id, its answer, and its size as a client of those
    settings has it."""
    harness = Harness(client_with(env, environ), store)
    turn = TurnInput(
        question="read", model="scripted", limits=TurnLimits(max_steps=docs + 1, **limits)
    )
    async with harness.worker(Reader(docs), ToolRegistry([read_document])) as task_queue:
        handle = await turns.start_turn(harness.client, turn, task_queue)
        output = await handle.result()
    assert output.outcome is Outcome.ANSWERED, output.answer
    size = await AgentClient(harness.client).turn(handle.id).size()
    return handle.id, output.answer, size


async def test_a_worker_with_no_setting_stores_and_a_client_with_none_reads(
    env: WorkflowEnvironment, store: ShopStore, tmp_path: Path
) -> None:
    """No AGENT_PAYLOAD_* anywhere: the worker stores the documents in the state
    folder's store; `show`, with no setting either, prints the turn and its sizes, the
    bytes in the store the files' own."""
    state = tmp_path / "state"
    bare = {"AGENT_STATE_DIR": str(state)}
    workflow_id, answer, size = await read_documents(env, store, bare, docs=3)
    assert answer == "end-of-page-3"
    files = stored_files(state / "payloads")
    assert any(b"end-of-page-2" in p.read_bytes() for p in files)  # stored, by default

    shown = await cli(env, bare, "show", workflow_id)
    assert shown.returncode == 0, shown.stderr
    assert f"answer (answered): {answer}" in shown.stdout
    line = SIZE_LINE.search(shown.stdout)
    assert line, shown.stdout
    assert line["runs"] == "1" and line["stores"].startswith(f"local:{state / 'payloads'}")
    assert line[0] == size.line()  # the CLI's line is the client's
    assert size.runs == 1 and size.stored_bytes == sum(p.stat().st_size for p in files)
    assert size.history_bytes > 0 and size.events > 0
    # Turned off, nothing is stored and the history holds every payload.
    off = {"AGENT_STATE_DIR": str(tmp_path / "off"), "AGENT_PAYLOAD_STORE": "off"}
    _, _, inline = await read_documents(env, store, off, docs=3)
    assert not (tmp_path / "off" / "payloads").exists() and inline.stored_bytes == 0
    assert inline.history_bytes > 3 * DOC_CHARS > size.history_bytes


async def test_the_default_keeps_a_long_turns_history_small_over_its_runs(
    env: WorkflowEnvironment, store: ShopStore, tmp_path: Path
) -> None:
    """30 rounds over 20 KB documents, continued as new every 60 events: with no setting
    the turn's histories, all runs together, hold references only; with the store off,
    every document, several times. The size counts every run."""
    docs = 30
    state = {"AGENT_STATE_DIR": str(tmp_path / "state")}
    workflow_id, answer, stored = await read_documents(
        env, store, state, docs, continue_after_events=60
    )
    assert answer == f"end-of-page-{docs}"
    client = client_with(env, state)  # one that reads the turn's payloads
    chain = await turns.runs(client.get_workflow_handle(workflow_id))
    assert stored.runs == len(chain) >= 3
    described = [
        await client.get_workflow_handle(workflow_id, run_id=run).describe() for run, _ in chain
    ]
    info = [d.raw_description.workflow_execution_info for d in described]
    assert stored.history_bytes == sum(i.history_size_bytes for i in info)
    assert stored.events == sum(i.history_length for i in info)

    results = docs * DOC_CHARS
    off = {"AGENT_STATE_DIR": str(tmp_path / "off"), "AGENT_PAYLOAD_STORE": "off"}
    _, _, inline = await read_documents(env, store, off, docs, continue_after_events=60)
    assert inline.history_bytes > results
    assert stored.history_bytes < results / 4 and stored.history_bytes < inline.history_bytes / 4
    assert stored.stored_bytes is not None and results < stored.stored_bytes < 5 * results


AGENT = """
    from pydantic import BaseModel, Field
    from durable_agent import Agent, ToolContext, tool

    class Isbn(BaseModel):
        isbn: str = Field(pattern=r"^\\d{13}$", description="the book's ISBN (13 digits)")

    @tool(examples=["How much is the book 9780141187761?"], quick=True)
    def book_price(args: Isbn, ctx: ToolContext[None]) -> str:
        \"\"\"Price of one book, by its ISBN, and its whole review.\"\"\"
        return "Price: $7.77. Review: " + "a-long-review " * 1000

    agent = Agent(name="manual", tools=[book_price])
"""


def test_the_embedded_server_stores_beside_its_database(tmp_path: Path) -> None:
    """A person's folder, no setting: the worker starts the embedded server and stores
    payloads in `.durable-agent/payloads`, beside the server's database, and says so;
    `ask --sizes` reads the turn and says what it holds there."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "manual.py").write_text(textwrap.dedent(AGENT))
    home = tmp_path / "home"
    home.mkdir()
    bare = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    } | {"HOME": str(home), "PYTHONUNBUFFERED": "1"}
    running: Running = worker(folder, bare, "--agent", "manual:agent")
    try:
        line = running.wait_for("payload store: ")
        payloads = Path(str(recorded(folder)["db_file"])).parent / "payloads"
        assert line.startswith(f"payload store: local:{payloads} (payloads from 4,096 bytes)")
        assert not any("note: the payload store" in x for x in running.out)  # not named
        asked = command(folder, bare, "ask", "--sizes", QUESTION)
    finally:
        running.stop()
    assert asked.returncode == 0, asked.stderr
    size = SIZE_LINE.search(asked.stdout)
    assert size and size["stores"].startswith(f"local:{payloads}"), asked.stdout
    assert size["stored"] != "0 B", asked.stdout
    assert any(b"a-long-review" in p.read_bytes() for p in stored_files(payloads))


def test_a_worker_on_a_named_server_says_its_store_is_this_machines(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """On a server named by TEMPORAL_ADDRESS, the default store is a folder of this
    machine's: the worker says that workers elsewhere need a shared one; named, it
    does not; off, it says every payload stays inline."""
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    } | {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml",
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_TASK_QUEUE": f"named-{uuid.uuid4().hex[:8]}",
        "PYTHONUNBUFFERED": "1",
    }
    shared = f"local:{tmp_path / 'shared'}"
    for extra, said in (
        ({}, f"payload store: local:{tmp_path / 'state' / 'payloads'}"),
        ({"AGENT_PAYLOAD_STORE": shared}, f"payload store: {shared}"),
        ({"AGENT_PAYLOAD_STORE": "off"}, "payload store: off"),
    ):
        running = worker(tmp_path, base | extra)
        try:
            assert running.wait_for("payload store: ").startswith(said)
            if not extra:
                note = running.wait_for("note: the payload store")
                assert "AGENT_PAYLOAD_STORE=local:/shared/folder or s3://BUCKET" in note
            else:
                assert not any("note: the payload store" in x for x in running.out)
        finally:
            running.stop()


async def test_a_sweep_leaves_another_servers_payloads(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The store records the server it holds payloads of: a sweep by a worker of another
    server (to which every workflow of the folder is unknown, as if deleted long ago)
    deletes nothing; the folder's own server's sweep deletes what is gone."""
    driver = FolderStorageDriver(tmp_path)
    folder = tmp_path / env.client.namespace / f"gone-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    (folder / ("0" * 64)).write_bytes(b"a payload")
    old = time.time() - 3600
    os.utime(folder / ("0" * 64), (old, old))
    (tmp_path / SERVER_FILE).write_text("another-server's-cluster")
    assert await sweep(env.client, driver, retention=timedelta(0)) == []
    assert folder.exists()

    (tmp_path / SERVER_FILE).unlink()
    gone = await sweep(env.client, driver, retention=timedelta(0))
    assert gone == [folder.name] and not folder.exists()
    assert (tmp_path / SERVER_FILE).read_text() != "another-server's-cluster"


async def test_a_recorded_turn_replays_with_no_store_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`record_turn` under the default store writes the stored payloads into the history
    it records: the replay gate replays it where that store is not (CI, a fresh clone)."""
    monkeypatch.setenv("AGENT_STATE_DIR", str(tmp_path / "recording"))
    monkeypatch.delenv("AGENT_PAYLOAD_STORE", raising=False)
    monkeypatch.delenv("AGENT_PAYLOAD_READ", raising=False)
    agent = Agent(name="docs", deps=[], tools=[read_document])
    async with agent_test(agent, model=TestModel(call_tools=["read_document"])) as t:
        turn = await t.client.start("Read document 7")
        await turn.result()
        [path] = await record_turn(turn, tmp_path / "histories", "docs")
    assert any(b"end-of-page" in p.read_bytes() for p in stored_files(tmp_path / "recording"))
    events = WorkflowHistory.from_json(turn.id, path.read_text()).events
    recorded = b"".join(e.SerializeToString() for e in events)
    assert b"end-of-page" in recorded and b"ExternalStorageReference" not in recorded

    monkeypatch.setenv("AGENT_STATE_DIR", str(tmp_path / "elsewhere"))  # no store here
    assert await check_replays(tmp_path / "histories", agent) == [path]
