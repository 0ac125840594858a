"""Erasing a turn (`durable-agent erase`, `memory forget --erase-turn`): the executions
that hold what the customer said, and their stored payloads, are deleted from the
server and the payload store; nothing else is. One worker for the module, every
payload of its turns in the store."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import StorageDriverStoreContext, StorageDriverWorkflowInfo
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, AgentClient
from durable_agent.errors import CannotErase
from durable_agent.memory import MemoryAccess, MemorySettings
from durable_agent.plugin import build_worker
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.erase import Erased
from durable_agent.runtime.storage import Owner, delete_stored, external_storage
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings, state_dir
from durable_agent.types import Outcome
from tests.test_memory import REMEMBER, decide, payload_bytes, plan

ROOT = Path(__file__).resolve().parent.parent
WORDS = "I sail to Zanzibar every June"
THEIRS = "My quokka is named Wombleton"
ERASED = re.compile(r"^erased (turn|conversation|fork|sub-agent) (\S+) \(run (\S+)\)$")


@dataclass
class Shop:
    client: Client
    agents: AgentClient
    memory: MemoryAccess
    payloads: Path
    task_queue: str
    environ: dict[str, str]

    def cli(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        """`durable-agent ...` in a process of its own, on this server, state folder (the
        memory store) and payload store."""
        done = subprocess.run(
            [sys.executable, "client.py", *args],
            cwd=ROOT,
            env=self.environ,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert (done.returncode == 0) == ok, (done.returncode, done.stdout, done.stderr)
        return done

    def holding(self, word: bytes) -> list[Path]:
        """The payload-store files that hold `word`."""
        return [f for f in self.payloads.rglob("*") if f.is_file() and word in f.read_bytes()]


@pytest.fixture(scope="module")
async def shop(
    env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Shop]:
    payloads = tmp_path_factory.mktemp("erase") / "payloads"
    stored = {"AGENT_PAYLOAD_STORE": f"local:{payloads}", "AGENT_PAYLOAD_THRESHOLD": "0"}
    address = env.client.service_client.config.target_host
    client = await Client.connect(
        address, namespace=env.client.namespace, data_converter=data_converter(stored)
    )
    model = ScriptedModel(plans=[plan], decisions=[decide])
    name = f"erase{uuid.uuid4().hex[:8]}"
    agent = Agent(
        name="eraser",
        model="scripted",
        models={"scripted": lambda _: model},
        memory=MemorySettings(recall=3, name=name),
    )
    task_queue = f"erase-{uuid.uuid4().hex[:8]}"
    settings = replace(Settings.from_env(), versioning=False, workflow_sandbox=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    environ = (
        base
        | stored
        | {
            "AGENT_STATE_DIR": str(state_dir()),
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_NAMESPACE": env.client.namespace,
            "TEMPORAL_CONFIG_FILE": str(payloads.parent / "none.toml"),
        }
    )
    async with build_worker(client, agent, task_queue=task_queue, settings=settings):
        agents = AgentClient(client, task_queue=task_queue)
        yield Shop(client, agents, MemoryAccess(name), payloads, task_queue, environ)


async def gone(client: Client, workflow_id: str, run_id: str = "") -> bool:
    """Whether the server has no such execution, once its deletion is done (the server
    deletes in the background): waits up to 60 s."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        try:
            await client.get_workflow_handle(workflow_id, run_id=run_id or None).describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return True
            raise
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.2)


async def test_forget_erase_turn_erases_the_conversation_that_told_it_and_nothing_else(
    shop: Shop,
) -> None:
    """The customer tells a preference in a conversation; `memory forget --erase-turn
    --conversation` forgets it and erases every execution that holds the words (the
    conversation, its turns, a fork of the telling turn) and their stored payloads;
    another customer's turn and memory stay; the next turn recalls nothing."""
    chat = shop.agents.chat(customer="alice", stream=False)
    told = await chat.send(f"{REMEMBER}{WORDS}")
    later = await chat.send("How should you plan my holidays?")
    await chat.end()
    assert WORDS in later.answer  # a later turn of the conversation quotes it
    fork = await (await shop.agents.rerun(told.workflow_id, from_step=1)).result()
    assert fork.outcome is Outcome.ANSWERED
    bobs = await shop.agents.ask(f"{REMEMBER}{THEIRS}", customer="bob")
    (kept,) = await shop.memory.list("alice")
    assert kept.turn == told.workflow_id
    assert shop.holding(WORDS.encode())  # the store holds the words, as every turn's

    # A turn of a conversation alone: refused in one line, nothing forgotten or erased.
    forget = ["memory", "forget", kept.id, "--customer", "alice", "--name", shop.memory.name]
    refused = shop.cli(*forget, "--erase-turn", ok=False)
    assert refused.stderr.startswith(
        f"error: turn {told.workflow_id} is a turn of conversation {chat.id}, whose record"
    ), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and refused.stdout == ""
    assert [m.id for m in await shop.memory.list("alice")] == [kept.id]

    done = shop.cli(*forget, "--erase-turn", "--conversation")
    *lines, last = done.stdout.strip().splitlines()
    assert last == f"forgot {kept.id}"
    erased = [ERASED.match(line) for line in lines]
    assert all(erased), lines
    runs = [(m[2], m[3]) for m in erased if m]
    assert {m[1] for m in erased if m} == {"conversation", "turn", "fork"}
    assert {w for w, _ in runs} == {chat.id, told.workflow_id, later.workflow_id, fork.workflow_id}
    for workflow_id, run_id in runs:
        assert await gone(shop.client, workflow_id, run_id), workflow_id
        assert await gone(shop.client, workflow_id), workflow_id

    # Nowhere on the server, nowhere in the store; bob's turn and memory as they were.
    assert shop.holding(WORDS.encode()) == []
    assert shop.holding(THEIRS.encode())
    histories = []
    async for listed in shop.client.list_workflows(f"TaskQueue = '{shop.task_queue}'"):
        try:
            history = await shop.client.get_workflow_handle(listed.id).fetch_history()
        except RPCError as e:  # deleted, and the list not caught up yet
            assert e.status == RPCStatusCode.NOT_FOUND
            continue
        histories.append(listed.id)
        assert b"Zanzibar" not in payload_bytes(history), listed.id
        assert b"Zanzibar" not in history.to_json().encode(), listed.id
    assert bobs.workflow_id in histories
    assert [m.text for m in await shop.memory.list("bob")] == [THEIRS]
    assert await shop.memory.list("alice") == []

    again = shop.agents.chat(customer="alice", stream=False)
    answer = await again.send("How should you plan my holidays?")
    await again.end()
    assert answer.answer.startswith("I recall nothing."), answer.answer


