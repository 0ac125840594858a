"""Rewind: a turn forked from one of its steps, with another model or instructions.

    client.py rerun WORKFLOW_ID --from-step N [--model SPEC] [--instructions FILE]

A step is what `client.py show` numbers: `[N]` is the N-th round of tool calls (the
model's decision that opens it, the calls, their results). A fork of a turn from
step N is a new turn (`Fork` in its input) that

- starts from the original's conversation before step N: the question, and every
  round before N with its results as the original's model read them (nothing of it
  runs again), and its story begins with the original's steps before N;
- asks its own model (`--model`, `--instructions`) to decide step N, and goes on live;
- answers a call the original ran (same tool, same arguments) with the original's
  recorded result: a write always, so it is never done twice (no consent is asked
  for what does not run), and a read unless `live_reads`. Other calls run as in any
  turn, but for one thing: a write its record did not serve (a new one, or a further
  copy of one it served) asks for consent even where the agent waives it
  (`durable_agent.approval.IN_A_FORK`), and so does a sub-agent's call, whose turn
  may write. A fork is run by hand, to see what another model or prompt would do:
  nobody expects it to change the world unasked.

With `live_reads`, the reads of the rounds before step N run again too, and their
new results replace the recorded ones in the conversation; their writes stand.

Everything here is plain data: the client reads the original's history into a
`Recording` (`durable_agent/runtime/rewind.py`), `fork_of` makes the `Fork`, and the
workflow asks `match` for each call of the fork.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from durable_agent.approval import canonical
from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage, prior
from durable_agent.errors import CannotFork
from durable_agent.model import Reply
from durable_agent.render import truncate
from durable_agent.transcript import Delta, replay
from durable_agent.types import (
    AgentInfo,
    Fork,
    Outcome,
    RecordedCall,
    Step,
    StepKind,
    ToolCall,
    TurnInput,
    TurnOutput,
)

FORK_MEMO = "fork"
"""A fork's memo entry: its `Origin`, readable without a worker (`client.py show`)."""

_messages = TypeAdapter(list[Message])


class Origin(BaseModel):
    """Which turn a fork was made of, and from which step (a replay: from the start)."""

    parent: str
    step: int
    replay: bool = False

    @classmethod
    def of(cls, fork: Fork) -> Origin:
        """A fork's origin, from its input (as its memo has it)."""
        return cls(parent=fork.parent, step=fork.step, replay=fork.in_order)

    def line(self) -> str:
        if self.replay:
            return f"replay of {self.parent}"
        return f"fork of {self.parent} from step {self.step}"


@dataclass
class Recording:
    """What a finished turn's history holds, decoded: every run's, when the turn
    continued as new (`durable_agent/workflows/carry.py`)."""

    workflow_id: str
    turn: TurnInput
    """The turn's input, as its first run was given it."""
    output: TurnOutput
    """Its result, with its whole story: the steps of every run, in order."""
    model_calls: list[tuple[Delta, Reply | None]] = field(default_factory=list)
    """Each model call of every run, in order: what its input carried (only what was
    new since the call before, in whichever run that was), and its reply (None: it
    failed)."""
    dispatched: dict[str, Any] = field(default_factory=dict)
    """The raw results of the dispatches that completed, by call id."""
    instructions: str = ""
    """What its agent's instructions function gave it (the `instructions` activity's
    recorded result; a fork's: its parent's, which it ran or was fingerprinted by);
    empty: its agent's instructions are no function, or the turn was given its own."""


def last_step(output: TurnOutput) -> int:
    return max((s.iteration for s in output.steps), default=1)


