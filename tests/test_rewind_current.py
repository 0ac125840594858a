"""Forks that follow a prompt fix, on a real server: a turn of an agent whose instructions
are a function forks and replays with the text its function gave (on the worker that ran
it, after the prompt changed too); `rerun --current` runs the agent as served now, its
new instructions with the recorded tool results, and says which recorded calls its
tools no longer take as they were (a tool removed, a schema changed), going on or
stopping in one line; the default fork still refuses another version of the agent."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agent import Agent, AgentClient
from durable_agent.approval import ApprovalPolicy
from durable_agent.client import TurnResult
from durable_agent.errors import CannotFork
from durable_agent.model import Reply
from durable_agent.rewind import Comparison, compare
from durable_agent.scripted import ScriptedModel
from durable_agent.tools import ToolContext, tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnLimits
from tests.conftest import Harness
from tests.test_rewind import Forking, cli

QUESTION = "Book me slot s-17 on monday, please."
CONTEXT = {"name": "Ada"}
SLOTS = ToolCall(id="c1", name="free_slots", arguments={"day": "monday"})
BOOK = ToolCall(id="c2", name="book", arguments={"slot_id": "s-17"})
WAIVED = ApprovalPolicy(waived=frozenset({"book"}))


class Day(BaseModel):
    day: str


class SlotId(BaseModel):
    slot_id: str


class SlotAndNote(BaseModel):
    slot_id: str
    note: str = ""


class SlotAndDoctor(BaseModel):
    slot_id: str
    doctor: str


@tool(quick=True)
def free_slots(args: Day, ctx: ToolContext[Counter[str]]) -> str:
    """The free slots of a day."""
    ctx.deps["free_slots"] += 1
    return f"{args.day}: s-17 at 09:30 with Dr Ng"


@tool(side_effects=True)
def book(args: SlotId, ctx: ToolContext[Counter[str]]) -> str:
    """Book a slot."""
    ctx.deps["book"] += 1
    return f"Booked {args.slot_id}."


@tool(side_effects=True, name="book")
def book_with_note(args: SlotAndNote, ctx: ToolContext[Counter[str]]) -> str:
    """Book a slot, with a note for the doctor."""
    ctx.deps["book"] += 1
    return f"Booked {args.slot_id}."


@tool(side_effects=True, name="book")
def book_with_doctor(args: SlotAndDoctor, ctx: ToolContext[Counter[str]]) -> str:
    """Book a slot with a doctor."""
    ctx.deps["book"] += 1
    return f"Booked {args.slot_id} with {args.doctor}."


class Prompt:
    """Instructions from a file, as a prompt fix edits it, for the customer in the
    context; it counts its calls."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.calls = 0
        path.write_text(text)

    def __call__(self, context: dict[str, Any], deps: Any) -> str:
        self.calls += 1
        return f"{self.path.read_text()} You speak to {context['name']}."


def clinic(prompt: Prompt, effects: Counter[str], *tools: Any) -> Agent:
    return Agent(
        name="clinic",
        instructions=prompt,
        tools=list(tools or (free_slots, book)),
        model="scripted",
        approvals=WAIVED,
        deps=effects,
        # A write that asks in a fork (a record that failed to serve it) fails a test, not hangs it.
        limits=TurnLimits(approval_timeout=timedelta(seconds=5)),
    )


def booking() -> ScriptedModel:
    """[1] the free slots, [2] books s-17, then answers."""
    return ScriptedModel(
        plans=[Reply(calls=[SLOTS])],
        decisions=[Reply(calls=[BOOK]), Reply(text="Booked s-17.")],
    )


def books_again(answer: str = "Booked again.") -> ScriptedModel:
    """A fork's model from step 2: books s-17 again (its call ids its own)."""
    again = BOOK.model_copy(update={"id": "n1"})
    return ScriptedModel(decisions=[Reply(calls=[again]), Reply(text=answer)])


async def original(agents: AgentClient, effects: Counter[str]) -> TurnResult:
    first = await agents.ask(QUESTION, context=CONTEXT)
    assert first.outcome is Outcome.ANSWERED, first.answer
    assert effects == {"free_slots": 1, "book": 1}
    return first


def instructions_of(model: ScriptedModel) -> set[str]:
    return {request.instructions for _, request in model.requests}


def changed(result: TurnResult) -> list[str]:
    return [s.text for s in result.steps if s.kind is StepKind.CHANGED]


