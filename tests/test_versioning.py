"""The deploy drill: a new version of the workflow code goes out while turns wait
for a person's consent and conversations are mid-chat.

Version 1 is `python worker.py`; version 2 is `python -m tests.drill_worker`,
whose turn and conversation each take one step more than version 1's (a change no
run of version 1 can replay on). With worker versioning (the default), version 2 is
made current with the operator's command while version 1 keeps running: every
waiting turn is approved and finishes on version 1 with its write done once; a
conversation whose turn was in flight lets it finish on version 1, then moves to
version 2 by itself; an idle one moves at its next message, or when
`client.py move-conversations` wakes it; each carries its memory, and its next
turn, on version 2, is given the earlier exchange; no workflow task fails.
Without it (`AGENT_VERSIONING=off`), the same deploy, done the way it is without
versions (the old workers replaced by the new ones), fails every waiting turn's and
the conversation's next workflow task with a non-determinism error.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest
from temporalio.api.deployment.v1 import RoutingConfig, WorkerDeploymentInfo
from temporalio.api.deployment.v1 import WorkerDeploymentVersion as WorkerDeploymentVersionMessage
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentResponse
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from durable_agent.approval import ApprovalDecision, ApprovalResult
from durable_agent.chat import ConversationInput, MessageAccepted
from durable_agent.commands.worker import build_worker
from durable_agent.errors import NoWorker
from durable_agent.model import ModelCatalog, ModelRequest, Reply
from durable_agent.offline import OfflineModel
from durable_agent.runtime import deployments
from durable_agent.runtime.codec import LEAN_DATA_CONVERTER
from durable_agent.runtime.server import free_port, is_listening, temporal_cli
from durable_agent.runtime.turns import decide, progress_of, send, start_chat, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.shop import TOOLS_WITH_POLICY_EXPERT, ShopStore, seed
from durable_agent.types import (
    Exchange,
    Outcome,
    StepKind,
    ToolCall,
    TurnInput,
    TurnLimits,
    TurnOutput,
)
from durable_agent.workflows import AgentTurn, Conversation
from tests.conftest import Harness, last_result
from tests.drill_worker import ChangedConversation
from tests.procs import Forks

ROOT = Path(__file__).resolve().parent.parent
WAITING, IDLE, MID_TURN = 50, 10, 10
"""Turns awaiting approval; conversations between turns, and with a turn awaiting
approval, at the deploy."""
SHIPPED = "Has order 123456 shipped?"


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


def damaged(order_id: str) -> str:
    return f"I want to return order {order_id}, it arrived damaged."


class Process:
    """A child whose output is read all along (kept in `seen`, so that a failure can
    show it and a full pipe never blocks it), from start until `ready` is printed."""

    def __init__(self, args: list[str], env: dict[str, str], ready: str) -> None:
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.seen: list[str] = []
        started = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.seen.append(line)
                if ready in line:
                    started.set()
            started.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        started.wait()
        if not any(ready in line for line in self.seen):
            raise AssertionError(f"{args} exited with {self.proc.wait()}: {self.output()}")

    def output(self) -> str:
        return "".join(self.seen)[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(10)


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
    workflow tasks that failed (of the handle's run; the latest run without one)."""
    builds: set[str] = set()
    failed: list[int] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            builds.add(event.workflow_task_completed_event_attributes.deployment_version.build_id)
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failed.append(event.workflow_task_failed_event_attributes.cause)
    return builds, failed


async def runs(client: Client, workflow_id: str) -> list[WorkflowHandle]:
    """Every run of a workflow, oldest first (the chain of continue-as-new)."""
    found: list[WorkflowHandle] = []
    run_id: str | None = None
    while True:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        if run_id is None:
            handle = client.get_workflow_handle(
                workflow_id, run_id=(await handle.describe()).run_id
            )
        found.insert(0, handle)
        first = await anext(aiter(handle.fetch_history_events()))
        run_id = first.workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id:
            return found


