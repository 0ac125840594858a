"""MCP tool lists by their hash (`durable_agent/runtime/tool_lists.py`): a turn's
history holds a hash per server, not the list; a worker that did not list a turn's
tools reads them from the store by that hash; a copy that was changed, or none at all,
ends the turn with one line that says why, never a turn that hangs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent import mcp
from durable_agent.agents import Agent
from durable_agent.commands.worker import build_worker
from durable_agent.errors import ToolListUnavailable
from durable_agent.mcp import connected
from durable_agent.model import ModelCatalog, Reply
from durable_agent.runtime import turns
from durable_agent.runtime.storage import StorageConfigError
from durable_agent.runtime.tool_lists import ToolListStore, canonical, list_hash
from durable_agent.runtime.turns import decide, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnLimits
from tests.conftest import Harness, last_result
from tests.fakes.chat_completions import ChatCompletionsServer, text, tool_calls
from tests.test_mcp import agent_with, next_pending, worker_environ, worker_process
from tests.test_mcp_misbehaving import FIND, LOOKUP, misbehaving, tool

pytestmark = pytest.mark.usefixtures("own_state_dir")

TOOLS = [tool("find"), tool("lookup", reads=False)]


# -- the store ------------------------------------------------------------------------


async def test_a_list_kept_by_one_store_is_read_by_another_and_checked(tmp_path: Path) -> None:
    digest = list_hash(TOOLS)
    assert digest == hashlib.sha256(canonical(TOOLS)).hexdigest()
    assert list_hash(list(reversed(TOOLS))) != digest  # the list's order is the list's
    await ToolListStore.folder(tmp_path).keep(digest, TOOLS)
    other = ToolListStore.folder(tmp_path)  # another worker's
    assert await other.get(digest) == TOOLS
    assert await other.get("0" * 64) is None
    (tmp_path / f"{digest}.json").write_bytes(canonical([tool("find")]))
    assert await other.get(digest) == TOOLS  # read once, then from memory
    with pytest.raises(ToolListUnavailable) as caught:
        await ToolListStore.folder(tmp_path).get(digest)
    assert f"the tool list {digest[:12]} in {tmp_path} does not have the hash" in str(caught.value)
    with pytest.raises(ToolListUnavailable, match="is not the hash of a tool list"):
        await other.get("../secrets")


async def test_a_list_that_cannot_be_kept_is_a_warning_not_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    store = ToolListStore.folder(blocked / "tool-lists")
    digest = list_hash(TOOLS)
    await store.keep(digest, TOOLS)
    await store.keep(digest, TOOLS)  # not tried again at once
    [said] = [r.getMessage() for r in caplog.records if r.name == "durable_agent.tool_lists"]
    assert said.startswith(f"tool list {digest[:12]}: could not keep it in {blocked}")
    assert await store.get(digest) == TOOLS  # this worker has it in memory


def test_the_lists_are_kept_where_the_payload_store_is(tmp_path: Path) -> None:
    state = {"AGENT_STATE_DIR": str(tmp_path)}
    for spec, where in (
        ("", tmp_path / "tool-lists"),
        ("off", tmp_path / "tool-lists"),
        ("local", tmp_path / "tool-lists"),
        ("local:/shared/folder", Path("/shared/folder/tool-lists")),
    ):
        store = ToolListStore.from_env(state | {"AGENT_PAYLOAD_STORE": spec})
        assert str(store) == str(where), spec
    bucket = ToolListStore.from_env(state | {"AGENT_PAYLOAD_STORE": "s3://agent-payloads"})
    assert str(bucket) == "s3://agent-payloads/tool-lists/"
    with pytest.raises(StorageConfigError, match="s3://a-bucket"):
        ToolListStore.from_env({"AGENT_PAYLOAD_STORE": "s3://Bad_Bucket"})


async def test_the_s3_store_keeps_a_list_under_its_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    digest = list_hash(TOOLS)
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="agent-payloads")
        await ToolListStore.from_env({"AGENT_PAYLOAD_STORE": "s3://agent-payloads"}).keep(
            digest, TOOLS
        )
        reader = ToolListStore.s3("agent-payloads", s3)
        assert await reader.get(digest) == TOOLS
        assert await reader.get("f" * 64) is None
        key = f"tool-lists/{digest}.json"
        assert s3.get_object(Bucket="agent-payloads", Key=key)["Body"].read() == canonical(TOOLS)
        s3.put_object(Bucket="agent-payloads", Key=key, Body=b"[]")
        with pytest.raises(ToolListUnavailable, match="does not have the hash"):
            await ToolListStore.s3("agent-payloads", s3).get(digest)


# -- a turn ---------------------------------------------------------------------------

MANY = [
    {**tool(f"t{n}"), "description": f"The t{n} of a thing. " + "Explained at length. " * 48}
    for n in range(mcp.MAX_TOOLS - 1)  # and the server's own `change`
]


async def test_a_turn_offered_a_server_of_many_tools_records_their_hash_only(
    harness: Harness, tmp_path: Path
) -> None:
    """A server of 200 tools, a quarter of a megabyte of specs: the model is offered
    every one of them, and the turn's history holds the list's hash, not the list."""
    server = misbehaving(tmp_path, {"tools": MANY})
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="evil__t7", arguments={"q": "x"})])],
        decisions=[lambda r: Reply(text=last_result(r))],
        context_window=None,  # its 200 tools' specs alone are more than 32,000 tokens
    )
    async with (
        connected([agent_with(server)]) as agents,
        harness.worker(model, agents=agents) as task_queue,
    ):
        [listed] = agents[0].registry.recorded().values()  # type: ignore[attr-defined]
        turn = TurnInput(question="t7 of x", model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        result = await handle.result()
    weight = len(canonical(listed))
    assert weight > 200_000
    assert result.outcome is Outcome.ANSWERED and 't7 got {"q": "x"}' in result.answer
    for _, request in model.requests:
        assert len(request.tools) == mcp.MAX_TOOLS
        assert "Explained at length." in {t.name: t for t in request.tools}["evil__t99"].description
    events = (await handle.fetch_history()).events
    history = b"".join(e.SerializeToString() for e in events)
    assert len(history) < 16_000, len(history)
    assert b"Explained at length" not in history
    assert list_hash(listed).encode() in history
    kept = tmp_path / "state" / "tool-lists" / f"{list_hash(listed)}.json"
    assert kept.read_bytes() == canonical(listed)


async def test_a_turn_that_continues_as_new_carries_the_lists_hash_only(
    harness: Harness, tmp_path: Path
) -> None:
    """Across its runs, each run's input carries the hash, never the list: the model is
    offered every tool in every run."""
    server = misbehaving(tmp_path, {"tools": MANY})
    calls = [ToolCall(id=f"c{n}", name=f"evil__t{n}", arguments={"q": "x"}) for n in (7, 8, 9)]
    model = ScriptedModel(
        plans=[Reply(calls=[calls[0]])],
        decisions=[
            Reply(calls=[calls[1]]),
            Reply(calls=[calls[2]]),
            lambda r: Reply(text=last_result(r)),
        ],
        context_window=None,  # its 200 tools' specs alone are more than 32,000 tokens
    )
    limits = TurnLimits(max_steps=5, continue_after_events=12)
    async with (
        connected([agent_with(server)]) as agents,
        harness.worker(model, agents=agents) as task_queue,
    ):
        [listed] = agents[0].registry.recorded().values()  # type: ignore[attr-defined]
        turn = TurnInput(question="t7, t8 and t9 of x", model="scripted", limits=limits)
        handle = await start_turn(harness.client, turn, task_queue)
        result = await handle.result()
    assert result.outcome is Outcome.ANSWERED and 't9 got {"q": "x"}' in result.answer
    assert result.runs >= 2
    assert all(len(request.tools) == mcp.MAX_TOOLS for _, request in model.requests)
    for run_id, _ in await turns.runs(handle):
        run = harness.client.get_workflow_handle(handle.id, run_id=run_id)
        events = (await run.fetch_history()).events
        history = b"".join(e.SerializeToString() for e in events)
        assert b"Explained at length" not in history
        assert list_hash(listed).encode() in history


def one_queue(harness: Harness, model: ScriptedModel) -> tuple[str, Callable[[list[Agent]], Any]]:
    """A task queue, and workers of it, unversioned, serving `model`: one started after
    another takes over the turns the one before left."""
    settings = replace(Settings.from_env(), versioning=False)
    task_queue = f"lists-{uuid.uuid4().hex[:8]}"
    catalog = ModelCatalog({"scripted": lambda _: model})

    def worker(agents: list[Agent]) -> Any:
        return build_worker(
            harness.client, task_queue, agents=agents, models=catalog, settings=settings
        )

    return task_queue, worker


def tool_names(request: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in request["tools"])


@pytest.mark.parametrize("store", ["kept", "changed", "missing"])
async def test_a_worker_that_did_not_list_a_turns_tools_serves_it_by_their_hash(
    env: WorkflowEnvironment, tmp_path: Path, store: str
) -> None:
    """A turn waits for consent to a write its worker's server listed; that worker
    stops, the server is upgraded (it no longer lists the tool), and a worker process
    started since, which never saw the turn's list, takes the turn up. With the list
    in the store, it offers the model the list the turn started with, and sends the
    call to its own server. With a changed copy, or none, the turn ends at once with
    a line that says which list and which store, and an answer."""
    spec = tmp_path / "evil.json"
    server = misbehaving(tmp_path, {"tools": [FIND, LOOKUP, tool("write", reads=False)]})
    config = tmp_path / "mcp.json"
    entry = {"command": server.command, "args": list(server.args)}
    config.write_text(json.dumps({"mcpServers": {"evil": entry}}))
    fake = ChatCompletionsServer()
    fake.replies = [
        tool_calls(("c1", "evil__write", json.dumps({"q": "x"}))),
        text("Written."),
    ]
    environ = worker_environ(env, tmp_path, fake) | {"AGENT_VERSIONING": "off"}
    folder = tmp_path / "state" / "tool-lists"
    turn = TurnInput(question="Write x", customer_id="c-lists")
    try:
        with worker_process(environ, "worker.py", "--mcp-config", str(config)):
            handle = await start_turn(env.client, turn, environ["AGENT_TASK_QUEUE"])
            await next_pending(handle)
        [kept] = folder.iterdir()
        if store == "changed":
            kept.write_bytes(canonical([FIND]))
        elif store == "missing":
            kept.unlink()
        spec.write_text(json.dumps({"tools": [FIND]}))  # the server, upgraded
        with worker_process(environ, "worker.py", "--mcp-config", str(config)) as second:
            async with asyncio.timeout(180):
                await decide(env.client, handle.id, "c1", approved=True, by="test")
                result = await handle.result()
            said = second.stop()
    finally:
        fake.close()
    digest = kept.stem
    if store == "kept":
        assert result.outcome is Outcome.ANSWERED and result.answer == "Written."
        plan, interpret = fake.accepted
        assert "evil__write" in tool_names(plan) and tool_names(interpret) == tool_names(plan)
        assert 'write got {"q": "x"}' in interpret["messages"][-1]["content"]
        assert "not known to this worker" not in said
        return
    assert result.outcome is Outcome.UNKNOWN_AGENT
    assert result.answer.startswith("Sorry, I cannot go on with this request")
    [step] = [s.text for s in result.steps if s.text.startswith("tools: ")]
    assert [s.kind for s in result.steps if s.text == step] == [StepKind.LIMIT]
    assert step == "tools: the tools this turn started with are not available"
    why = {
        "changed": f"the tool list {digest[:12]} in {folder} does not have the hash",
        "missing": f"MCP server 'evil' this turn started with ({digest[:12]}) is not in the "
        f"tool-list store ({folder})",
    }[store]
    assert why in said  # the operator's to read: the store, the hash
    assert len(fake.accepted) == 1  # the model was not asked again without its tools
    assert not [s for s in result.steps if s.kind is StepKind.OBSERVATION]


async def test_a_list_the_worker_listed_itself_needs_no_copy(
    harness: Harness, tmp_path: Path
) -> None:
    """Two servers; the turn waits for consent, its worker stops, one server is
    upgraded, and the other's list is gone from the store. The next worker lists the
    other server as the turn's first worker did: it serves the turn with its own
    listing of that one and the store's copy of the upgraded one's."""
    same, upgraded = (
        misbehaving(tmp_path, {"tools": [FIND]}, name="same"),
        misbehaving(tmp_path, {"tools": [FIND, LOOKUP, tool("write", reads=False)]}, name="up"),
    )
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="up__write", arguments={"q": "x"})])],
        decisions=[lambda r: Reply(text=last_result(r))],
    )
    task_queue, worker = one_queue(harness, model)
    async with connected([agent_with(same, upgraded)]) as agents, worker(agents):
        hashes = agents[0].registry.hashes()  # type: ignore[attr-defined]
        turn = TurnInput(question="Write x", model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        await next_pending(handle)
    (tmp_path / "state" / "tool-lists" / f"{hashes['same']}.json").unlink()
    (tmp_path / "up.json").write_text(json.dumps({"tools": [FIND]}))
    async with connected([agent_with(same, upgraded)]) as agents, worker(agents):
        assert "up__write" not in agents[0].registry.tools
        await decide(harness.client, handle.id, "c1", approved=True, by="test")
        result = await handle.result()
    assert result.outcome is Outcome.ANSWERED, result.steps
    assert 'write got {"q": "x"}' in result.answer
    (_, plan), (_, interpret) = model.requests
    assert {t.name for t in interpret.tools} == {t.name for t in plan.tools}


async def test_a_turn_that_recorded_its_lists_inline_is_served_from_its_history(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn recorded before lists were kept by hash: its first step's result carries
    the lists themselves. A worker that did not list them reads them from the turn's
    history, with no store at all."""
    from durable_agent.activities import shield

    by_hash = shield._info

    def inline(served: Any) -> Any:
        info = by_hash(served)
        return info.model_copy(update={"tool_lists": {}, "offered": served.recorded_tools()})

    monkeypatch.setattr(shield, "_info", inline)
    server = misbehaving(tmp_path, {"tools": [FIND, LOOKUP, tool("write", reads=False)]})
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="evil__write", arguments={"q": "x"})])],
        decisions=[lambda r: Reply(text=last_result(r))],
    )
    task_queue, worker = one_queue(harness, model)
    async with connected([agent_with(server)]) as agents, worker(agents):
        turn = TurnInput(question="Write x", model="scripted")
        handle = await start_turn(harness.client, turn, task_queue)
        await next_pending(handle)
    shutil.rmtree(tmp_path / "state" / "tool-lists")
    (tmp_path / "evil.json").write_text(json.dumps({"tools": [FIND]}))
    async with connected([agent_with(server)]) as agents, worker(agents):
        assert "evil__write" not in agents[0].registry.tools
        await decide(harness.client, handle.id, "c1", approved=True, by="test")
        result = await handle.result()
    assert result.outcome is Outcome.ANSWERED, result.steps
    assert 'write got {"q": "x"}' in result.answer
    (_, plan), (_, interpret) = model.requests
    assert {t.name for t in interpret.tools} == {t.name for t in plan.tools}
