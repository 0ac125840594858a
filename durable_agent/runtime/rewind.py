"""Forking a turn from the client: read its history, start the fork (`durable_agent/rewind.py`).

    recording(client, workflow_id)          what a finished turn's history holds, decoded
                                            (every run of a turn that continued as new)
    start_fork(client, workflow_id, step)   the fork, as a new turn `<workflow id>-fork-<n>`
    origin(handle)                          which turn a fork was made of, and from which step

The fork is linked to its parent by the search attribute `AgentForkOf` (`list` and the
Web UI find a turn's forks: `AgentForkOf = '<workflow id>'`), its memo (`show`) and its
summary and details in the Web UI.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.answers import markdown_safe
from durable_agent.conversation import BY_REFERENCE_CHARS, digest_of, resolved
from durable_agent.errors import CannotFork, UnknownTurn
from durable_agent.model import Reply
from durable_agent.rewind import FORK_MEMO, Origin, Recording, fork_of
from durable_agent.runtime import search as registered
from durable_agent.runtime.settings import TASK_QUEUE, client_command
from durable_agent.runtime.turns import details
from durable_agent.transcript import Delta
from durable_agent.types import TurnInput, TurnOutput
from durable_agent.workflows import names, search
from durable_agent.workflows.carry import TurnCarry
from durable_agent.workflows.policies import WORKFLOW_TASK_TIMEOUT

if TYPE_CHECKING:
    from durable_agent.activities.parse_output import ParseOutputOutput


async def recording(client: Client, workflow_id: str) -> Recording:
    """The finished turn `workflow_id` as its history records it: its input, its
    result, its model calls and the results of its dispatches. `UnknownTurn`, or
    `CannotFork` for a turn that has not finished or is no turn."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        described = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise UnknownTurn(workflow_id) from None
        raise
    if described.workflow_type != "AgentTurn":
        raise CannotFork(
            f"{workflow_id} is a {described.workflow_type}, not a turn: fork one of its "
            f"turns (`{client_command()} list`)"
        )
    if described.status == WorkflowExecutionStatus.RUNNING:
        raise CannotFork(
            f"turn {workflow_id} is still running: fork it once it has ended "
            f"(`{client_command()} show {workflow_id}`)"
        )
    if described.status != WorkflowExecutionStatus.COMPLETED:
        state = described.status.name.lower() if described.status else "unfinished"
        raise CannotFork(f"turn {workflow_id} ended {state}, with no steps to fork from")
    return await _read(client, handle, described.run_id)


async def _read(client: Client, handle: WorkflowHandle, run_id: str) -> Recording:
    """The turn's runs, read from its latest (`run_id`) back to its first, put together:
    a long turn continues as new (`durable_agent/workflows/carry.py`), and each run's
    history holds only its own part of the turn."""
    runs: list[_Run] = []
    while run_id:
        run = await _read_run(client, handle.id, run_id)
        runs.append(run)
        # A run that took over from another carries where that one stopped.
        run_id = run.previous if run.turn is not None and run.turn.carry is not None else ""
    runs.reverse()
    first, last = runs[0], runs[-1]
    if first.turn is None or last.output is None:
        raise CannotFork(
            f"turn {handle.id}: its history has no input or no result here (it ended "
            "otherwise); it cannot be forked"
        )
    # Each run's steps are in the input of the run after it; the last run's, in its result.
    earlier = [s for run in runs[1:] if (carry := _carried(run)) for s in carry.steps]
    output = last.output.model_copy(
        update={"steps": [*earlier, *last.output.steps], "earlier_steps": 0}
    )
    # Long tool results the model calls carry by reference, whole again from the
    # results that hold them (`conversation.by_reference`).
    texts = {k: v for run in runs for k, v in run.results.items()}
    model_calls = [
        (Delta(d.call, d.since, resolved(d.messages, texts)), reply)
        for run in runs
        for d, reply in run.model_calls
    ]
    dispatched = {k: v for run in runs for k, v in run.dispatched.items()}
    # Evaluated once, in the first run (the next ones carry the text).
    return Recording(
        handle.id, first.turn, output, model_calls, dispatched, instructions=first.instructions
    )