def fork_of(
    recording: Recording,
    step: int,
    *,
    live_reads: bool = False,
    in_order: bool = False,
    own_world: bool = False,
    current: bool = False,
) -> Fork:
    """The fork of the recorded turn from `step`; CannotFork past its end. `in_order`
    and `own_world`: a replay's; `current`: on the agent as served now (`Fork`)."""
    last = last_step(recording.output)
    if not 1 <= step <= last:
        raise CannotFork(
            f"turn {recording.workflow_id} has steps 1 to {last} (see `show`): "
            f"give a step from 1 to {last}, not {step}"
        )
    before = [s for s in recording.output.steps if s.iteration < step and not _screened_question(s)]
    return Fork(
        parent=recording.workflow_id,
        step=step,
        messages=[m.model_dump(mode="json") for m in _conversation_before(recording, step)],
        steps=before,
        calls=recorded_calls(recording),
        fingerprint=recording.output.fingerprint,
        instructions=recording.instructions,
        current=current,
        live_reads=live_reads,
        in_order=in_order,
        own_world=own_world,
    )


def _screened_question(step: Step) -> bool:
    """The question's shield step: a fork screens its question itself."""
    return step.kind is StepKind.SHIELD and step.text.startswith("input:")


def _conversation_before(recording: Recording, step: int) -> list[Message]:
    """The conversation the model decided step `step` from: the input of the model call
    whose reply opened it; or, for a step a fork took over from its own parent, the
    fork's conversation up to that reply."""
    turn = recording.turn
    if step == 1:
        return [*prior(turn.history), UserMessage.of(turn)]
    opening = next(
        (s for s in recording.output.steps if s.iteration == step and s.kind is StepKind.CONTINUE),
        None,
    )
    first = opening.calls[0].id if opening and opening.calls else None
    deltas = [delta for delta, _ in recording.model_calls]
    for k, (_, reply) in enumerate(recording.model_calls):
        if first and reply and reply.calls and reply.calls[0].id == first:
            return replay([], deltas[: k + 1])
    whole = replay([], deltas) if deltas else (prefix(turn.fork) if turn.fork else [])
    for k, m in enumerate(whole):
        if first and isinstance(m, AssistantMessage) and m.calls and m.calls[0].id == first:
            return whole[:k]
    raise CannotFork(
        f"turn {recording.workflow_id}: its history holds no model call that opened "
        f"step {step}; fork it from another step"
    )


def recorded_calls(recording: Recording) -> list[RecordedCall]:
    """Every call the turn ran, with its result; a fork's own record first (the calls
    its parent ran stay done in a fork of a fork)."""
    inherited = list(recording.turn.fork.calls) if recording.turn.fork else []
    # A fork's story begins with its parent's steps: their calls are the inherited ones.
    known = {r.call.id for r in inherited}
    deltas = [delta for delta, _ in recording.model_calls]
    read = {m.call_id: m for m in replay([], deltas) if isinstance(m, ToolResult)}
    ran: list[RecordedCall] = []
    for s in recording.output.steps:
        if s.kind is not StepKind.TOOL_CALL or not s.calls:
            continue
        call = s.calls[0]
        if call.id in known:
            continue
        schema = s.tool_schema
        if call.id in read:
            result = read[call.id]
            ran.append(
                RecordedCall(
                    call=call, step=s.iteration, ok=result.ok, text=result.text, tool_schema=schema
                )
            )
        elif call.id in recording.dispatched:
            raw = recording.dispatched[call.id]
            ran.append(RecordedCall(call=call, step=s.iteration, result=raw, tool_schema=schema))
    return inherited + ran


def prefix(fork: Fork) -> list[Message]:
    """The conversation a fork starts from."""
    return _messages.validate_python(fork.messages)


class Served(BaseModel):
    """What a fork has taken from its record so far (the workflow's state, carried into
    its next run when it continues as new)."""

    writes: set[int] = Field(default_factory=set)
    """The recorded writes the fork has been answered with, by index."""
    next: int = 0
    """A replay: the recorded call its next call must repeat to be served."""
    diverged: bool = False
    """A replay: a call did not repeat the recording's, in order."""


