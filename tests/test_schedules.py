"""Scheduled agents on the dev server (the time-skipping one has no schedules): a
schedule's turns are ordinary turns, found by schedule; pause stops them and trigger
starts one now; overlap `skip` holds while a turn waits for consent; a worker killed
with SIGKILL loses no scheduled turn; the CLI round trip, and its one-line refusals."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentClient
from durable_agent.errors import (
    AgentClientError,
    InvalidContext,
    InvalidSchedule,
    ScheduleNameTaken,
    UnknownSchedule,
    UnknownTurn,
)
from durable_agent.runtime.codec import data_converter
from durable_agent.schedules import scheduled_turn_id
from durable_agent.shop import ShopStore
from durable_agent.types import Outcome
from tests.conftest import Harness
from tests.test_clean_errors import client_py, command_env, one_line
from tests.test_crash import spawn_worker, wait_for

T = TypeVar("T")
SHIPPED = "Has order 123456 shipped?"
RETURN = "I want to return order 123456, it arrived damaged."


def named(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
async def made(env: WorkflowEnvironment) -> AsyncIterator[list[str]]:
    """Names of the schedules a test adds: deleted after it, so none keeps starting
    turns on the session's server."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(Exception):  # deleted by the test itself
            await env.client.get_schedule_handle(name).delete()


async def _now() -> datetime:
    return datetime.now(timezone.utc)


async def until(
    probe: Callable[[], Awaitable[T]], ready: Callable[[T], bool], timeout: float = 60
) -> T:
    """`probe()` once `ready` holds of it; fails with the last value after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if ready(value):
            return value
        assert time.monotonic() < deadline, value
        await asyncio.sleep(0.2)


async def test_every_starts_ordinary_turns_found_by_schedule(
    harness: Harness, made: list[str]
) -> None:
    """Turns started by `every`: answered as any turn is, each with an id of its own
    under the schedule's (`sched-<customer>-<name>-<time>`), found by schedule in
    `find`, and their customer's alone (`turn_for`)."""
    name = named("every")
    async with harness.worker() as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        made.append(name)
        info = await agents.schedules.add(
            name, SHIPPED, customer="demo", every="1s", model="offline", context={"plan": "pro"}
        )
        assert (info.when, info.overlap, info.customer) == ("every 1s", "skip", "demo")
        assert info.catchup_window == timedelta(seconds=10)  # one interval, the server's floor
        rows = await until(
            lambda: agents.find(schedule=name),
            lambda rows: sum(r.status == "done" for r in rows) >= 2,
        )
        await agents.schedules.delete(name)
    done = [r for r in rows if r.status == "done"]
    assert len({r.workflow_id for r in done}) == len(done)
    for row in done:
        assert row.workflow_id.startswith(scheduled_turn_id("demo", name) + "-")
        assert (row.schedule, row.customer_id, row.outcome) == (name, "demo", "answered")
        result = await (await agents.turn_for(row.workflow_id, customer="demo")).result()
        assert result.outcome is Outcome.ANSWERED and "shipped" in result.answer
        assert result.usage.model_calls >= 1  # counted as any turn's
        with pytest.raises(UnknownTurn):
            await agents.turn_for(row.workflow_id, customer="c-8")
    # Another schedule's turns, or none, are not these.
    assert await agents.find(schedule=named("other")) == []


async def test_pause_stops_turns_and_trigger_starts_one(harness: Harness, made: list[str]) -> None:
    name = named("paused")
    async with harness.worker() as task_queue:
        schedules = AgentClient(harness.client, task_queue=task_queue).schedules
        made.append(name)
        await schedules.add(name, SHIPPED, every="1s", model="offline")
        await until(lambda: schedules.show(name), lambda i: i.turns_started >= 1)
        await schedules.pause(name, note="holiday")
        paused = await until(lambda: schedules.show(name), lambda i: not i.running_turns)
        assert paused.paused and paused.note == "holiday"
        since = time.monotonic()
        await schedules.trigger(name)
        triggered = await until(
            lambda: schedules.show(name),
            lambda i: i.turns_started == paused.turns_started + 1 and not i.running_turns,
        )
        # Three intervals at least, and the triggered turn's: no turn of the schedule's own.
        await asyncio.sleep(max(0.0, 3 - (time.monotonic() - since)))
        assert (await schedules.show(name)).turns_started == triggered.turns_started
        await schedules.resume(name)
        resumed = await until(
            lambda: schedules.show(name), lambda i: i.turns_started > triggered.turns_started
        )
        assert not resumed.paused


