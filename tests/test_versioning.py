"""The deploy drill: a new version of the workflow code goes out while turns wait
for a person's consent and conversations are mid-chat.

Version 1 is `python worker.py`; version 2 is `python -m tests.drill_worker`,
whose turn has one step more than version 1's (a change no turn of version 1 can
replay on). With worker versioning (the default), version 2 is made current with
the operator's command while version 1 keeps running: every waiting turn is
approved and finishes on version 1 with its write done once, each conversation's
next message is answered by a turn of version 2, and no workflow task fails.
Without it (`AGENT_VERSIONING=off`), the same deploy, done the way it is without
versions (the old workers replaced by the new ones), fails every waiting turn's
next workflow task with a non-determinism error.
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
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.testing import WorkflowEnvironment

from durable_agent.approval import ApprovalDecision
from durable_agent.chat import ConversationInput
from durable_agent.runtime import deployments
from durable_agent.runtime.server import temporal_cli
from durable_agent.runtime.turns import decide, progress_of, send, start_chat, start_turn
from durable_agent.types import Outcome, TurnInput, TurnOutput
from shop import ShopStore, seed
from workflows import AgentTurn

ROOT = Path(__file__).resolve().parent.parent
WAITING, CHATS = 50, 20


def seed_orders(db: Path, count: int) -> list[str]:
    """`count` shipped orders of the demo customer shaped like the sample order
    123456, each for a return of its own."""
    template = next(o for o in seed.ORDERS if o[0] == "123456")
    ids = [f"8{n:05d}" for n in range(1, count + 1)]
    ShopStore(db)  # creates and seeds the file
    with sqlite3.connect(db) as conn:
        conn.executemany(
            f"INSERT INTO orders VALUES ({','.join('?' * len(template))})",
            [(order_id, *template[1:]) for order_id in ids],
        )
    return ids


def returns_of(db: Path, order_id: str) -> int:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM returns WHERE order_id = ?", (order_id,)
        ).fetchone()
    return int(count)


class Process:
    def __init__(self, args: list[str], env: dict[str, str], ready: str) -> None:
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert self.proc.stdout is not None
        seen = []
        for line in self.proc.stdout:
            seen.append(line)
            if ready in line:
                return
        raise AssertionError(f"{args} exited with {self.proc.wait()}: {''.join(seen)[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    try:
        yield started
    finally:
        for p in started:
            p.stop()


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"still not so after {timeout:.0f} s: {what}"
        await asyncio.sleep(0.2)


async def awaiting_approval(handle: WorkflowHandle) -> str | None:
    progress = await progress_of(handle, timeout=10)
    return progress.pending[0].call.id if progress.pending else None


async def story(handle: WorkflowHandle) -> tuple[set[str], list[int]]:
    """The build ids that completed the workflow's tasks, and the causes of the
    workflow tasks that failed."""
    builds: set[str] = set()
    failed: list[int] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            builds.add(event.workflow_task_completed_event_attributes.deployment_version.build_id)
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failed.append(event.workflow_task_failed_event_attributes.cause)
    return builds, failed


def drill_env(env: WorkflowEnvironment, tmp_path: Path, **settings: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    return base | {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "OTEL_TRACES_EXPORTER": "none",
        **settings,
    }


async def wait_for_approvals(client: Client, questions: list[str], queue: str) -> list[str]:
    handles = await asyncio.gather(
        *(start_turn(client, TurnInput(question=q), queue) for q in questions)
    )
    ids = [h.id for h in handles]

    async def all_waiting() -> bool:
        calls = await asyncio.gather(*(awaiting_approval(h) for h in handles))
        return all(calls)

    await until(all_waiting, f"{len(ids)} turns awaiting approval")
    return ids


@pytest.mark.slow
async def test_a_deploy_with_versions_breaks_no_turn_and_no_conversation(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client = env.client
    queue = f"drill-{uuid.uuid4().hex[:8]}"
    orders = seed_orders(tmp_path / "shop.db", WAITING)
    with processes() as running:
        running.append(
            Process(
                [sys.executable, "worker.py"],
                drill_env(env, tmp_path, AGENT_TASK_QUEUE=queue, AGENT_BUILD_ID="v1"),
                "worker ready",
            )
        )
        v1 = running[0]
        turn_ids = await wait_for_approvals(
            client, [f"I want to return order {o}, it arrived damaged." for o in orders], queue
        )
        # Conversations mid-chat: one exchange each, on version 1.
        started = await asyncio.gather(
            *(
                start_chat(client, ConversationInput(), "Has order 123456 shipped?", queue)
                for _ in range(CHATS)
            )
        )
        chats = [chat for chat, _ in started]
        await asyncio.gather(
            *(client.get_workflow_handle(accepted.turn_id).result() for _, accepted in started)
        )

        running.append(
            Process(
                [sys.executable, "-m", "tests.drill_worker"],
                drill_env(
                    env,
                    tmp_path,
                    AGENT_TASK_QUEUE=queue,
                    AGENT_BUILD_ID="v2",
                    AGENT_PROMOTE="never",
                ),
                "worker ready",
            )
        )
        # The operator's step (docs/deploy.md): version 2 takes new work.
        subprocess.run(
            [
                str(temporal_cli()),
                "worker",
                "deployment",
                "set-current-version",
                "--address",
                client.service_client.config.target_host,
                "--deployment-name",
                queue,
                "--build-id",
                "v2",
                "--yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        routing = await deployments.routing(client, queue)
        assert routing is not None and routing.current == "v2"

        # Every waiting turn approved: each finishes, on version 1, its return written once.
        await asyncio.gather(
            *(decide(client, t, None, approved=True, by="drill") for t in turn_ids)
        )
        outputs: list[TurnOutput] = await asyncio.gather(
            *(client.get_workflow_handle_for(AgentTurn.run, t).result() for t in turn_ids)
        )
        assert all(o.outcome is Outcome.ANSWERED for o in outputs)
        assert [returns_of(tmp_path / "shop.db", o) for o in orders] == [1] * WAITING
        for t in turn_ids:
            assert await story(client.get_workflow_handle(t)) == ({"v1"}, [])

        # Each conversation's next message is answered by a turn of version 2.
        for chat in chats:
            accepted = await send(chat, "Has order 123456 shipped?")
            turn = client.get_workflow_handle_for(AgentTurn.run, accepted.turn_id)
            assert (await turn.result()).outcome is Outcome.ANSWERED
            assert await story(turn) == ({"v2"}, [])
            _, failed = await story(chat)
            assert failed == []

        # Version 1 drained: nothing runs on it any more, its workers can go.
        async def drained() -> bool:
            reports = {r.build_id: r for r in await deployments.versions(client, queue, True)}
            old = reports["v1"]
            return old.turns == 0 and old.conversations == 0

        await until(drained, "version 1 drained")
        shown = subprocess.run(
            [sys.executable, "client.py", "--task-queue", queue, "versions"],
            cwd=ROOT,
            env=drill_env(env, tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0] == f"deployment {queue}: current v2"
        assert any(line.split()[:2] == ["v1", "draining"] and " 0 turns" in line for line in lines)
        assert any(line.split()[:2] == ["v2", "current"] for line in lines)

        # Each turn says which version it ran on: `show` and `list`.
        def cli(*args: str) -> str:
            done = subprocess.run(
                [sys.executable, "client.py", "--task-queue", queue, *args],
                cwd=ROOT,
                env=drill_env(env, tmp_path),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert f"version: {queue}:v1" in cli("show", turn_ids[0]).splitlines()
        build: dict[str, str] = {}

        async def listed() -> bool:  # the list is the server's visibility store: it lags
            rows = [line.split() for line in cli("list", "--limit", "200").splitlines()]
            build.clear()  # columns: id, started (two), status, outcome, agent, build, …
            build.update((row[0], row[6]) for row in rows if len(row) > 6)
            return all(build.get(t, "-") != "-" for t in [*turn_ids, accepted.turn_id])

        await until(listed, "every turn listed with its version")
        assert {build[t] for t in turn_ids} == {"v1"}
        assert build[accepted.turn_id] == "v2"
        v1.stop()
        for chat in chats:
            await chat.signal("end")
            await chat.result()
            _, failed = await story(chat)
            assert failed == []


async def test_the_same_deploy_without_versions_fails_the_waiting_turns(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client = env.client
    queue = f"drill-off-{uuid.uuid4().hex[:8]}"
    orders = seed_orders(tmp_path / "shop.db", 3)
    settings = {"AGENT_TASK_QUEUE": queue, "AGENT_VERSIONING": "off"}
    with processes() as running:
        running.append(
            Process([sys.executable, "worker.py"], drill_env(env, tmp_path, **settings), "ready")
        )
        turn_ids = await wait_for_approvals(
            client, [f"I want to return order {o}, it arrived damaged." for o in orders], queue
        )
        calls = [await awaiting_approval(client.get_workflow_handle(t)) for t in turn_ids]
        running[0].stop()  # without versions, a deploy replaces the workers
        running.append(
            Process(
                [sys.executable, "-m", "tests.drill_worker"],
                drill_env(env, tmp_path, **settings),
                "ready",
            )
        )
        # The approvals are never accepted: the new code cannot replay the turns.
        attempts = await asyncio.gather(
            *(
                asyncio.wait_for(
                    client.get_workflow_handle(t).execute_update(
                        AgentTurn.decide,
                        ApprovalDecision(call_id=call_id or "", approved=True, by="drill"),
                    ),
                    5,
                )
                for t, call_id in zip(turn_ids, calls, strict=True)
            ),
            return_exceptions=True,
        )
        assert all(isinstance(a, WorkflowUpdateRPCTimeoutOrCancelledError) for a in attempts)

        async def failed_everywhere() -> bool:
            stories = [await story(client.get_workflow_handle(t)) for t in turn_ids]
            return all(
                WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR in f
                for _, f in stories
            )

        await until(failed_everywhere, "each waiting turn failed by the new code", timeout=60)
        assert [returns_of(tmp_path / "shop.db", o) for o in orders] == [0] * len(orders)
        for t in turn_ids:
            await client.get_workflow_handle(t).terminate("drill over")


def test_a_version_is_named_by_code_and_agents() -> None:
    assert deployments.build_id(["a", "b"]) == deployments.build_id(["b", "a"])
    assert deployments.build_id(["a"]) != deployments.build_id(["a", "b"])
    assert re.fullmatch(r"b-[0-9a-f]{12}", deployments.build_id([]))


@pytest.mark.parametrize(
    ("variable", "value"), [("AGENT_PROMOTE", "sometimes"), ("AGENT_VERSIONING", "maybe")]
)
def test_a_bad_versioning_setting_stops_the_worker_with_one_line(
    variable: str, value: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    done = subprocess.run(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env=env | {variable: value, "AGENT_STATE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and variable in lines[0] and "Traceback" not in done.stderr