def match(fork: Fork, call: ToolCall, *, writes: bool, served: Served) -> RecordedCall | None:
    """The recorded call `call` repeats (same tool, same arguments), if any. A write
    takes one the fork has not taken yet: writing twice what the original wrote once
    writes once more (and so asks for consent, as every write that runs in a fork
    does). A read takes any, unless reads run live. A replay (`in_order`) takes the
    recording's calls in their order, until a call differs; from there on its reads
    run live, and its writes still never repeat one of the recording's, unless it runs
    in a world of its own (`own_world`), where every call from there on runs live
    (its writes asking for consent too: the turn cannot tell that world from the real
    one)."""
    if fork.in_order and not served.diverged:
        expected = fork.calls[served.next] if served.next < len(fork.calls) else None
        if expected is not None and _same(expected.call, call):
            if writes:
                served.writes.add(served.next)
            served.next += 1
            return expected
        served.diverged = True
    if fork.own_world:
        return None
    if not writes and (fork.live_reads or fork.in_order):
        return None
    for i, recorded in enumerate(fork.calls):
        if not _same(recorded.call, call):
            continue
        if writes:
            if i in served.writes:
                continue
            served.writes.add(i)
        return recorded
    return None


def _same(recorded: ToolCall, call: ToolCall) -> bool:
    return canonical(recorded) == canonical(call)


def served_line(fork: Fork, recorded: RecordedCall, call: ToolCall, *, writes: bool) -> str:
    """The step of a call answered from the record."""
    where = f"{fork.parent} (step {recorded.step})"
    if writes:
        return f"{call.render()}: already done in {where}; its recorded result, not run again"
    return f"{call.render()}: read from the record of {where}"


def agent_mismatch(fork: Fork, agent: AgentInfo) -> str | None:
    """Why the agent that would run the fork cannot (None: it can): another version
    would read the record with other instructions or tools."""
    if not fork.fingerprint or not agent.fingerprint or fork.fingerprint == agent.fingerprint:
        return None
    name = agent.name or "the worker's first agent"
    return (
        f"turn {fork.parent} ran {name} at fingerprint {fork.fingerprint}, and this worker "
        f"serves it at {agent.fingerprint} (other instructions or tools): a fork runs the "
        "agent the turn ran; fork it where that version is served"
    )


def schema_digest(parameters: dict[str, Any]) -> str:
    """12 hex digits of a hash of a tool's JSON schema (`Step.tool_schema`): what a fork
    on the agent as served now compares to tell a changed tool. Not its title: a
    renamed arguments class takes the same calls."""
    shape = {k: v for k, v in parameters.items() if k != "title"}
    blob = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


class ToolNow(BaseModel):
    """How the agent as served now takes one call of a fork's record
    (`activities/recheck.py`)."""

    offered: bool = True
    """Its tool is one the agent offers now (False: removed, or no longer offered)."""
    tool_schema: str = ""
    """A hash of that tool's schema now (`schema_digest`)."""
    error: str = ""
    """Why the call's arguments do not validate now (empty: they do)."""
    arguments: dict[str, Any] | None = None
    """The call's arguments as the tool validates them now, where that differs from the
    record (a default its schema gained): what a call of the fork must repeat to be
    answered by the record, as the fork's own calls are validated so too."""


@dataclass(frozen=True)
class Change:
    """A call of the record that the agent as served now takes otherwise than the
    parent's agent did: the line of its `changed` step, and, when the fork cannot go on
    from the record because of it, the fork's one line (`stop`)."""

    recorded: RecordedCall
    line: str
    stop: str = ""


MAX_ERROR_CHARS = 200
"""Of a validation error, what a `changed` step and a fork's line show."""