async def test_overlap_skip_holds_while_a_turn_waits_for_consent(
    harness: Harness, made: list[str]
) -> None:
    """A scheduled turn that waits for consent is a running turn: the schedule starts
    none beside it (it counts the times it skipped), and goes on once it is decided."""
    name = named("consent")
    async with harness.worker() as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        made.append(name)
        await agents.schedules.add(name, RETURN, every="1s", model="offline")
        (waiting,) = await until(
            lambda: agents.find(schedule=name, awaiting_approval=True), lambda rows: rows
        )
        held = await until(lambda: agents.schedules.show(name), lambda i: i.skipped >= 3)
        assert held.turns_started == 1 and held.running_turns == [waiting.workflow_id]
        turn = agents.turn(waiting.workflow_id)
        await until(turn.pending, lambda pending: pending)
        await turn.approve(by="alice")
        assert (await turn.result()).outcome is Outcome.ANSWERED
        await until(lambda: agents.schedules.show(name), lambda i: i.turns_started >= 2)


async def test_a_worker_sigkill_loses_no_scheduled_turn(
    env: WorkflowEnvironment, tmp_path: Path, made: list[str]
) -> None:
    """The schedule lives in the server: a worker killed mid-turn, and a time that comes
    while no worker runs, lose nothing; the next worker answers both turns."""
    task_queue = f"sched-crash-{uuid.uuid4().hex[:6]}"
    db, marker = tmp_path / "shop.db", tmp_path / "hung"
    ShopStore(db)
    name = named("crash")
    schedules = AgentClient(env.client, task_queue=task_queue).schedules
    first = spawn_worker(
        env, task_queue, str(db), "--crash-after", "dispatch", "--marker", str(marker)
    )
    second = None
    try:
        made.append(name)
        await schedules.add(name, SHIPPED, every="1h", overlap_policy="allow-all")
        await schedules.trigger(name)
        await wait_for(marker)  # the first turn's read ran; the worker hangs after it
        first.kill()
        first.wait()
        one = await until(lambda: schedules.show(name), lambda i: i.turns_started == 1)
        # A turn's id is its scheduled time to the second: the next one a second later.
        started = datetime.now(timezone.utc)
        await until(_now, lambda now: now - started > timedelta(seconds=1.1))
        await schedules.trigger(name)  # no worker runs now
        both = await until(lambda: schedules.show(name), lambda i: i.turns_started == 2)
        second = spawn_worker(env, task_queue, str(db))
        agents = AgentClient(env.client, task_queue=task_queue)
        results = [
            await asyncio.wait_for(agents.turn(t).result(), timeout=90) for t in both.recent_turns
        ]
    finally:
        for proc in (first, second):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert one.recent_turns[0] == both.recent_turns[0]
    assert len(set(both.recent_turns)) == 2
    for result in results:
        assert result.outcome is Outcome.ANSWERED and "shipped" in result.answer


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"every": "soon"}, InvalidSchedule, "every 'soon': give a duration such as 30s"),
        ({"every": "0s"}, InvalidSchedule, "every 0s: give from 1s to 366d"),
        ({"every": "1h", "cron": "0 9 * * *"}, InvalidSchedule, "give exactly one of"),
        ({}, InvalidSchedule, "give exactly one of every"),
        ({"at": "tomorrow"}, InvalidSchedule, "at 'tomorrow': give a time such as"),
        ({"at": "2020-01-01T09:00"}, InvalidSchedule, "that time has passed"),
        ({"cron": "0 9 * * *", "time_zone": "Mars/Olympus"}, InvalidSchedule, "is unknown"),
        ({"every": "1h", "time_zone": "Europe/Berlin"}, InvalidSchedule, "applies to cron"),
        ({"every": "1h", "overlap_policy": "maybe"}, InvalidSchedule, "overlap 'maybe'"),
        (
            {"every": "1h", "catchup_window": timedelta(seconds=1)},
            InvalidSchedule,
            "catch-up window 1s",
        ),
        ({"every": "1h", "agent": "a b"}, InvalidSchedule, "agent 'a b'"),
        ({"every": "1h", "context": {"n": float("nan")}}, InvalidContext, "JSON cannot hold"),
        ({"every": "1h", "question": "x" * 4001}, AgentClientError, "the question is too long"),
        ({"every": "1h", "name": "no spaces"}, InvalidSchedule, "schedule name 'no spaces'"),
        ({"every": "1h", "name": "n" * 65}, InvalidSchedule, "give 1 to 64 letters"),
    ],
)
async def test_bad_schedules_are_refused_in_one_line(
    env: WorkflowEnvironment, options: dict[str, Any], error: type[Exception], says: str
) -> None:
    agents = AgentClient(env.client, task_queue="nobody")
    name = options.pop("name", named("bad"))
    question = options.pop("question", SHIPPED)
    with pytest.raises(error) as raised:
        await agents.schedules.add(name, question, **options)
    assert says in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(UnknownSchedule):  # nothing was added
        await agents.schedules.show(name if " " not in name else "x-none")