async def test_rerun_and_replay_of_a_turn_with_instructions_from_a_function(
    harness: Harness, tmp_path: Path
) -> None:
    """On the worker that ran it: the fork and the replay run the text the function gave
    the turn (never calling it again), and no recorded tool runs again."""
    prompt, effects = Prompt(tmp_path / "prompt.txt", "Be brief."), Counter[str]()
    model = Forking(booking())
    async with harness.worker(model, agents=[clinic(prompt, effects)]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(agents, effects)
        model.then(fork_model := books_again())
        fork = await (await agents.rerun(first.workflow_id, from_step=2)).result()
        model.then(replay_model := booking())
        replayed = await (await agents.replay(first.workflow_id)).result()

    assert fork.outcome is Outcome.ANSWERED and fork.answer == "Booked again."
    assert replayed.outcome is Outcome.ANSWERED
    text = "Be brief. You speak to Ada."
    assert instructions_of(fork_model) == instructions_of(replay_model) == {text}
    assert prompt.calls == 1  # the original's; the fork and the replay read its text
    assert fork.fingerprint == replayed.fingerprint == first.fingerprint
    assert effects == {"free_slots": 1, "book": 1}  # nothing recorded ran again
    (served,) = [s.text for s in fork.steps if s.kind is StepKind.RECORDED]
    assert served.startswith(f"{BOOK.render()}: already done in {first.workflow_id} (step 2)")
    assert compare(first.steps, replayed.steps) == Comparison(2, 2, None)


async def test_rerun_and_replay_on_the_command_line(harness: Harness, tmp_path: Path) -> None:
    """As the client's, and `--instructions FILE` runs the file's text on the agent the
    turn ran (its fingerprint, that of the function's recorded text, still checked)."""
    prompt, effects = Prompt(tmp_path / "prompt.txt", "Be brief."), Counter[str]()
    (given := tmp_path / "given.txt").write_text("Answer in five words.")
    model = Forking(booking())
    async with harness.worker(model, agents=[clinic(prompt, effects)]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(agents, effects)
        wid = first.workflow_id
        model.then(books_again())
        rerun = await asyncio.to_thread(
            cli, tmp_path, harness, task_queue, "rerun", wid, "--from-step", "2"
        )
        model.then(filed := books_again())
        args = ["rerun", wid, "--from-step", "2", "--instructions", str(given)]
        from_file = await asyncio.to_thread(cli, tmp_path, harness, task_queue, *args)
        model.then(booking())
        replay = await asyncio.to_thread(cli, tmp_path, harness, task_queue, "replay", wid)

    assert rerun.returncode == 0, rerun.stderr
    assert f"[2] recorded    {BOOK.render()}: already done in {wid} (step 2)" in rerun.stdout
    assert "answer (answered): Booked again." in rerun.stdout
    assert from_file.returncode == 0, from_file.stderr
    assert instructions_of(filed) == {"Answer in five words."}
    assert f"agent: clinic (fingerprint {first.fingerprint})" in from_file.stdout
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.splitlines()[-1] == (
        "replay: followed the recording; 2 of 2 recorded tool call(s) answered from the "
        "record, not run"
    )
    assert prompt.calls == 1
    assert effects == {"free_slots": 1, "book": 1}


async def test_rerun_current_runs_the_fixed_prompt_with_the_recorded_results(
    harness: Harness, tmp_path: Path
) -> None:
    """The prompt is fixed (the file its function reads): the default fork still runs
    the text the turn ran; `--current` evaluates the function again, from the turn's
    context, and its model reads the new text, with the recorded results."""
    prompt, effects = Prompt(tmp_path / "prompt.txt", "Be brief."), Counter[str]()
    model = Forking(booking())
    async with harness.worker(model, agents=[clinic(prompt, effects)]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        first = await original(agents, effects)
        prompt.path.write_text("Be kind.")
        model.then(as_ran := books_again())
        same = await (await agents.rerun(first.workflow_id, from_step=2)).result()
        model.then(fixed := books_again("Booked, kindly."))
        args = ["rerun", first.workflow_id, "--from-step", "2", "--current"]
        rerun = await asyncio.to_thread(cli, tmp_path, harness, task_queue, *args)
        model.then(replay_model := booking())
        replayed = await (await agents.replay(first.workflow_id, current=True)).result()

    assert same.outcome is Outcome.ANSWERED
    assert instructions_of(as_ran) == {"Be brief. You speak to Ada."}
    assert rerun.returncode == 0, rerun.stderr
    assert instructions_of(fixed) == {"Be kind. You speak to Ada."}
    assert instructions_of(replay_model) == {"Be kind. You speak to Ada."}
    assert f"[2] recorded    {BOOK.render()}: already done in" in rerun.stdout
    assert "answer (answered): Booked, kindly." in rerun.stdout
    assert "changed" not in rerun.stdout  # the tools did not change
    assert compare(first.steps, replayed.steps) == Comparison(2, 2, None)
    assert prompt.calls == 3  # the original, then once for each fork on the current agent
    assert effects == {"free_slots": 1, "book": 1}  # no recorded tool ran again


async def test_a_removed_tool_is_said_and_the_fork_goes_on_or_stops(
    harness: Harness, tmp_path: Path
) -> None:
    """free_slots is removed: a fork from step 1 says so and goes on (its model books
    from the record); one from step 2, whose conversation holds the call, stops in one
    line; the default fork refuses the changed agent in its one line."""
    prompt, effects = Prompt(tmp_path / "prompt.txt", "Be brief."), Counter[str]()
    model = Forking(booking())
    async with harness.worker(model, agents=[clinic(prompt, effects)]) as task_queue:
        first = await original(AgentClient(harness.client, task_queue=task_queue), effects)
    wid = first.workflow_id
    removed = clinic(prompt, effects, book)
    async with harness.worker(model, agents=[removed]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        model.then(
            fork_model := ScriptedModel(
                plans=[Reply(calls=[BOOK.model_copy(update={"id": "n1"})])],
                decisions=[Reply(text="Booked.")],
            )
        )
        went_on = await (await agents.turn(wid).rerun(1, current=True)).result()
        stopped = await asyncio.to_thread(
            cli, tmp_path, harness, task_queue, "rerun", wid, "--from-step", "2", "--current"
        )
        refused = await asyncio.to_thread(
            cli, tmp_path, harness, task_queue, "rerun", wid, "--from-step", "2"
        )
        with pytest.raises(CannotFork, match="which the agent as served now cannot take"):
            await (await agents.rerun(wid, from_step=2, current=True)).result()

    assert went_on.outcome is Outcome.ANSWERED, went_on.answer
    assert changed(went_on) == [
        f"{SLOTS.render()}: free_slots was removed since {wid} ran it (step 1); the fork's "
        "model cannot make it"
    ]
    assert [t.name for t in fork_model.requests[0][1].tools] == ["book"]
    assert [s.kind for s in went_on.steps if s.kind is StepKind.RECORDED] == [StepKind.RECORDED]

    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert stopped.stdout.splitlines() == [
        f"[2] changed     {SLOTS.render()}: free_slots was removed since {wid} ran it (step 1)"
    ]
    assert stopped.stderr.splitlines() == [
        f"error: fork of {wid} from step 2: its conversation holds {SLOTS.render()} (step 1), "
        "which the agent as served now cannot take (its tool was removed); fork it from "
        "step 1 or earlier"
    ]
    assert refused.returncode == 1 and refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert line.startswith(f"error: turn {wid} ran clinic at fingerprint {first.fingerprint}")
    assert line.endswith("a fork runs the agent the turn ran; fork it where that version is served")
    assert effects == {"free_slots": 1, "book": 1}


async def test_a_changed_schema_is_said_and_the_record_stands_where_the_call_validates(
    harness: Harness, tmp_path: Path
) -> None:
    """book gains an optional note: the recorded call still validates, so the fork on
    the current agent books from the record; book needing a doctor, the recorded call no
    longer validates: the fork says so, and its record serves no call of book."""
    prompt, effects = Prompt(tmp_path / "prompt.txt", "Be brief."), Counter[str]()
    model = Forking(booking())
    async with harness.worker(model, agents=[clinic(prompt, effects)]) as task_queue:
        first = await original(AgentClient(harness.client, task_queue=task_queue), effects)
    wid = first.workflow_id

    noted = clinic(prompt, effects, free_slots, book_with_note)
    async with harness.worker(model, agents=[noted]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        model.then(books_again())
        kept = await (await agents.rerun(wid, from_step=2, current=True)).result()
    assert kept.outcome is Outcome.ANSWERED, kept.answer
    assert changed(kept) == [
        f"{BOOK.render()}: book's schema changed since {wid} ran it (step 2); the call still "
        "validates: its recorded result stands"
    ]
    (served,) = [s.text for s in kept.steps if s.kind is StepKind.RECORDED]
    assert served.startswith("book(slot_id='s-17', note=''): already done in")
    assert effects == {"free_slots": 1, "book": 1}

    doctor = clinic(prompt, effects, free_slots, book_with_doctor)
    async with harness.worker(model, agents=[doctor]) as task_queue:
        agents = AgentClient(harness.client, task_queue=task_queue)
        model.then(ScriptedModel(plans=[Reply(text="Which doctor would you like?")]))
        asked = await (await agents.rerun(wid, from_step=1, current=True)).result()
    assert asked.outcome is Outcome.ANSWERED, asked.answer
    assert changed(asked) == [
        f"{BOOK.render()}: book's schema changed since {wid} ran it (step 2), and the call "
        "no longer validates: invalid arguments for book: doctor: Field required; its "
        "record serves no call"
    ]
    assert effects == {"free_slots": 1, "book": 1}
