"""The benchmark's peers: a clear error without the `peers` extra, the scripted model's
decisions, and (when the extra is installed) a short comparison run."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent.bench import peers
from durable_agent.bench.__main__ import main
from durable_agent.bench.measure import spawn_worker, stop
from durable_agent.bench.models import EXPECTED_MODEL_CALLS, TASKS
from durable_agent.bench.peers import script
from durable_agent.bench.peers.compare import AgentSystem, FloorSystem, compare


def test_peers_without_the_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for peer in peers.PEERS:
        for module in peer.imports:
            monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(SystemExit) as exit:
        main(["--peers"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert 'pip install -e ".[peers]"' in err
    assert "pydantic_ai" in err and "temporalio.langgraph" in err


@pytest.mark.parametrize("task", TASKS)
def test_the_peers_script_costs_what_the_agents_does(task: str) -> None:
    """One model call per round of tools plus the answer, as `TaskModel` costs."""
    results: list[str] = []
    calls = 1
    while batch := script.next_calls(task, len(results)):
        results += [f"{c.name} {c.arguments}" for c in batch]
        calls += 1
    assert calls == EXPECTED_MODEL_CALLS[task]
    assert script.answer(task, results) == " ".join(results[-len(TASKS[task][-1]) :])


def _extra_installed() -> bool:
    try:
        peers.check_installed()
    except peers.PeersNotInstalled:
        return False
    return True


@pytest.mark.skipif(not _extra_installed(), reason='needs pip install -e ".[peers]"')
async def test_the_langgraph_nodes_read_messages_sent_through_the_data_converter() -> None:
    """A node's state reaches its activity as JSON, its messages as plain dicts; the
    nodes turn them back into LangChain's, so ToolNode finds the model's calls."""
    from langchain_core.messages import AIMessage, HumanMessage
    from temporalio.converter import default

    from durable_agent.bench.peers import langgraph

    model = langgraph.ScriptedChatModel(task="two tools at once")
    reply = await model.ainvoke([HumanMessage("?")])
    converter = default().payload_converter
    [sent] = converter.from_payloads(converter.to_payloads([{"messages": [reply]}]))
    assert isinstance(sent["messages"][0], dict)

    [message] = langgraph._messages(sent)
    assert isinstance(message, AIMessage)
    assert [c["name"] for c in message.tool_calls] == ["order_status", "return_status"]
    assert message.tool_calls == reply.tool_calls


@pytest.mark.skipif(not _extra_installed(), reason='needs pip install -e ".[peers]"')
async def test_a_short_comparison_runs_every_system(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = env.client.service_client.config.target_host
    queue = f"test-{uuid.uuid4().hex[:8]}"
    db = tmp_path / "shop.db"
    worker = spawn_worker(address, queue, db)
    try:
        agent = AgentSystem(env.client, queue, worker.pid)
        floor = FloorSystem(env.client, queue, worker.pid)
        # Any live process stands in for the server's: this checks shapes, not CPU.
        out = await compare(agent, floor, address, os.getpid(), db, 1, (2,), 1)
    finally:
        stop(worker)

    figures = out["one_tool_turn"]
    assert list(figures) == ["agent", "floor", *(p.name for p in peers.PEERS)]
    for name, f in figures.items():
        assert f["history_events"] > 0 and f["turns_per_s"]["2"] > 0, name
        if name != "floor":
            assert f["model_calls"] == EXPECTED_MODEL_CALLS, name
    for peer in peers.PEERS:
        assert out["peers"][peer.name]["latency_ratio"] > 0
        assert out["peers"][peer.name]["throughput_ratio"] > 0