@dataclass
class _Run:
    """What one run of a turn's history holds."""

    turn: TurnInput | None = None
    output: TurnOutput | None = None
    model_calls: list[tuple[Delta, Reply | None]] = field(default_factory=list)
    dispatched: dict[str, Any] = field(default_factory=dict)
    results: dict[str, str] = field(default_factory=dict)
    """The long texts the model read of the results of its dispatches and parse_outputs,
    by digest (`conversation.by_reference`)."""
    previous: str = ""
    """The run it continued (empty: none)."""
    instructions: str = ""
    """What the agent's instructions function gave the turn (`instructions` activity)."""


def _carried(run: _Run) -> TurnCarry | None:
    return TurnCarry.of(run.turn) if run.turn is not None else None


async def _read_run(client: Client, workflow_id: str, run_id: str) -> _Run:
    # The activities' modules, here rather than at the top: the client side imports
    # this module for every command, and only a rerun or a replay reads a recording.
    from durable_agent.activities._conversation import local_model_call, local_result
    from durable_agent.activities._model_call import ModelCallInput
    from durable_agent.activities.dispatch import DispatchInput, DispatchOutput
    from durable_agent.activities.instructions import InstructionsOutput
    from durable_agent.activities.interpret import InterpretOutput
    from durable_agent.activities.parse_output import ParseOutputOutput
    from durable_agent.activities.plan import PlanOutput

    outputs: dict[str, type[PlanOutput] | type[InterpretOutput] | type[DispatchOutput]] = {
        "plan": PlanOutput,
        "interpret": InterpretOutput,
        "dispatch": DispatchOutput,
    }
    converter = client.data_converter  # the client's own, payload store included
    run = _Run()
    scheduled: dict[int, tuple[str, Any]] = {}
    replies: dict[int, int] = {}  # scheduled event id: index in model_calls
    events = client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events()
    async for event in events:
        kind = event.event_type
        if (local := await local_model_call(event, converter)) is not None:
            run.model_calls.append(local)
        elif (marker := local_result(event)) is not None and marker[0] == "instructions":
            [given] = await converter.decode(marker[1], [InstructionsOutput])
            run.instructions = given.text
        elif marker is not None and marker[0] == "parse_output":
            [screened] = await converter.decode(marker[1], [ParseOutputOutput])
            _keep_text(run, screened)
        elif marker is not None and marker[0] == "dispatch":  # a quick read, run locally
            [quick] = await converter.decode(marker[1], [DispatchOutput])
            _keep_text(run, quick.parsed)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            started = event.workflow_execution_started_event_attributes
            [run.turn] = await converter.decode(list(started.input.payloads), [TurnInput])
            run.previous = started.continued_execution_run_id
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            name = attributes.activity_type.name
            if name in ("plan", "interpret"):
                [call] = await converter.decode(list(attributes.input.payloads), [ModelCallInput])
                replies[event.event_id] = len(run.model_calls)
                run.model_calls.append((call.delta, None))
                scheduled[event.event_id] = (name, None)
            elif name == "dispatch":
                [sent] = await converter.decode(list(attributes.input.payloads), [DispatchInput])
                scheduled[event.event_id] = (name, sent)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            completed = event.activity_task_completed_event_attributes
            name, sent = scheduled.get(completed.scheduled_event_id, ("", None))
            if not name:
                continue
            [result] = await converter.decode(list(completed.result.payloads), [outputs[name]])
            if isinstance(result, DispatchOutput) and isinstance(sent, DispatchInput):
                run.dispatched[sent.call.id] = result.data
                _keep_text(run, result.parsed)
            elif isinstance(result, (PlanOutput, InterpretOutput)):
                k = replies[completed.scheduled_event_id]
                reply = result.plan if isinstance(result, PlanOutput) else result.decision
                run.model_calls[k] = (run.model_calls[k][0], reply)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            payloads = event.workflow_execution_completed_event_attributes.result.payloads
            [run.output] = await converter.decode(list(payloads), [TurnOutput])
    return run


def _keep_text(run: _Run, screened: ParseOutputOutput | None) -> None:
    if screened is not None and len(text := screened.observation.text) >= BY_REFERENCE_CHARS:
        run.results[digest_of(text)] = text


