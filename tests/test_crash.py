"""Crash matrix: SIGKILL the worker while each activity kind is in flight, start a
new one; the turn completes with the right answer, completed activities are not
re-run, and the side-effecting `start_return`, approved by a person meanwhile,
wrote exactly one return."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from durable_agent.runtime.turns import AgentClientError, decide, progress_of, start_turn
from durable_agent.shop import ShopStore
from durable_agent.types import Outcome, TurnInput

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["plan", "parse", "dispatch", "interpret"]
"""The activities of a turn with a write (its dispatch screens its result: no parse_output)."""
QUESTION = "I want to return order 123456, it arrived damaged."


def spawn_worker(env: WorkflowEnvironment, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.worker",
            env.client.service_client.config.target_host,
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear in {timeout} s"
        await asyncio.sleep(0.05)


async def approve_when_asked(env: WorkflowEnvironment, workflow_id: str) -> int:
    """Approve the turn's write once it asks; the number of decisions taken."""
    handle = env.client.get_workflow_handle(workflow_id)
    while True:
        try:
            if (await progress_of(handle)).pending:
                await decide(env.client, workflow_id, None, approved=True, by="test")
                return 1
        except (AgentClientError, RPCError):
            pass  # the turn's worker is not up yet
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("kind", KINDS)
async def test_sigkill_during_each_activity_kind(
    env: WorkflowEnvironment, tmp_path: Path, kind: str
) -> None:
    task_queue = f"crash-{kind}-{uuid.uuid4().hex[:6]}"
    db, log, marker = tmp_path / "shop.db", tmp_path / "activities.log", tmp_path / "hung"
    ShopStore(db)  # seeded before either worker starts
    first = spawn_worker(
        env, task_queue, str(db), "--log", str(log), "--crash-after", kind, "--marker", str(marker)
    )
    second = None
    try:
        handle = await start_turn(env.client, TurnInput(question=QUESTION), task_queue)
        approver = asyncio.create_task(approve_when_asked(env, handle.id))
        await wait_for(marker)
        first.kill()
        first.wait()
        second = spawn_worker(env, task_queue, str(db), "--log", str(log))
        result = await asyncio.wait_for(handle.result(), timeout=60)
        assert approver.done() and approver.result() == 1
    finally:
        for proc in (first, second):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()

    assert result.outcome is Outcome.ANSWERED
    assert "(status: requested)" in result.answer
    runs = Counter(log.read_text().split())
    assert runs[kind] == 2, runs  # the one in flight ran again on the new worker
    assert all(runs[k] == 1 for k in KINDS if k != kind), runs  # nothing else re-ran
    assert not runs["parse_output"], runs
    returns = ShopStore(db).returns_for("123456")
    assert len(returns) == 1, returns
    assert returns[0].return_id in result.answer


async def test_sigkill_during_a_quick_read(env: WorkflowEnvironment, tmp_path: Path) -> None:
    """A quick read runs as a local activity, inside a workflow task: a worker killed
    while it runs leaves no record of it, so the new worker reads again (it is
    read-only: that is why only reads may be quick) and the turn answers."""
    task_queue = f"crash-quick-{uuid.uuid4().hex[:6]}"
    db, log, marker = tmp_path / "shop.db", tmp_path / "activities.log", tmp_path / "hung"
    ShopStore(db)
    first = spawn_worker(
        env,
        task_queue,
        str(db),
        "--log",
        str(log),
        "--crash-after",
        "dispatch",
        "--marker",
        str(marker),
    )
    second = None
    try:
        turn = TurnInput(question="Has order 123456 shipped?")
        handle = await start_turn(env.client, turn, task_queue)
        await wait_for(marker)
        first.kill()
        first.wait()
        second = spawn_worker(env, task_queue, str(db), "--log", str(log))
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        for proc in (first, second):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()

    assert result.outcome is Outcome.ANSWERED and "shipped" in result.answer
    runs = Counter(log.read_text().split())
    assert runs["dispatch"] == 2, runs
    assert runs["plan"] == runs["interpret"] == 1, runs
