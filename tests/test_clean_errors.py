"""What printed a traceback prints one line now, and exits 1: `show --follow` on a turn
whose workflow task fails, `approve` and `reject` interrupted with Ctrl-C while they
wait, a question with NUL bytes read from standard input; and a worker stopped with a
turn in flight logs no OpenTelemetry "Failed to detach context" traceback."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durable_agent.approval import ApprovalDecision, ApprovalResult
from durable_agent.client import AgentClient, AgentClientError
from durable_agent.errors import UnknownTurn
from durable_agent.runtime.turns import loss_of, progress_of, start_turn
from durable_agent.types import PendingApproval, ToolCall, TurnInput, TurnProgress, Usage

ROOT = Path(__file__).resolve().parent.parent


def command_env(env: WorkflowEnvironment, task_queue: str, tmp_path: Path) -> dict[str, str]:
    """The commands' environment: the test session's server, this test's task queue."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OTEL_"))}
    return base | {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_TASK_QUEUE": task_queue,
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHONUNBUFFERED": "1",
    }


def client_py(*args: str, env: dict[str, str], **options: Any) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "client.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        **options,
    )


def one_line(out: subprocess.CompletedProcess, starts: str) -> str:
    """The command's one line of error: exit 1, no traceback."""
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, (out.returncode, out.stderr)
    assert lines[0].startswith(starts), lines[0]
    return lines[0]


@workflow.defn(name="AgentTurn", sandboxed=False)
class BrokenTurn:
    """A turn whose workflow code fails every task (a bug): it stays running."""

    @workflow.run
    async def run(self, turn: Any) -> None:
        raise RuntimeError("a bug in the turn's workflow code")


@asynccontextmanager
async def broken_turn(client: Client) -> AsyncIterator[tuple[str, str]]:
    task_queue = f"broken-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, workflows=[BrokenTurn]):
        turn_id = f"turn-demo-broken-{uuid.uuid4().hex[:8]}"
        await client.start_workflow(
            "AgentTurn", {"question": "hi"}, id=turn_id, task_queue=task_queue
        )
        yield task_queue, turn_id


