"""Scale-out without containers: what `docker compose up --scale worker=3` runs.

Three `python worker.py` processes poll one task queue of one server and share
one shop database. Sixty turns go out at once: thirty start a return (each for an
order of its own), thirty look things up. When a third of them are done, one
worker is SIGKILLed with turns in flight. Every turn still completes with its
answer on the two that are left, every worker did work (each task in a history
names the worker that ran it), work in flight on the dead worker was taken over,
and no return was written twice.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_agent.runtime.turns import start_turn
from durable_agent.shop import ShopStore, seed
from durable_agent.types import Outcome, TurnInput
from tests.conftest import SEED_CASES

ROOT = Path(__file__).resolve().parent.parent
RETURNS, READS = 30, 30
ORDER_IDS = [f"7{n:05d}" for n in range(1, RETURNS + 1)]


def add_returnable_orders(db: Path) -> None:
    """One shipped order of the demo customer per return turn, shaped like the
    sample order 123456, so that each turn writes a return of its own."""
    template = next(o for o in seed.ORDERS if o[0] == "123456")
    ShopStore(db)  # creates and seeds the file
    with sqlite3.connect(db) as conn:
        conn.executemany(
            f"INSERT INTO orders VALUES ({','.join('?' * len(template))})",
            [(order_id, *template[1:]) for order_id in ORDER_IDS],
        )


def spawn_worker(env: dict[str, str]) -> subprocess.Popen[str]:
    """`python worker.py`, the image's command, configured as compose configures it."""
    proc = subprocess.Popen(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # a note may come first (e.g. about search attributes)
        if "worker ready" in line:
            return proc
    raise AssertionError(f"worker exited with {proc.wait()} before it was ready")


async def who_ran(handle: WorkflowHandle) -> tuple[set[int], bool]:
    """The pids of the workers that ran the turn's tasks (an identity is `pid@host`),
    and whether work in flight was taken over: a task that timed out, or an
    activity that needed a second attempt (nothing else fails here)."""
    pids: set[int] = set()
    taken_over = False
    history = await handle.fetch_history()
    for event in history.events:
        if event.HasField("workflow_task_started_event_attributes"):
            identity = event.workflow_task_started_event_attributes.identity
        elif event.HasField("activity_task_started_event_attributes"):
            attributes = event.activity_task_started_event_attributes
            identity = attributes.identity
            taken_over |= attributes.attempt > 1
        else:
            taken_over |= event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
            continue
        pids.add(int(identity.split("@")[0]))
    return pids, taken_over


@pytest.mark.slow
async def test_three_workers_share_sixty_turns_and_survive_a_sigkill(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    db = tmp_path / "shop.db"
    add_returnable_orders(db)
    task_queue = f"scale-{uuid.uuid4().hex[:8]}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    worker_env = base | {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_TASK_QUEUE": task_queue,
        "AGENT_SHOP_DB": str(db),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        # Returns run without waiting for a person: this test is about workers.
        "AGENT_APPROVAL_WAIVED": "start_return",
        "OTEL_TRACES_EXPORTER": "none",
    }
    workers = [spawn_worker(worker_env) for _ in range(3)]
    victim = workers[2]
    try:
        questions = [
            f"I want to return order {order_id}, it arrived damaged." for order_id in ORDER_IDS
        ]
        reads_cases = [SEED_CASES[i % len(SEED_CASES)] for i in range(READS)]
        questions += [q for q, _ in reads_cases]
        handles = await asyncio.gather(
            *(start_turn(env.client, TurnInput(question=q), task_queue) for q in questions)
        )
        results = [asyncio.ensure_future(h.result()) for h in handles]

        deadline = time.monotonic() + 120
        while sum(r.done() for r in results) < len(results) // 3:
            assert time.monotonic() < deadline, "a third of the turns took over 2 minutes"
            await asyncio.sleep(0.02)
        assert victim.poll() is None
        victim.kill()
        victim.wait()

        outputs = await asyncio.wait_for(asyncio.gather(*results), timeout=180)
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    # Every turn completed with its own answer.
    assert all(r.outcome is Outcome.ANSWERED for r in outputs)
    write_results, read_results = outputs[:RETURNS], outputs[RETURNS:]
    wrong = [
        (q, r.answer)
        for (q, expected), r in zip(reads_cases, read_results, strict=True)
        if expected not in r.answer
    ]
    assert not wrong, wrong[:3]

    # Every worker did work, and what the victim had in flight moved to the others.
    ran = await asyncio.gather(*(who_ran(h) for h in handles))
    pids = set().union(*(p for p, _ in ran))
    assert pids == {w.pid for w in workers}
    assert any(taken_over for _, taken_over in ran), "the kill caught no work in flight"

    # No side effect repeated: one return per order, each answer naming its own.
    store = ShopStore(db)
    for order_id, result in zip(ORDER_IDS, write_results, strict=True):
        returns = store.returns_for(order_id)
        assert len(returns) == 1, (order_id, returns)
        answered = re.search(r"rtn\d+", result.answer)
        assert answered and answered.group(0) == returns[0].return_id, result.answer