async def test_erase_refuses_bad_ids_in_one_line_and_erases_a_turn_alone(shop: Shop) -> None:
    """An unknown turn, a malformed id, a conversation's turn without `conversation`: one
    line each (the command: exit 1, no traceback), and nothing erased. A turn of no
    conversation: erased alone, one line for its run, its payloads gone. With
    `conversation`, a running conversation is erased with its turn, the root last."""
    unknown = shop.cli("erase", "--turn", "turn-nobody-0000", ok=False)
    assert unknown.stderr == (
        "error: no turn with workflow id 'turn-nobody-0000': `durable-agent list` shows turns\n"
    )
    alone = await shop.agents.ask("Hello", customer="dave")  # a turn of no conversation
    run = await shop.client.get_workflow_handle(alone.workflow_id).describe()
    assert shop.holding(b"Hello")
    done = shop.cli("erase", "--turn", alone.workflow_id)
    assert done.stdout.splitlines() == [
        f"erased turn {alone.workflow_id} (run {run.run_id})",
        "erased 1 execution(s) and their stored payloads",
    ]
    assert shop.holding(b"Hello") == []
    for bad in ("two words", "a\x07bell", "x" * 1001, ""):
        with pytest.raises(CannotErase, match=r"is not a workflow id \(1 to 1000 printable"):
            await shop.agents.erase(bad)

    chat = shop.agents.chat(customer="carol", stream=False)
    turn = await chat.send("Hello there")
    with pytest.raises(CannotErase) as refused:
        await shop.agents.erase(turn.workflow_id)
    assert str(refused.value) == (
        f"turn {turn.workflow_id} is a turn of conversation {chat.id}, whose record and later "
        "turns hold its words too: erase the whole conversation (its workflow, all its turns "
        "and their forks) with --conversation"
    )
    with pytest.raises(CannotErase, match=f"^{chat.id} is a conversation: erase it"):
        await shop.agents.erase(chat.id)
    await shop.client.get_workflow_handle(turn.workflow_id).describe()  # still there

    said: list[Erased] = []
    erased = await shop.agents.erase(turn.workflow_id, conversation=True, said=said.append)
    assert [(e.workflow_id, e.what) for e in erased] == [
        (turn.workflow_id, "turn"),
        (chat.id, "conversation"),  # the root last
    ]
    assert said == erased


async def test_delete_stored_deletes_one_workflows_payloads_in_every_store_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder store and an S3 bucket (moto's) each hold the payloads of `turn-a-1` and
    of `turn-a-10`, whose id starts with the first's: deleting the first's leaves the
    second's whole, in both."""
    import boto3
    from moto import mock_aws

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="erase-payloads")
        storage = external_storage(
            {"AGENT_PAYLOAD_STORE": "s3://erase-payloads", "AGENT_STATE_DIR": str(tmp_path)}
        )
        folder, bucket = storage.drivers
        for workflow_id in ("turn-a-1", "turn-a-10"):
            target = StorageDriverWorkflowInfo(namespace="default", id=workflow_id)
            words = [Payload(data=f"{workflow_id} said {n}".encode()) for n in range(3)]
            for driver in (folder, bucket):
                await driver.store(StorageDriverStoreContext(target=target), words)
        assert await delete_stored(storage, Owner("default", "turn-a-1")) == 6
        assert await delete_stored(storage, Owner("default", "turn-a-1")) == 0
        kept = [
            s3.get_object(Bucket="erase-payloads", Key=o["Key"])["Body"].read()
            for o in s3.list_objects_v2(Bucket="erase-payloads")["Contents"]
        ]
    files = [f.read_bytes() for f in (tmp_path / "payloads").rglob("*") if f.is_file()]
    for left in (kept, [f for f in files if b" said " in f]):
        assert len(left) == 3 and all(b"turn-a-10 said" in b for b in left), left