async def test_show_follow_on_a_turn_whose_workflow_task_fails_is_one_line(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with broken_turn(env.client) as (task_queue, turn_id):
        out = await asyncio_run(
            client_py, "show", turn_id, "--follow", env=command_env(env, task_queue, tmp_path)
        )
    said = one_line(out, f"error: turn {turn_id}")
    assert "workflow task" in said


async def test_show_says_when_a_turns_workflow_task_is_lost_again_and_again(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A turn whose workflow task its workers lose (here: fail) again and again, which
    Temporal gives out later after each: `show` says so first, how often, since when
    and how the first was lost, from the server alone; then what else it can."""
    async with broken_turn(env.client) as (task_queue, turn_id):
        turn = AgentClient(env.client, task_queue=task_queue).turn(turn_id)
        deadline = time.monotonic() + 60
        while (lost := await turn.lost_task()) is None:
            assert time.monotonic() < deadline, "the workflow task was never given out again"
            await asyncio.sleep(0.1)
        times = "1 time" if lost.attempt == 2 else f"{lost.attempt - 1} times"
        line = lost.line()
        assert line.startswith(f"workflow task: lost {times} in a row since "), line
        first = "(the first: failed, workflow worker unhandled failure: a bug in the turn's"
        assert first in line and "the workers' logs say why" in line, line
        out = await asyncio_run(
            client_py, "show", turn_id, env=command_env(env, task_queue, tmp_path)
        )
        assert "Traceback" not in out.stderr, out.stderr
        shown = out.stdout.splitlines()
        assert shown[0] == f"{turn_id} (running)", out.stdout
        assert shown[1].startswith("workflow task: lost "), out.stdout
    # Ended (its worker gone with the block), no turn's task is lost; no turn, one line.
    with pytest.raises(UnknownTurn, match="turn-demo-nope"):
        await AgentClient(env.client).turn("turn-demo-nope").lost_task()


def test_a_lost_tasks_failure_is_one_line_with_no_control_sequence() -> None:
    """What `show` says of a failed workflow task: one line, bounded, no terminal escape
    or control character of the failure's message; a timeout says what it may be."""
    failed = HistoryEvent(event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    failed.workflow_task_failed_event_attributes.cause = (
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR
    )
    failed.workflow_task_failed_event_attributes.failure.message = (
        "bad \x1b[2J\x1b]0;owned\x07 step\nagain\r\n" + "x" * 500
    )
    said = loss_of(failed)
    assert said.startswith("failed, non deterministic error: bad [2J ]0;owned step again xx")
    assert said.isprintable() and len(said) < 200, said
    timed_out = HistoryEvent(event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT)
    assert loss_of(timed_out).startswith("timed out: a worker died holding it")
    assert loss_of(HistoryEvent(event_type=EventType.EVENT_TYPE_TIMER_FIRED)) == ""


async def asyncio_run(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


SINCE = datetime(2026, 11, 26, tzinfo=timezone.utc)


@workflow.defn(name="AgentTurn", sandboxed=False)
class UndecidedTurn:
    """A turn with a call awaiting consent that takes its time over a decision: `decide`
    waits (for ever) when the person says `--by slow`, else records it at once; the
    turn itself never ends."""

    @workflow.run
    async def run(self, turn: Any) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.query
    def progress(self) -> TurnProgress:
        waiting = PendingApproval(
            call=ToolCall(id="call_1", name="t"), why="it writes", since=SINCE
        )
        return TurnProgress(steps=[], usage=Usage(), pending=[waiting])

    @workflow.update
    async def decide(self, decision: ApprovalDecision) -> ApprovalResult:
        if decision.by == "slow":
            await workflow.wait_condition(lambda: False)
        return ApprovalResult(call_id=decision.call_id, approved=decision.approved, tool="t")


async def update_accepted(client: Client, turn_id: str) -> None:
    """Once the turn has taken a `decide` update in (it is in its history)."""
    handle = client.get_workflow_handle(turn_id)
    for _ in range(600):
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_execution_update_accepted_event_attributes"):
                return
        await asyncio.sleep(0.1)
    raise AssertionError("the update never reached the turn")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["approve", "--by", "slow"], "interrupted while turn {} had not yet taken the approval"),
        (["reject", "--by", "slow"], "interrupted while turn {} had not yet taken the rejection"),
        (["approve", "--wait"], "stopped waiting; the approval is recorded and the turn goes on"),
        (["reject", "--wait"], "stopped waiting; the rejection is recorded and the turn goes on"),
    ],
)
async def test_ctrl_c_while_a_decision_waits_is_one_line(
    env: WorkflowEnvironment, tmp_path: Path, args: list[str], says: str
) -> None:
    task_queue = f"undecided-{uuid.uuid4().hex[:8]}"
    async with Worker(env.client, task_queue=task_queue, workflows=[UndecidedTurn]):
        turn_id = f"turn-demo-undecided-{uuid.uuid4().hex[:8]}"
        await env.client.start_workflow(
            "AgentTurn", {"question": "hi"}, id=turn_id, task_queue=task_queue
        )
        command, *flags = args
        deciding = subprocess.Popen(
            [sys.executable, "client.py", command, turn_id, "call_1", *flags],
            cwd=ROOT,
            env=command_env(env, task_queue, tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            if "--wait" in flags:  # it said what was recorded, and waits for the turn
                assert deciding.stdout is not None
                recorded = await asyncio.to_thread(deciding.stdout.readline)
                assert recorded.startswith(("approved: t", "rejected: t")), recorded
            else:  # the turn has the update, and the command waits for its answer
                await update_accepted(env.client, turn_id)
            deciding.send_signal(signal.SIGINT)
            _, err = await asyncio.to_thread(deciding.communicate, timeout=60)
        finally:
            if deciding.poll() is None:
                deciding.kill()
    assert "Traceback" not in err, err
    assert deciding.returncode == 130, err
    assert err.strip().splitlines() == [err.strip()] and err.strip().startswith(
        says.format(turn_id)
    ), err


async def test_agent_client_refuses_a_question_with_nul_bytes(env: WorkflowEnvironment) -> None:
    agents = AgentClient(env.client, task_queue=f"none-{uuid.uuid4().hex[:6]}")
    for question in ("Has order 123456\x00 shipped?", "\x00", "hi\x1b[2J there", "a\x7fb"):
        with pytest.raises(AgentClientError, match="control character"):
            await agents.start(question)


@pytest.mark.parametrize("question", ["Has order 123456\x00 shipped?", "\x00\x00", "hi\x07"])
def test_a_question_with_nul_bytes_from_stdin_is_one_line(
    env: WorkflowEnvironment, tmp_path: Path, question: str
) -> None:
    out = client_py("ask", "-", env=command_env(env, "nobody", tmp_path), input=question)
    said = one_line(out, "error: QUESTION: ")
    assert "control character" in said
    assert "\x00" not in said


async def test_a_traced_worker_stopped_with_turns_in_flight_logs_no_detach_traceback(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A worker that traces (`OTEL_TRACES_EXPORTER`), with one turn waiting for consent
    and one terminated while it ran, then stopped (SIGTERM): each workflow it lets go
    of mid-way once logged "Failed to detach context" with a traceback."""
    task_queue = f"traced-{uuid.uuid4().hex[:8]}"
    environ = command_env(env, task_queue, tmp_path) | {
        "OTEL_TRACES_EXPORTER": "console",
        "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
    }
    spans = tmp_path / "spans.txt"
    with spans.open("w") as printed:
        worker = subprocess.Popen(
            [sys.executable, "worker.py"],
            cwd=ROOT,
            env=environ,
            stdout=printed,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            for _ in range(1200):
                if "worker ready" in spans.read_text() or worker.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            assert "worker ready" in spans.read_text(), spans.read_text()
            waiting, terminated = [
                await start_turn(
                    env.client,
                    TurnInput(question="I want to return order 123456, it arrived damaged"),
                    task_queue,
                )
                for _ in range(2)
            ]
            for turn in (waiting, terminated):
                for _ in range(600):
                    if (await progress_of(turn)).pending:
                        break
                    await asyncio.sleep(0.1)
                assert (await progress_of(turn)).pending
            await terminated.terminate("a test")
            worker.send_signal(signal.SIGTERM)
            _, err = await asyncio.to_thread(worker.communicate, timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
    assert worker.returncode == 0, err
    assert "Failed to detach context" not in err, err
    assert "Traceback" not in err, err
    assert '"name": "chat offline' in spans.read_text()  # it did trace