async def start_fork(
    client: Client,
    workflow_id: str,
    step: int,
    *,
    model: str = "",
    instructions: str = "",
    live_reads: bool = False,
    stream: bool = False,
    task_queue: str = TASK_QUEUE,
    replay: bool = False,
    own_world: bool = False,
    fork_id: str = "",
    current: bool = False,
) -> WorkflowHandle:
    """Fork the finished turn `workflow_id` from `step` (`durable_agent/rewind.py`): a new
    turn, `<workflow id>-fork-<n>`, with `model` and `instructions` when given (else the
    original's). `UnknownTurn`, or `CannotFork` (running, unfinished, a step past its end).
    `replay`: from step 1, served from the record while its calls repeat the original's in
    order (`<workflow id>-replay-<n>`), in a world of its own with `own_world` (`Fork`).
    `fork_id`: the fork's workflow id, of the caller's naming: a fork of that id already
    running is the one returned, and one that has ended raises WorkflowAlreadyStartedError.
    `current`: on the agent as served now, however it changed (`Fork.current`)."""
    original = await recording(client, workflow_id)
    fork = fork_of(
        original,
        step,
        live_reads=live_reads,
        in_order=replay,
        own_world=own_world,
        current=current,
    )
    turn = original.turn.model_copy(
        update={
            "model": model or original.turn.model,
            # On the agent as served now: its own instructions, not those the parent
            # was given (a fork's, from a file).
            "instructions": instructions or ("" if current else original.turn.instructions),
            # Not a turn of the original's conversation: its earlier exchanges are in
            # the fork's conversation, but the conversation never hears of the fork.
            "conversation_id": "",
            "stream": stream,
            "fork": fork,
        }
    )
    origin = Origin.of(fork)
    attributes: TypedSearchAttributes | None = None
    if await registered.available(client):
        at_start = search.at_start(
            turn.customer_id, turn.model, agent=turn.agent, principal=turn.principal
        )
        attributes = TypedSearchAttributes(
            [*at_start.search_attributes, SearchAttributePair(search.FORK_OF, workflow_id)]
        )

    async def start(named: str, if_running: WorkflowIDConflictPolicy) -> WorkflowHandle:
        return await client.start_workflow(
            names.TURN,
            turn,
            result_type=TurnOutput,
            id=named,
            task_queue=task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=if_running,
            static_summary=markdown_safe(f"{origin.line()}: {turn.question[:160]}"),
            static_details=markdown_safe(f"{origin.line()} · {details(turn)}"),
            search_attributes=attributes,
            memo={FORK_MEMO: origin.model_dump(mode="json")},
            task_timeout=WORKFLOW_TASK_TIMEOUT,
        )

    if fork_id:
        return await start(fork_id, WorkflowIDConflictPolicy.USE_EXISTING)
    for n in itertools.count(1):
        try:
            numbered = f"{workflow_id}-{'replay' if replay else 'fork'}-{n}"
            return await start(numbered, WorkflowIDConflictPolicy.FAIL)
        except WorkflowAlreadyStartedError:
            continue  # that fork exists: the next number
        except RPCError as e:
            if not _too_large(e):
                raise
            # The fork's input carries the conversation before its step, and the
            # results of the calls the original ran.
            raise CannotFork(
                f"turn {workflow_id}: its conversation before step {step} and its tool "
                "results are more than Temporal takes in one payload or request; fork it "
                "with the payload store on (AGENT_PAYLOAD_STORE, for this client and the "
                "workers), or from an earlier step"
            ) from None
    raise AssertionError("unreachable")


def _too_large(e: RPCError) -> bool:
    """Temporal refused a payload over its limit (2 MiB), or gRPC a request over 4 MiB."""
    return "size exceeds limit" in e.message or "larger than max" in e.message


async def origin(handle: WorkflowHandle) -> Origin | None:
    """Which turn this one is a fork of, and from which step (None: no fork)."""
    try:
        described = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise UnknownTurn(handle.id) from None
        raise
    return await origin_of(described)


async def origin_of(described: WorkflowExecutionDescription) -> Origin | None:
    """`origin`, from a turn's description (its memo)."""
    try:
        value = await described.memo_value(FORK_MEMO, None)
        return None if value is None else Origin.model_validate(value)
    except (KeyError, ValueError, TypeError):
        return None
