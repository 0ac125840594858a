"""Rewind (`client.py rerun`): a finished turn forked from one of its steps, with another
model, on a real server. The fork starts from the original's conversation at that step;
a write the original made is never made again (the same call finds its recorded
result), reads are answered from the record, and bad input is one line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from durable_agent.approval import ApprovalPolicy
from durable_agent.client import AgentClient, TurnResult
from durable_agent.conversation import ToolResult
from durable_agent.errors import AgentClientError, CannotFork, UnknownTurn
from durable_agent.model import Reply
from durable_agent.render import MAX_RESULT_CHARS_LIMIT
from durable_agent.rewind import Comparison, Origin, Served, compare, match
from durable_agent.runtime.codec import data_converter
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import TOOLS, ShopStore
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Fork, Outcome, RecordedCall, StepKind, ToolCall, TurnLimits
from durable_agent.workflows import search
from tests.conftest import Harness, last_result, story
from tests.test_crash import approve_when_asked, spawn_worker, wait_for

ROOT = Path(__file__).resolve().parent.parent

QUESTION = "Has order 123456 shipped? If so I want to return it, it arrived damaged."
LOOKUP = ToolCall(id="c1", name="order_status", arguments={"order_id": "123456"})
RETURN = ToolCall(
    id="c2", name="start_return", arguments={"order_id": "123456", "reason": "arrived damaged"}
)
STOCK = ToolCall(id="c3", name="stock", arguments={"item": "Herbal Handsoap"})
WAIVED = ApprovalPolicy(waived=frozenset({"start_return"}))

reads: Counter[str] = Counter()
"""Calls of `stock`, by item: the worker runs in this process."""


class Item(BaseModel):
    item: str


@tool(quick=True)
def stock(args: Item, ctx: ToolContext[object]) -> str:
    """How many of an item are in stock."""
    reads[args.item] += 1
    return f"{args.item}: 12 in stock"


TOOLS_AND_STOCK = ToolRegistry([*TOOLS.tools.values(), stock])


def three_steps() -> ScriptedModel:
    """[1] looks the order up, [2] starts its return, [3] reads the stock, then answers."""
    return ScriptedModel(
        plans=[Reply(calls=[LOOKUP])],
        decisions=[
            Reply(calls=[RETURN]),
            Reply(calls=[STOCK]),
            Reply(text="Your return is started."),
        ],
    )


async def original(harness: Harness, agents: AgentClient) -> TurnResult:
    result = await agents.ask(QUESTION, model="scripted")
    assert result.outcome is Outcome.ANSWERED
    assert [s.iteration for s in story(result) if s.kind is StepKind.TOOL_CALL] == [1, 2, 3]
    assert len(harness.store.returns_for("123456")) == 1
    return result


class Forking:
    """The original's model, then the fork's, on one worker (the `scripted` spec),
    and the `other` spec for the fork when a test gives one."""

    def __init__(self, first: ScriptedModel) -> None:
        self.models = [first]

    def then(self, model: ScriptedModel) -> None:
        self.models.append(model)

    @property
    def current(self) -> ScriptedModel:
        return self.models[-1]

    async def plan(self, request, stream=None):  # type: ignore[no-untyped-def]
        return await self.current.plan(request, stream)

    async def interpret(self, request, stream=None):  # type: ignore[no-untyped-def]
        return await self.current.interpret(request, stream)

    provider = "scripted"
    name = "scripted"


async def test_a_fork_before_the_write_making_the_same_call_writes_nothing(
    harness: Harness,
) -> None:
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(harness, agents)
        again = ScriptedModel(
            decisions=[Reply(calls=[RETURN.model_copy(update={"id": "n1"})]), Reply(text="ok")]
        )
        model.then(again)
        fork = await agents.rerun(first.workflow_id, from_step=2)
        result = await fork.result()

    assert fork.id == f"{first.workflow_id}-fork-1"
    assert result.outcome is Outcome.ANSWERED
    assert len(harness.store.returns_for("123456")) == 1  # the world holds one write
    (served,) = [s for s in result.steps if s.kind is StepKind.RECORDED]
    assert served.iteration == 2
    assert served.text == (
        f"{RETURN.render()}: already done in {first.workflow_id} (step 2); "
        "its recorded result, not run again"
    )
    assert not [s for s in result.steps if s.kind is StepKind.APPROVAL]
    # The fork's model read the original's result of the write, as its own call's.
    recorded = next(
        m
        for m in model.models[0].requests[-1][1].messages
        if isinstance(m, ToolResult) and m.tool == "start_return"
    )
    assert last_result(again.requests[-1][1]) == recorded.text
    # Its story starts with the original's step 1, as recorded.
    assert [s.render() for s in story(result) if s.iteration == 1] == [
        s.render() for s in story(first) if s.iteration == 1
    ]
    assert await fork.origin() == Origin(parent=first.workflow_id, step=2)
    (row,) = [
        wf
        async for wf in harness.client.list_workflows(
            f"{search.FORK_OF.name} = '{first.workflow_id}'"
        )
    ]
    assert row.id == fork.id


async def test_a_fork_after_the_write_reads_its_result_and_writes_nothing(
    harness: Harness,
) -> None:
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(harness, agents)
        (created,) = harness.store.returns_for("123456")
        later = ScriptedModel(decisions=[Reply(text="Return started; that is all.")])
        model.then(later)
        result = await (await agents.rerun(first.workflow_id, from_step=3, model="")).result()

    assert result.answer == "Return started; that is all."
    assert harness.store.returns_for("123456") == [created]
    (request,) = [r for _, r in later.requests]
    written = [
        m for m in request.messages if isinstance(m, ToolResult) and m.tool == "start_return"
    ]
    assert len(written) == 1 and created.return_id in written[0].text
    # Step 3 was decided anew: its answer is recorded at step 2, the round it read.
    assert story(result)[-1].kind is StepKind.ANSWER and story(result)[-1].iteration == 2


async def test_reads_in_a_fork_are_served_from_the_record(harness: Harness) -> None:
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(harness, agents)
        counted = reads["Herbal Handsoap"]
        same = ScriptedModel(
            plans=[Reply(calls=[LOOKUP.model_copy(update={"id": "n1"})])],
            decisions=[
                Reply(calls=[STOCK.model_copy(update={"id": "n2"})]),
                Reply(text="In stock."),
            ],
        )
        model.then(same)
        result = await (await agents.rerun(first.workflow_id, from_step=1)).result()
        assert reads["Herbal Handsoap"] == counted  # the stock was not read again

        live = ScriptedModel(
            decisions=[Reply(calls=[STOCK.model_copy(update={"id": "n3"})]), Reply(text="ok")]
        )
        model.then(live)
        rerun = await (await agents.rerun(first.workflow_id, from_step=2, live_reads=True)).result()
        assert reads["Herbal Handsoap"] == counted + 1  # live_reads: read again

    # With live_reads the reads before the step run again too, and the model reads
    # their new results; the write before it stands.
    again = [s for s in rerun.steps if "read again, live" in s.text]
    assert [(s.iteration, s.kind) for s in again] == [(1, StepKind.OBSERVATION)]
    assert again[0].text.startswith("order_status: read again, live: Order id: 123456.")
    assert not [s for s in rerun.steps if s.kind is StepKind.RECORDED]
    assert len(harness.store.returns_for("123456")) == 1

    served = [s.text for s in result.steps if s.kind is StepKind.RECORDED]
    assert served == [
        f"{LOOKUP.render()}: read from the record of {first.workflow_id} (step 1)",
        f"{STOCK.render()}: read from the record of {first.workflow_id} (step 3)",
    ]
    assert not [s for s in result.steps if s.kind is StepKind.TOOL_CALL]
    assert "12 in stock" in last_result(same.requests[-1][1])


async def test_a_second_copy_of_a_recorded_write_in_a_fork_is_a_new_write(
    harness: Harness,
) -> None:
    """The second of two identical writes where the original made one is a new write:
    though the agent waives it, it goes the way of a write that needs consent, and the
    shop's check answers first that it cannot be done (one open return per order), so
    nobody is asked and nothing runs (`tests/test_write_consent.py` asks and counts)."""
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(harness, agents)
        other = RETURN.model_copy(update={"id": "n1", "arguments": {**RETURN.arguments}})
        twice = ScriptedModel(
            decisions=[Reply(calls=[other]), Reply(calls=[other.model_copy(update={"id": "n2"})])]
            + [Reply(text="done")]
        )
        model.then(twice)
        result = await (await agents.rerun(first.workflow_id, from_step=2)).result()

    (served,) = [s for s in result.steps if s.kind is StepKind.RECORDED]
    assert served.calls[0].id == "n1"
    checked = [s for s in result.steps if "not asked, it cannot be done" in s.text]
    assert [s.observation.call_id for s in checked if s.observation] == ["n2"]
    assert not [s for s in result.steps if s.kind is StepKind.TOOL_CALL and s.iteration >= 2]
    assert len(harness.store.returns_for("123456")) == 1


async def test_bad_input_is_one_clear_error(harness: Harness) -> None:
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(harness, agents)
        with pytest.raises(UnknownTurn, match="no turn with workflow id 'turn-nope'"):
            await agents.rerun("turn-nope", from_step=1)
        with pytest.raises(CannotFork, match=r"has steps 1 to 3 \(see `show`\): give a step"):
            await agents.rerun(first.workflow_id, from_step=4)
        with pytest.raises(CannotFork, match="give a step of the turn"):
            await agents.rerun(first.workflow_id, from_step=0)


async def test_a_fork_on_another_version_of_the_agent_is_refused(harness: Harness) -> None:
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(harness, agents)
    changed = replace(
        harness.agent(TOOLS_AND_STOCK, approvals=WAIVED), instructions="Answer in verse."
    )
    async with harness.worker(model, agents=[changed]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        fork = await agents.rerun(first.workflow_id, from_step=1)
        # Its stream ends (as `rerun` reads it), and its result says why.
        events = [e.event async for e in fork.events()]
        assert [e.type for e in events] == ["step"]  # its question's screen, then no end
        with pytest.raises(AgentClientError, match="a fork runs the agent the turn ran"):
            await fork.result()
    assert len(harness.store.returns_for("123456")) == 1


MOVING = TurnLimits(continue_after_events=10)
"""Continue as new at every safe point: a run a round."""


async def test_a_fork_across_a_continue_as_new_starts_from_any_run(harness: Harness) -> None:
    """The original continued as new at each round; forks from a step of its
    first run and of its last read the conversation of that step, make no write and no
    read again, and finish across runs of their own."""
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await agents.ask(QUESTION, model="scripted", limits=MOVING)
        assert first.outcome is Outcome.ANSWERED and first.runs >= 3
        assert [s.iteration for s in story(first) if s.kind is StepKind.TOOL_CALL] == [1, 2, 3]
        asked = [r.messages for _, r in model.current.requests]
        counted = reads["Herbal Handsoap"]

        model.then(three_steps())  # from step 1, the same calls: all from the record
        again = await (await agents.rerun(first.workflow_id, from_step=1)).result()
        late = ScriptedModel(decisions=[Reply(calls=[STOCK]), Reply(text="In stock.")])
        model.then(late)  # from step 3, in the original's last run
        later = await (await agents.rerun(first.workflow_id, from_step=3)).result()

    assert len(harness.store.returns_for("123456")) == 1  # the world holds one write
    assert reads["Herbal Handsoap"] == counted  # no read ran again
    assert again.outcome is Outcome.ANSWERED and again.runs > 1
    assert [s.text for s in again.steps if s.kind is StepKind.RECORDED] == [
        f"{LOOKUP.render()}: read from the record of {first.workflow_id} (step 1)",
        f"{RETURN.render()}: already done in {first.workflow_id} (step 2); "
        "its recorded result, not run again",
        f"{STOCK.render()}: read from the record of {first.workflow_id} (step 3)",
    ]
    assert not [s for s in again.steps if s.kind is StepKind.TOOL_CALL]
    # From step 3: the conversation the original's model decided step 3 from, rebuilt
    # from the model calls of its three runs; its story begins with the original's.
    assert later.answer == "In stock."
    assert late.requests[0][1].messages == asked[2]
    assert [s.render() for s in story(later) if s.iteration < 3] == [
        s.render() for s in story(first) if s.iteration < 3
    ]
    (served,) = [s for s in later.steps if s.kind is StepKind.RECORDED]
    assert served.iteration == 3 and served.text.startswith(f"{STOCK.render()}: read from")


async def test_a_replay_of_a_turn_that_continued_as_new_follows_it_through_its_runs(
    harness: Harness,
) -> None:
    """The replay continues as new too: its place in the recording goes with it."""
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await agents.ask(QUESTION, model="scripted", limits=MOVING)
        assert first.runs >= 3
        counted = reads["Herbal Handsoap"]
        model.then(three_steps())
        replayed = await (await agents.replay(first.workflow_id)).result()

    assert replayed.runs > 1
    assert compare(first.steps, replayed.steps) == Comparison(3, 3, None)
    assert reads["Herbal Handsoap"] == counted
    assert len(harness.store.returns_for("123456")) == 1


class PageNumber(BaseModel):
    n: int


@tool(max_result_chars=MAX_RESULT_CHARS_LIMIT)
def big_page(args: PageNumber, ctx: ToolContext[object]) -> str:
    """A page of 250,000 characters, read whole."""
    return f"page {args.n} " + "w" * (MAX_RESULT_CHARS_LIMIT - 10)


async def test_a_fork_whose_conversation_one_payload_cannot_carry_needs_the_store(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nine pages of 250,000 characters before step 10: more than Temporal takes in one
    payload (2 MiB), which the fork's input is without the payload store. One clear
    error; with the store, the fork goes ahead."""
    pages = [ToolCall(id=f"p{n}", name="big_page", arguments={"n": n}) for n in range(1, 11)]
    model = Forking(
        ScriptedModel(
            plans=[Reply(calls=[pages[0]])],
            decisions=[*(Reply(calls=[c]) for c in pages[1:]), Reply(text="read")],
        )
    )
    monkeypatch.setenv("AGENT_PAYLOAD_STORE", "off")  # on by default
    config = harness.client.config()
    config["data_converter"] = data_converter()
    inline = Harness(Client(**config), harness.store)
    async with inline.worker(model, ToolRegistry([big_page])) as task_queue:
        agents = AgentClient(inline.client, task_queue=task_queue)
        first = await agents.ask("read", model="scripted", limits=TurnLimits(max_steps=12))
        assert first.outcome is Outcome.ANSWERED
        with pytest.raises(CannotFork, match="more than Temporal takes in one payload"):
            await agents.rerun(first.workflow_id, from_step=10)

    monkeypatch.setenv("AGENT_PAYLOAD_STORE", f"local:{tmp_path / 'payloads'}")
    config = harness.client.config()
    config["data_converter"] = data_converter()
    stored = Harness(Client(**config), harness.store)
    model.then(ScriptedModel(decisions=[Reply(text="read again")]))
    async with stored.worker(model, ToolRegistry([big_page])) as task_queue:
        agents = AgentClient(stored.client, task_queue=task_queue)
        fork = await (await agents.rerun(first.workflow_id, from_step=10)).result()
    assert fork.answer == "read again"
    assert last_result(model.current.requests[0][1]).startswith("page 9 ")