def changes(fork: Fork, now: Sequence[ToolNow]) -> list[Change]:
    """The record's calls (`fork.calls`, each taken as `now` says) whose tool was removed,
    whose schema changed (where the record holds the parent's: a turn recorded before
    steps held it tells only whether a call still validates), or that no longer
    validate, in the record's order. A call the fork's model reads in its conversation
    (before the fork's step) that the agent cannot take now stops the fork: the model
    would go on from a call it could not make. One later than that is left to the
    fork's model, which may make it anew."""
    known = _conversation_calls(fork)
    found: list[Change] = []
    for recorded, taken in zip(fork.calls, now, strict=True):
        call, step = recorded.call, recorded.step
        since = f"since {fork.parent} ran it (step {step})"
        changed = bool(recorded.tool_schema) and recorded.tool_schema != taken.tool_schema
        if not taken.offered:
            what, why = f"{call.name} was removed {since}", "its tool was removed"
        elif taken.error:
            error = truncate(taken.error, MAX_ERROR_CHARS)
            schema = f"{call.name}'s schema changed {since}, and" if changed else f"{since},"
            what, why = f"{schema} the call no longer validates: {error}", error
        elif changed:
            line = f"{call.name}'s schema changed {since}; the call still validates"
            found.append(Change(recorded, f"{call.render()}: {line}: its recorded result stands"))
            continue
        else:
            continue
        if call.id in known or canonical(call) in known:
            stop = (
                f"fork of {fork.parent} from step {fork.step}: its conversation holds "
                f"{truncate(call.render(), MAX_ERROR_CHARS)} (step {step}), which the agent as "
                f"served now cannot take ({why}); fork it from step {step} or earlier"
            )
            found.append(Change(recorded, f"{call.render()}: {what}", stop))
        else:
            later = (
                "its record serves no call" if taken.offered else "the fork's model cannot make it"
            )
            found.append(Change(recorded, f"{call.render()}: {what}; {later}"))
    return found


def as_taken_now(fork: Fork, now: Sequence[ToolNow]) -> Fork:
    """The fork with its record's calls as the agent takes them now (`ToolNow.arguments`),
    which its own calls are matched against (`match`)."""
    calls = [
        r.model_copy(update={"call": r.call.model_copy(update={"arguments": t.arguments})})
        if t.arguments is not None
        else r
        for r, t in zip(fork.calls, now, strict=True)
    ]
    return fork.model_copy(update={"calls": calls})


def _conversation_calls(fork: Fork) -> set[str]:
    """The calls the fork's conversation holds, by id and as compared (`canonical`)."""
    calls = [c for m in prefix(fork) if isinstance(m, AssistantMessage) for c in m.calls]
    return {c.id for c in calls} | {canonical(c) for c in calls}


def refused_model(output: TurnOutput) -> str | None:
    """Why the turn's model could not be used at all (an unknown model, a backend the
    worker cannot start, a model its provider does not have): its first model call was
    refused, so it took no step of its own. None otherwise."""
    if output.outcome is not Outcome.MODEL_ERROR or output.usage.model_calls:
        return None
    for s in output.steps:
        if s.kind is StepKind.LIMIT and s.text.startswith(_REFUSED):
            return s.text.removeprefix(_REFUSED)
    return None


_REFUSED = "model request rejected: "


@dataclass(frozen=True)
class Comparison:
    """A replay against its recording (`client.py replay`)."""

    recorded: int
    """The tool calls the recording ran."""
    served: int
    """The replay's calls answered from the record (none of them ran)."""
    diverged_at: int | None
    """The step where the replay's calls first differ from the recording's (None: they
    never do)."""


def compare(recorded: Sequence[Step], replayed: Sequence[Step]) -> Comparison:
    """Where a replay's calls leave the recording's, in order, and what it was served."""
    ran = [(s.iteration, s.calls[0]) for s in recorded if _call_step(s)]
    made = [(s.iteration, s.calls[0]) for s in replayed if _call_step(s)]
    served = sum(s.kind is StepKind.RECORDED for s in replayed)
    for (_, was), (step, call) in zip(ran, made, strict=False):  # the shorter one ends it
        if not _same(was, call):
            return Comparison(len(ran), served, step)
    if len(made) > len(ran):
        return Comparison(len(ran), served, made[len(ran)][0])
    if len(made) < len(ran):  # it answered (or stopped) before the recording's last call
        return Comparison(len(ran), served, max((s.iteration for s in replayed), default=1))
    return Comparison(len(ran), served, None)


def _call_step(step: Step) -> bool:
    """A call that ran, or was answered from a record, or awaited consent first."""
    return step.kind in (StepKind.TOOL_CALL, StepKind.RECORDED) and bool(step.calls)