async def versions_of_runs(client: Client, workflow_id: str) -> list[set[str]]:
    """The build ids of each run, oldest first; asserts no workflow task failed."""
    found = []
    for run in await runs(client, workflow_id):
        builds, failed = await story(run)
        assert failed == [], (workflow_id, run.run_id, failed)
        found.append(builds)
    return found


async def version_now(client: Client, workflow_id: str) -> str:
    described = await client.get_workflow_handle(workflow_id).describe()
    return (described.typed_search_attributes.get(deployments.VERSION) or "").rpartition(":")[2]


async def given_memory(client: Client, turn_id: str) -> list[Exchange]:
    """The earlier exchanges a turn was started with (its input's history)."""
    history = await client.get_workflow_handle(turn_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    (turn,) = await client.data_converter.decode(started.input.payloads, [TurnInput])
    return list(turn.history)


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


def cli_of(env: WorkflowEnvironment, tmp_path: Path, queue: str) -> Callable[..., str]:
    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "client.py", "--task-queue", queue, *args],
            cwd=ROOT,
            env=drill_env(env, tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    return cli


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


async def next_message(client: Client, chat: WorkflowHandle, text: str) -> MessageAccepted:
    """Send `text`; its turn, on version 2, answers it, given the earlier exchanges."""
    accepted = await send(chat, text)
    turn = client.get_workflow_handle_for(AgentTurn.run, accepted.turn_id)
    assert (await turn.result()).outcome is Outcome.ANSWERED
    assert await story(turn) == ({"v2"}, [])
    assert await given_memory(client, accepted.turn_id), f"{accepted.turn_id}: no memory"
    return accepted


@pytest.mark.slow
async def test_a_deploy_with_versions_breaks_no_turn_and_no_conversation(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client = env.client
    queue = f"drill-{uuid.uuid4().hex[:8]}"
    orders = seed_orders(tmp_path / "shop.db", WAITING + MID_TURN)
    cli = cli_of(env, tmp_path, queue)
    with processes() as running:
        running.append(
            Process(
                [sys.executable, "worker.py"],
                drill_env(env, tmp_path, AGENT_TASK_QUEUE=queue, AGENT_BUILD_ID="v1"),
                "worker ready",
            )
        )
        v1 = running[0]
        turn_ids = await wait_for_approvals(client, [damaged(o) for o in orders[:WAITING]], queue)
        # Conversations mid-chat on version 1: some between turns, some with a turn
        # waiting for consent.
        started = await asyncio.gather(
            *(start_chat(client, ConversationInput(), SHIPPED, queue) for _ in range(IDLE)),
            *(start_chat(client, ConversationInput(), damaged(o), queue) for o in orders[WAITING:]),
        )
        idle = [chat for chat, _ in started[:IDLE]]
        mid_turn = [chat for chat, _ in started[IDLE:]]
        chat_turns = [accepted.turn_id for _, accepted in started[IDLE:]]
        await asyncio.gather(
            *(client.get_workflow_handle(a.turn_id).result() for _, a in started[:IDLE])
        )
        await until(
            lambda: all_awaiting(client, chat_turns), f"{MID_TURN} conversation turns waiting"
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

        # What needs version 1 now: its turns (to their end) and its conversations.
        lines = cli("versions").splitlines()
        assert lines[0] == f"deployment {queue}: current v2"
        turns = WAITING + MID_TURN
        assert lines[lines.index(next(x for x in lines if x.split()[:2] == ["v1", "draining"])) :][
            :2
        ] == [
            f"  {'v1':<24} {'draining':<9} {turns} turns running ({turns} awaiting approval), "
            f"{IDLE + MID_TURN} conversations ({MID_TURN} mid-turn, {IDLE} idle)",
            f"    v1 still needs its workers: {turns} turns finish on it; {MID_TURN} "
            f"conversations move when their turn ends; {IDLE} idle conversations move at "
            "their next message (or now: python client.py move-conversations)",
        ]
        # A turn waiting for consent shows where it runs, and what answers it.
        shown = cli("show", turn_ids[0]).splitlines()
        assert f"version: {queue}:v1" in shown
        assert any(re.fullmatch(r"agent: shop \(fingerprint [0-9a-f]{12}\)", x) for x in shown)
        waiting_lines = [x for x in cli("pending").splitlines() if x.startswith(turn_ids[0])]
        assert len(waiting_lines) == 1 and waiting_lines[0].endswith("  v1")

        # Half the idle conversations: the next message moves each to version 2 first.
        moved_by_message = await asyncio.gather(
            *(next_message(client, chat, "When will it arrive?") for chat in idle[: IDLE // 2])
        )
        assert not any(a.started for a in moved_by_message)
        # The other half: woken by the operator, they move with no message.
        assert "asked to move to v2" in cli("move-conversations")

        async def moved(chats: list[WorkflowHandle]) -> bool:
            return all([await version_now(client, c.id) == "v2" for c in chats])

        await until(lambda: moved(idle), "idle conversations on version 2")

        # Every waiting turn approved: each finishes on version 1, its return written once.
        await asyncio.gather(
            *(decide(client, t, None, approved=True, by="drill") for t in turn_ids + chat_turns)
        )
        outputs: list[TurnOutput] = await asyncio.gather(
            *(
                client.get_workflow_handle_for(AgentTurn.run, t).result()
                for t in turn_ids + chat_turns
            )
        )
        assert all(o.outcome is Outcome.ANSWERED for o in outputs)
        assert [returns_of(tmp_path / "shop.db", o) for o in orders] == [1] * len(orders)
        for t in turn_ids + chat_turns:
            assert await story(client.get_workflow_handle(t)) == ({"v1"}, [])
        # A conversation whose turn was in flight moves once that turn has ended.
        await until(lambda: moved(mid_turn), "conversations whose turn ended on version 2")

        # Each conversation's next message: a turn of version 2, given the memory.
        later = await asyncio.gather(
            *(next_message(client, c, SHIPPED) for c in idle[IDLE // 2 :] + mid_turn)
        )
        for chat, accepted in zip(mid_turn, later[IDLE - IDLE // 2 :], strict=True):
            memory = await given_memory(client, accepted.turn_id)
            assert memory[0].question.startswith("I want to return order"), chat.id
        for chat in idle + mid_turn:
            # Version 1's run, then version 2's: no run moved mid-way, none failed a task.
            assert await versions_of_runs(client, chat.id) == [{"v1"}, {"v2"}], chat.id

        # Version 1's runs replay on version 1's code, moving included; version 2's
        # conversation could not have taken one over mid-run.
        first_run = (await runs(client, mid_turn[0].id))[0]
        history = await first_run.fetch_history()
        assert await replay(history, Conversation) is None
        assert isinstance(await replay(history, ChangedConversation), NondeterminismError)

        # Version 1 drained: nothing needs its workers any more.
        async def drained() -> bool:
            reports = {r.build_id: r for r in await deployments.versions(client, queue, True)}
            return not reports["v1"].needs_workers

        await until(drained, "version 1 drained")
        lines = cli("versions").splitlines()
        assert any(x.split()[:2] == ["v1", "draining"] and " 0 turns" in x for x in lines)
        assert "    nothing needs the workers of v1: stop them" in lines
        assert any(x.split()[:2] == ["v2", "current"] for x in lines)

        # Each turn says which version it ran on: `show` and `list`.
        assert f"version: {queue}:v1" in cli("show", turn_ids[0]).splitlines()
        build: dict[str, str] = {}
        later_ids = [a.turn_id for a in later]

        async def listed() -> bool:  # the list is the server's visibility store: it lags
            rows = [line.split() for line in cli("list", "--limit", "200").splitlines()]
            build.clear()  # columns: id, started (two), status, outcome, agent, build, …
            build.update((row[0], row[6]) for row in rows if len(row) > 6)
            return all(build.get(t, "-") != "-" for t in [*turn_ids, *chat_turns, *later_ids])

        await until(listed, "every turn listed with its version")
        assert {build[t] for t in turn_ids + chat_turns} == {"v1"}
        assert {build[t] for t in later_ids} == {"v2"}
        v1.stop()
        for chat in idle + mid_turn:
            await chat.signal("end")
            await chat.result()
            assert (await versions_of_runs(client, chat.id))[-1] == {"v2"}


async def all_awaiting(client: Client, turn_ids: list[str]) -> bool:
    calls = await asyncio.gather(
        *(awaiting_approval(client.get_workflow_handle(t)) for t in turn_ids),
        return_exceptions=True,
    )
    return all(isinstance(c, str) for c in calls)


async def replay(history: WorkflowHistory, conversation: type) -> BaseException | None:
    replayer = Replayer(workflows=[AgentTurn, conversation], data_converter=LEAN_DATA_CONVERTER)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return result.replay_failure


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
        turn_ids = await wait_for_approvals(client, [damaged(o) for o in orders], queue)
        calls = [await awaiting_approval(client.get_workflow_handle(t)) for t in turn_ids]
        chat, first = await start_chat(client, ConversationInput(), SHIPPED, queue)
        await client.get_workflow_handle(first.turn_id).result()
        running[0].stop()  # without versions, a deploy replaces the workers
        running.append(
            Process(
                [sys.executable, "-m", "tests.drill_worker"],
                drill_env(env, tmp_path, **settings),
                "ready",
            )
        )
        # Neither the approvals nor the next message are ever taken: the new code
        # cannot replay the runs they go to.
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
            asyncio.wait_for(send(chat, "When will it arrive?"), 5),
            return_exceptions=True,
        )
        assert not [a for a in attempts if isinstance(a, (ApprovalResult, MessageAccepted))]
        # An update given up on may leave no trace (its workflow task is dropped with it,
        # as on a busy machine where the new worker took longer than the wait); a signal
        # always gets a workflow task, which the new code fails.
        for t, call_id in zip(turn_ids, calls, strict=True):
            decision = ApprovalDecision(call_id=call_id or "", approved=True, by="drill")
            await client.get_workflow_handle(t).signal(AgentTurn.decide_later, decision)
        await chat.signal(Conversation.upgrade)

        async def failed_everywhere() -> bool:
            stories = [await story(client.get_workflow_handle(t)) for t in [*turn_ids, chat.id]]
            return all(
                WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR in f
                for _, f in stories
            )

        await until(failed_everywhere, "each waiting run failed by the new code", timeout=120)
        assert [returns_of(tmp_path / "shop.db", o) for o in orders] == [0] * len(orders)
        for t in [*turn_ids, chat.id]:
            await client.get_workflow_handle(t).terminate("drill over")


def expert_after_consent() -> ScriptedModel:
    """The parent first asks to start a return (it waits for consent), then asks the
    policy expert, a sub-agent; the expert looks the policy up; both answer with
    what they were told."""
    write = ToolCall(
        id="c1", name="start_return", arguments={"order_id": "123456", "reason": "broken"}
    )
    ask = ToolCall(id="c2", name="policy_expert", arguments={"question": "Do you ship to Canada?"})

    def expert(request: ModelRequest) -> bool:
        return [t.name for t in request.tools] == ["search_policies"]

    def plan(request: ModelRequest) -> Reply:
        if expert(request):
            return Reply(
                calls=[
                    ToolCall(id="e1", name="search_policies", arguments={"query": request.question})
                ]
            )
        return Reply(calls=[write])

    def interpret(request: ModelRequest) -> Reply:
        if expert(request) or "Canada" in last_result(request):
            return Reply(text=last_result(request))
        return Reply(calls=[ask])

    return ScriptedModel(plans=[plan], decisions=[interpret])


async def test_a_sub_agents_turn_runs_on_its_parents_version(harness: Harness) -> None:
    """A parent pinned to version 1 starts its sub-agent's turn after version 2 has
    been made current: the child runs on version 1, beside its parent."""
    client = harness.client
    queue = f"sub-{uuid.uuid4().hex[:8]}"
    model = expert_after_consent()
    agent = harness.agent(TOOLS_WITH_POLICY_EXPERT)

    def worker(build: str, promote: str):  # type: ignore[no-untyped-def]
        settings = replace(Settings.from_env(), versioning=True, build_id=build, promote=promote)
        return build_worker(
            client,
            queue,
            agents=[agent],
            models=ModelCatalog({"scripted": lambda _: model, "offline": lambda _: OfflineModel()}),
            settings=settings,
        )

    async with worker("p1", "always"):
        asked = TurnInput(
            question="Return 123456; and can I get it in Toronto?",
            model="scripted",
            limits=TurnLimits(max_steps=4),
        )
        parent = await start_turn(client, asked, queue)
        await until(lambda: has_pending(parent), "the parent waits for consent")
        async with worker("p2", "never"):
            await deployments.make_current(client, WorkerDeploymentVersion(queue, "p2"))
            await decide(client, parent.id, None, approved=True, by="test")
            result: TurnOutput = await parent.result()
            (call,) = [
                s for s in result.steps if s.kind is StepKind.TOOL_CALL and "expert" in s.text
            ]
            child = client.get_workflow_handle(call.text.rsplit("→ ", 1)[1])
            await child.result()
            # New work goes to version 2 meanwhile: a turn asked now runs there. (Not
            # started eagerly: that hands its first task to a worker of this process,
            # whichever version it is.)
            fresh = await client.start_workflow(
                AgentTurn.run, TurnInput(question=SHIPPED), id=f"{queue}-fresh", task_queue=queue
            )
            await fresh.result()
    assert result.outcome is Outcome.ANSWERED and "Canada" in result.answer
    assert await story(parent) == ({"p1"}, [])
    assert await story(child) == ({"p1"}, [])
    assert await story(fresh) == ({"p2"}, [])


async def has_pending(handle: WorkflowHandle) -> bool:
    return bool((await progress_of(handle)).pending)


def test_a_version_is_named_by_code_and_agents() -> None:
    assert deployments.build_id(["a", "b"]) == deployments.build_id(["b", "a"])
    assert deployments.build_id(["a"]) != deployments.build_id(["a", "b"])
    assert re.fullmatch(r"b-[0-9a-f]{12}", deployments.build_id([]))


async def test_a_description_the_busy_server_cancelled_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server describes a deployment by asking the deployment's own workflow, and a
    busy one (a version being promoted) may cancel that: the read is asked again, so a
    chat page does not show a nameless agent for it; any other refusal is final."""
    monkeypatch.setattr(deployments, "READ_PAUSES_S", (0.01, 0.01))
    asked: list[int] = []

    class Service:
        async def describe_worker_deployment(self, request: object) -> object:
            asked.append(1)
            if len(asked) < 3:
                raise RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")
            return DescribeWorkerDeploymentResponse(
                worker_deployment_info=WorkerDeploymentInfo(
                    routing_config=RoutingConfig(
                        current_deployment_version=WorkerDeploymentVersionMessage(
                            deployment_name="card", build_id="b-1"
                        )
                    )
                )
            )

    class Busy:
        namespace = "default"
        workflow_service = Service()

    now = await deployments.routing(cast(Client, Busy()), "card")
    assert now is not None and now.current == "b-1" and len(asked) == 3

    asked.clear()

    async def refused(request: object) -> object:
        asked.append(1)
        raise RPCError("not allowed", RPCStatusCode.PERMISSION_DENIED, b"")

    monkeypatch.setattr(Busy.workflow_service, "describe_worker_deployment", refused)
    with pytest.raises(RPCError, match="not allowed"):
        await deployments.routing(cast(Client, Busy()), "card")
    assert len(asked) == 1


def copy_of_the_code(tmp_path: Path) -> dict[str, Path]:
    copies = {}
    for package, folder in deployments.core_folders().items():
        copies[package] = tmp_path / "code" / package
        shutil.copytree(folder, copies[package], ignore=shutil.ignore_patterns("__pycache__"))
    return copies


def test_a_change_of_workflow_code_alone_is_a_new_version(tmp_path: Path) -> None:
    folders = copy_of_the_code(tmp_path)
    fingerprints = ["f00d"]
    same = deployments.build_id(fingerprints, folders=folders)
    assert same == deployments.build_id(fingerprints)  # by content, not by place
    loop = folders["durable_agent.workflows"] / "conversation.py"
    loop.write_text(loop.read_text() + "\n# a changed loop\n")
    assert deployments.build_id(fingerprints, folders=folders) != same


def test_a_change_of_tool_code_alone_is_a_new_version(tmp_path: Path) -> None:
    """The agent unchanged (same fingerprint), the store its tools read changed: a turn
    approved after such a deploy would run other tool code, so it is a new version."""
    from durable_agent.shop.tools import TOOLS

    functions = [t.fn for t in TOOLS.tools.values()]
    sources = deployments.sources_of(functions)
    assert [s.split(":")[0] for s in sources] == ["durable_agent.shop"]
    before = deployments.build_id([], sources)
    assert deployments.build_id([]) != before
    assert deployments.sources_of(functions) == sources
    store = ROOT / "shop" / "store.py"
    original = store.read_bytes()
    try:
        store.write_bytes(original + b"\n# a changed store\n")
        assert deployments.build_id([], deployments.sources_of(functions)) != before
    finally:
        store.write_bytes(original)
    # An installed package is named by its distribution's version, not hashed.
    import pydantic

    (installed,) = deployments.sources_of([pydantic.BaseModel.model_validate])
    assert installed == f"pydantic:pydantic=={pydantic.VERSION}"


async def test_a_build_id_reused_for_other_code_is_refused(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """`AGENT_BUILD_ID=r1` kept (in a `.env`, say) for a release whose agent changed:
    the new worker would take turns pinned to r1 and replay them on its code."""
    queue = f"reuse-{uuid.uuid4().hex[:8]}"

    def worker(instructions: str):  # type: ignore[no-untyped-def]
        settings = replace(Settings.from_env(), versioning=True, build_id="r1", promote="always")
        agent = replace(harness.agent(), instructions=instructions)
        return build_worker(env.client, queue, agents=[agent], settings=settings)

    async with worker("You answer about orders.") as first:
        code = first.plugin.code
        await until(lambda: recorded(env.client, queue, code), "the version's code recorded")
    async with worker("You answer about orders.") as again:  # the same release, restarted
        assert again.plugin.code == code
    with pytest.raises(deployments.VersionConflict, match="Give this release a build id"):
        async with worker("You answer about orders, briefly."):
            pass


async def recorded(client: Client, queue: str, code: str) -> bool:
    try:
        await deployments.claim(client, WorkerDeploymentVersion(queue, "r1"), code + "x")
    except deployments.VersionConflict:
        return True
    return False


def test_the_server_command_runs_a_server_no_worker_owns(tmp_path: Path) -> None:
    """`client.py server`: the embedded server's flags and search attributes, in the
    foreground; a worker connected to it stops without stopping it (a rollout stops
    the old version's workers)."""
    port, ui_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    env |= {
        "AGENT_SERVER_PORT": str(port),
        "AGENT_STATE_DIR": str(tmp_path),
        "OTEL_TRACES_EXPORTER": "none",
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "client.py",
            "server",
            "--port",
            str(port),
            "--ui-port",
            str(ui_port),
            "--db-file",
            str(tmp_path / "t.db"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not is_listening("127.0.0.1", port):
            assert server.poll() is None and time.monotonic() < deadline, (
                server.stdout and server.stdout.read()
            )
            time.sleep(0.2)
        worker = Process([sys.executable, "worker.py"], env, "worker ready")
        worker.stop()
        assert worker.proc.returncode == 0 and server.poll() is None, worker.output()
        attributes = subprocess.run(
            [
                temporal_cli(),
                "operator",
                "search-attribute",
                "list",
                "--address",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert "AgentCustomer" in attributes and "AgentFingerprint" in attributes
        second = subprocess.run(
            [sys.executable, "client.py", "server", "--port", str(port)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1 and "already listens" in second.stderr
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0 or server.returncode in (-signal.SIGINT, 130)


@pytest.mark.parametrize(
    ("variable", "value"), [("AGENT_PROMOTE", "sometimes"), ("AGENT_VERSIONING", "maybe")]
)
def test_a_bad_versioning_setting_stops_the_worker_with_one_line(
    cli_forks: Forks, variable: str, value: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    done = cli_forks.run(
        ["worker.py"], env | {variable: value, "AGENT_STATE_DIR": str(tmp_path)}, timeout=60
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and variable in lines[0] and "Traceback" not in done.stderr


async def test_a_turn_whose_versions_workers_are_gone_is_listed_and_decided_at_once(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Version 1's workers stop while a turn waits for consent: `pending` lists it,
    marked; `approve` answers at once that the decision is kept; a message to a
    conversation of that version is refused at once; a decision on a call that is not
    waiting is refused and never applies. A worker of version 1 again: the kept
    decision applies, and the return is written once."""
    client = env.client
    queue = f"drill-gone-{uuid.uuid4().hex[:8]}"
    (order,) = seed_orders(tmp_path / "shop.db", 1)
    cli = cli_of(env, tmp_path, queue)
    settings = {"AGENT_TASK_QUEUE": queue, "AGENT_BUILD_ID": "v1"}
    with processes() as running:
        running.append(
            Process([sys.executable, "worker.py"], drill_env(env, tmp_path, **settings), "ready")
        )
        (turn_id,) = await wait_for_approvals(client, [damaged(order)], queue)
        call_id = await awaiting_approval(client.get_workflow_handle(turn_id))
        chat, first = await start_chat(client, ConversationInput(), SHIPPED, queue)
        await client.get_workflow_handle(first.turn_id).result()
        running[0].stop()

        marked = "  (waiting for workers of v1)"

        async def listed_as_stalled() -> bool:
            lines = [x for x in cli("pending").splitlines() if x.startswith(turn_id)]
            return len(lines) == 1 and lines[0].endswith(marked) and f"  {call_id}  " in lines[0]

        await until(listed_as_stalled, "the turn listed as waiting for version 1's workers")

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "client.py", "--task-queue", queue, *args],
                cwd=ROOT,
                env=drill_env(env, tmp_path),
                capture_output=True,
                text=True,
                timeout=120,
            )

        wrong = run("reject", turn_id, "call_999", "--by", "ops")
        assert wrong.returncode == 1 and "call_999" in wrong.stderr, wrong
        errors = [x for x in wrong.stderr.splitlines() if not x.startswith("note: ")]
        assert len(errors) == 1 and "Traceback" not in wrong.stderr, wrong.stderr
        approved = run("approve", turn_id, "--by", "ops")
        assert approved.returncode == 0, approved.stderr
        assert approved.stdout.splitlines()[0] == f"approved: start_return ({call_id})"
        assert "the decision is recorded" in approved.stdout
        with pytest.raises(NoWorker, match="runs on version v1, and no worker of it runs"):
            await send(chat, "When will it arrive?")
        assert returns_of(tmp_path / "shop.db", order) == 0

        running.append(
            Process([sys.executable, "worker.py"], drill_env(env, tmp_path, **settings), "ready")
        )
        output: TurnOutput = await client.get_workflow_handle_for(AgentTurn.run, turn_id).result()
        assert output.outcome is Outcome.ANSWERED
        assert returns_of(tmp_path / "shop.db", order) == 1
        decisions = [s.text for s in output.steps if s.kind is StepKind.DECISION]
        assert decisions == ["start_return: approved by ops"]
        await send(chat, "When will it arrive?")  # served again: taken
        await chat.signal("end")
        await chat.result()