def cli(
    tmp_path: Path, harness: Harness, task_queue: str, *args: str
) -> subprocess.CompletedProcess:
    """`client.py --task-queue TASK_QUEUE ARGS` against the test session's server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OTEL_"))}
    env.update(
        TEMPORAL_ADDRESS=harness.client.service_client.config.target_host,
        TEMPORAL_CONFIG_FILE=str(tmp_path / "no-such-temporal.toml"),
        AGENT_STATE_DIR=str(tmp_path / "state"),
        AGENT_PAYLOAD_STORE="off",  # reads this process's store (tests/conftest.py)
    )
    return subprocess.run(
        [sys.executable, "client.py", "--task-queue", task_queue, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


async def test_rerun_and_show_on_the_command_line(harness: Harness, tmp_path: Path) -> None:
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(harness, agents)
        model.then(ScriptedModel(decisions=[Reply(calls=[RETURN]), Reply(text="Done again.")]))
        instructions = tmp_path / "terse.txt"
        instructions.write_text("Answer in five words.")
        args = ["rerun", first.workflow_id, "--from-step", "2", "--instructions", str(instructions)]
        rerun = await asyncio.to_thread(cli, tmp_path, harness, task_queue, *args)
        assert rerun.returncode == 0, rerun.stderr
        fork = f"{first.workflow_id}-fork-1"
        shown = await asyncio.to_thread(cli, tmp_path, harness, task_queue, "show", fork)

    assert f"[2] recorded    {RETURN.render()}: already done in {first.workflow_id}" in rerun.stdout
    assert "answer (answered): Done again." in rerun.stdout
    assert model.current.requests[0][1].instructions == "Answer in five words."
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[:2] == [
        f"{fork} (completed)",
        f"fork of {first.workflow_id} from step 2",
    ]
    assert len(harness.store.returns_for("123456")) == 1


async def test_bad_input_on_the_command_line_is_one_line(harness: Harness, tmp_path: Path) -> None:
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        first = await original(harness, AgentClient(harness.client, task_queue=task_queue))

        async def rerun(*args: str) -> str:
            out = await asyncio.to_thread(cli, tmp_path, harness, task_queue, "rerun", *args)
            assert out.returncode == 1, out.stdout + out.stderr
            assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
            return out.stderr.strip()

        wid = first.workflow_id
        assert await rerun("turn-nope", "--from-step", "1") == (
            "error: no turn with workflow id 'turn-nope'"
        )
        assert (await rerun(wid, "--from-step", "7")).startswith(
            f"error: turn {wid} has steps 1 to 3 (see `show`): give a step from 1 to 3, not 7"
        )
        assert (await rerun(wid, "--from-step", "0")).startswith(
            "error: --from-step: give a step number"
        )
        assert (await rerun(wid, "--from-step", "1", "--instructions", "/no/such")).startswith(
            "error: --instructions: cannot read /no/such"
        )
        assert (await rerun(wid, "--from-step", "1", "--model", "nosuch:x")).startswith(
            f"error: fork {wid}-fork-1: its model cannot be used: nosuch:x failed (unknown model)"
        )
    assert len(harness.store.returns_for("123456")) == 1


async def test_a_fork_survives_a_killed_worker_and_writes_once(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The worker running a fork is SIGKILLed after its model call did its work; a new
    worker finishes the fork, which makes the original's write again: once in all."""
    task_queue = f"rewind-crash-{uuid.uuid4().hex[:6]}"
    db, log, marker = tmp_path / "shop.db", tmp_path / "activities.log", tmp_path / "hung"
    ShopStore(db)
    agents = AgentClient(env.client, task_queue=task_queue)
    workers = [spawn_worker(env, task_queue, str(db))]
    try:
        turn = await agents.start("I want to return order 123456, it arrived damaged.")
        approver = asyncio.create_task(approve_when_asked(env, turn.id))
        first = await turn.result()
        assert approver.done() and len(ShopStore(db).returns_for("123456")) == 1
        workers[0].kill()
        workers[0].wait()

        crash = ["--log", str(log), "--crash-after", "plan", "--marker", str(marker)]
        workers.append(spawn_worker(env, task_queue, str(db), *crash))
        fork = await agents.rerun(first.workflow_id, from_step=1)
        # Generous: a worker process starts in seconds, many more on a busy machine.
        await wait_for(marker, timeout=120)
        workers[1].kill()
        workers[1].wait()
        workers.append(spawn_worker(env, task_queue, str(db), "--log", str(log)))
        result = await asyncio.wait_for(fork.result(), timeout=180)
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert result.outcome is Outcome.ANSWERED
    (created,) = ShopStore(db).returns_for("123456")
    assert created.return_id in result.answer
    assert [s.kind for s in result.steps if s.kind is StepKind.RECORDED] == [StepKind.RECORDED]
    runs = Counter(log.read_text().split())
    assert runs["plan"] == 2, runs  # the one in flight ran again on the new worker
    assert runs["dispatch"] == 0 and runs["check"] == 0, runs  # the write never ran again