async def test_the_server_refuses_a_bad_cron_and_a_name_taken(
    env: WorkflowEnvironment, made: list[str]
) -> None:
    schedules = AgentClient(env.client, task_queue="nobody").schedules
    with pytest.raises(InvalidSchedule, match=r"Minute is not in range"):
        await schedules.add(named("cron"), SHIPPED, cron="61 * * * *")
    name = named("taken")
    made.append(name)
    info = await schedules.add(name, SHIPPED, cron="0 9 * * MON", time_zone="Europe/Berlin")
    # One interval of a weekly cron is a week, as the server computes its times.
    assert info.catchup_window == timedelta(days=7)
    assert info.when == "cron 0 9 * * MON" and info.time_zone == "Europe/Berlin"
    assert info.next_runs[0].astimezone(timezone.utc).hour in (7, 8)  # 9:00 in Berlin
    with pytest.raises(ScheduleNameTaken, match=f"a schedule named '{name}' exists already"):
        await schedules.add(name, SHIPPED, every="1h")
    for act in (schedules.show, schedules.pause, schedules.trigger, schedules.delete):
        with pytest.raises(UnknownSchedule, match="no schedule of turns named 'no-such'"):
            await act("no-such")


def _ids(out: subprocess.CompletedProcess) -> list[str]:
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith("sched-")]


async def test_cli_round_trip(
    env: WorkflowEnvironment, harness: Harness, tmp_path: Path, made: list[str]
) -> None:
    name = named("cli")
    async with harness.worker() as task_queue:
        cli = command_env(env, task_queue, tmp_path)

        def run(*args: str) -> subprocess.CompletedProcess:
            out = client_py(*args, env=cli)
            assert out.returncode == 0, out.stderr
            return out

        made.append(name)
        added = await asyncio.to_thread(
            run,
            *("schedule", "add", name, "--every", "1h", "--customer", "c-9"),
            *("--context", '{"plan": "pro"}', "--model", "offline", SHIPPED),
        )
        assert added.stdout.startswith(f"added {name}  every 1h  active  next: ")
        listed = await asyncio.to_thread(run, "schedule", "list")
        assert any(line.startswith(f"{name}  every 1h") for line in listed.stdout.splitlines())
        shown = (await asyncio.to_thread(run, "schedule", "show", name)).stdout
        assert f"asks: {SHIPPED!r}" in shown and "customer: c-9" in shown
        assert "overlap: skip  catch-up window: 1h" in shown and 'context: {"plan": "pro"}' in shown
        await asyncio.to_thread(run, "schedule", "trigger", name)
        turns = await until(
            lambda: asyncio.to_thread(run, "list", "--schedule", name),
            lambda out: f"schedule: {name}" in out.stdout and "answered" in out.stdout,
        )
        (turn_id,) = _ids(turns)
        assert turn_id.startswith(f"sched-c~9-{name.replace('-', '~')}-")
        assert "answered" in (await asyncio.to_thread(run, "show", turn_id)).stdout
        await asyncio.to_thread(run, "schedule", "pause", name, "--note", "audit")
        assert (
            f"schedule: {name} (paused: audit)"
            in (await asyncio.to_thread(run, "schedule", "show", name)).stdout
        )
        await asyncio.to_thread(run, "schedule", "resume", name)
        deleted = await asyncio.to_thread(run, "schedule", "delete", name)
        assert deleted.stdout.strip() == f"deleted {name}; the turns it started stay"
        gone = await asyncio.to_thread(client_py, "schedule", "show", name, env=cli)
        one_line(gone, f"error: no schedule of turns named '{name}'")