async def test_a_replay_is_served_from_the_record_until_it_diverges(
    harness: Harness, tmp_path: Path
) -> None:
    model = Forking(three_steps())
    async with harness.worker(model, TOOLS_AND_STOCK, approvals=WAIVED) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(harness, agents)
        counted = reads["Herbal Handsoap"]

        model.then(three_steps())  # the same calls, in the same order
        same = await (await agents.replay(first.workflow_id)).result()
        assert reads["Herbal Handsoap"] == counted

        wrong = ScriptedModel(  # goes wrong at step 2: reads the stock before the return
            plans=[Reply(calls=[LOOKUP])],
            decisions=[Reply(calls=[STOCK]), Reply(calls=[RETURN]), Reply(text="Done.")],
        )
        model.then(wrong)
        shown = await asyncio.to_thread(
            cli, tmp_path, harness, task_queue, "replay", first.workflow_id
        )
        assert shown.returncode == 0, shown.stderr
        assert reads["Herbal Handsoap"] == counted + 1  # live from the divergence on

    assert compare(first.steps, same.steps) == Comparison(recorded=3, served=3, diverged_at=None)
    assert [s.kind for s in same.steps if s.calls and s.kind is not StepKind.SHIELD] == [
        StepKind.PLAN,
        StepKind.RECORDED,
        StepKind.CONTINUE,
        StepKind.RECORDED,
        StepKind.CONTINUE,
        StepKind.RECORDED,
    ]
    replay = f"{first.workflow_id}-replay-2"
    assert shown.stdout.splitlines()[0] == f"{replay}: replay of {first.workflow_id}"
    assert f"[2] tool_call   {STOCK.render()}" in shown.stdout
    assert f"[3] recorded    {RETURN.render()}: already done in {first.workflow_id}" in shown.stdout
    assert shown.stdout.splitlines()[-1] == (
        "replay: diverged at step 2; 2 of 3 recorded tool call(s) answered from the record, not run"
    )
    assert len(harness.store.returns_for("123456")) == 1


def test_a_replay_in_a_world_of_its_own_runs_every_call_live_from_the_difference() -> None:
    """A replay's write the original made, after the first difference: answered from
    the record in the original's world, run live in a world of the replay's own."""
    calls = [
        RecordedCall(call=LOOKUP, step=1, text="Order 123456: delivered"),
        RecordedCall(call=RETURN, step=2, text="Return rtn005 started"),
    ]
    fork = Fork(parent="turn-1", step=1, messages=[], calls=calls, in_order=True)
    own = fork.model_copy(update={"own_world": True})
    for replay, write in ((fork, calls[1]), (own, None)):
        served = Served()
        assert match(replay, LOOKUP, writes=False, served=served) == calls[0]
        assert match(replay, STOCK, writes=False, served=served) is None  # the difference
        assert match(replay, RETURN, writes=True, served=served) == write
        assert served.next == 1 and served.diverged