CLI_REFUSALS = [
    (["--every", "soon"], "error: every 'soon': give a duration such as 30s"),
    (["--cron", "61 * * * *"], "error: schedule "),
    (["--at", "2020-01-01T09:00"], "error: at 2020-01-01T09:00:00+00:00: that time has passed"),
    (["--cron", "0 9 * * *", "--time-zone", "Mars/Olympus"], "error: time zone 'Mars/Olympus'"),
    (["--every", "1h", "--cron", "0 9 * * *"], "error: --cron: not allowed with argument"),
    (["--every", "1h", "--overlap", "maybe"], "error: --overlap: invalid choice: 'maybe'"),
    (["--every", "1h", "--context", "[1]"], "error: --context: give a JSON object"),
    (["--every", "1h", "--catchup", "1s"], "error: catch-up window 1s"),
    ([], "error: one of the arguments --cron --every --at is required"),
]


async def test_cli_refuses_bad_input_in_one_line(
    env: WorkflowEnvironment, tmp_path: Path, made: list[str]
) -> None:
    cli = command_env(env, f"nobody-{uuid.uuid4().hex[:6]}", tmp_path)
    taken = named("taken")
    made.append(taken)
    await AgentClient(env.client).schedules.add(taken, SHIPPED, every="1h")

    def refused(args: list[str]) -> subprocess.CompletedProcess:
        return client_py("schedule", *args, env=cli)

    cases = [
        *((["add", named("bad"), *flags, SHIPPED], says) for flags, says in CLI_REFUSALS),
        (["add", "bad name", "--every", "1h", SHIPPED], "error: schedule name 'bad name'"),
        (["add", taken, "--every", "1h", SHIPPED], f"error: a schedule named '{taken}' exists"),
        (["show", "no-such"], "error: no schedule of turns named 'no-such'"),
        (["trigger", "no-such"], "error: no schedule of turns named 'no-such'"),
        (["list", "--limit", "0"], "error: --limit: give a whole number from 1 to 1000"),
    ]
    outs = await asyncio.gather(*(asyncio.to_thread(refused, args) for args, _ in cases))
    for (_, says), out in zip(cases, outs, strict=True):
        one_line(out, says)


@pytest.mark.parametrize("encrypted", [False, True])
async def test_a_scheduled_turn_runs_with_every_payload_stored_and_encrypted(
    env: WorkflowEnvironment, store: ShopStore, tmp_path: Path, made: list[str], encrypted: bool
) -> None:
    """With every payload in the store (and encrypted), the schedule still holds its
    turn's input inline (the server's scheduler cannot read the store), and each turn it
    starts answers."""
    environ = {"AGENT_PAYLOAD_STORE": f"local:{tmp_path}", "AGENT_PAYLOAD_THRESHOLD": "0"}
    if encrypted:
        environ["AGENT_ENCRYPTION_KEY"] = "k1:" + base64.b64encode(bytes(32)).decode()
    client = await Client.connect(
        env.client.service_client.config.target_host, data_converter=data_converter(environ)
    )
    name = named("stored")
    async with Harness(client, store).worker() as task_queue:
        agents = AgentClient(client, task_queue=task_queue)
        made.append(name)
        await agents.schedules.add(name, SHIPPED, every="1h", model="offline")
        await agents.schedules.trigger(name)
        (row,) = await until(
            lambda: agents.find(schedule=name), lambda rows: rows and rows[0].status == "done"
        )
        result = await agents.turn(row.workflow_id).result()
        assert (await agents.schedules.show(name)).question == SHIPPED
    assert result.outcome is Outcome.ANSWERED and "shipped" in result.answer
    if encrypted:  # what the server keeps of the schedule holds no plaintext
        raw = await env.client.get_schedule_handle(name).describe()
        assert b"123456" not in raw.raw_description.SerializeToString()
