"""Erasing a turn: every execution that holds its words, and their stored payloads.

A Temporal history cannot be edited: the only honest erasure of what a turn was told is
deleting the executions that hold it (`DeleteWorkflowExecution`, each run of each
continue-as-new chain; a running one is terminated first) and their folders or objects
in the payload store. What holds a turn's words:

    the turn              its history (question, plan, calls, answer), every run
    its sub-agents        child workflows: their input is the turn's words
    its forks             `rerun` / `replay` copy its conversation (found by the
                          `AgentForkOf` search attribute), and their forks in turn
    its conversation      a turn of a conversation: the conversation's record holds the
                          question and answer, and every later turn carries them; so
                          such a turn is erased only with its whole conversation (the
                          conversation's workflow, all its turns, their sub-agents and
                          forks), never alone (`CannotErase`)

`plan` finds the family without touching it (refusing in one line what it will not
erase); `carry_out` erases it. `AgentClient.erase` and `durable-agent erase` do both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.errors import CannotErase, UnknownTurn
from durable_agent.runtime import search as registered
from durable_agent.runtime.storage import Owner, delete_stored
from durable_agent.workflows import names, search

MAX_EXECUTIONS = 1000
"""Runs one erasure deletes, at most (a conversation of many turns, their forks): a
larger family is refused before anything is touched."""
MAX_WORKFLOW_ID = 1000
"""Temporal's own cap on a workflow id."""
REASON = "erased by an operator (durable-agent erase): its words are deleted"
_UNQUOTABLE = frozenset("'\"\\")
"""Characters a visibility query's string cannot carry here: an id holding one is not
looked up by the query (its forks, other runs of its id) but by its history only."""


@dataclass(frozen=True)
class Erased:
    """One execution erased: a run of a workflow, and what it was to the named turn."""

    workflow_id: str
    run_id: str
    what: str
    """`turn`, `conversation`, `fork` or `sub-agent`."""

    def line(self) -> str:
        return f"erased {self.what} {self.workflow_id} (run {self.run_id})"


@dataclass
class _Workflow:
    workflow_id: str
    what: str
    runs: list[str] = field(default_factory=list)
    running: bool = False


@dataclass
class Plan:
    """What an erasure of `named` deletes: its family, the root first."""

    named: str
    workflows: list[_Workflow]

    @property
    def executions(self) -> int:
        return sum(len(w.runs) for w in self.workflows)


def checked_id(workflow_id: str) -> str:
    """A workflow id as an erasure takes it: not empty, bounded, printable, no spaces."""
    if (
        not workflow_id
        or len(workflow_id) > MAX_WORKFLOW_ID
        or not workflow_id.isprintable()
        or any(c.isspace() for c in workflow_id)
    ):
        raise CannotErase(
            f"{workflow_id[:60]!r} is not a workflow id (1 to {MAX_WORKFLOW_ID} printable "
            "characters, no spaces): `durable-agent list` shows turns"
        )
    return workflow_id


async def plan(client: Client, workflow_id: str, *, conversation: bool = False) -> Plan:
    """The executions erasing the turn `workflow_id` deletes (with `conversation`, its
    whole conversation when it belongs to one). `UnknownTurn`; `CannotErase`."""
    checked_id(workflow_id)
    described = await _described(client, workflow_id)
    if described is None:
        raise UnknownTurn(workflow_id, hint=": `durable-agent list` shows turns")
    root, what = workflow_id, "turn"
    if described.workflow_type == names.CONVERSATION:
        if not conversation:
            raise CannotErase(
                f"{workflow_id} is a conversation: erase it, all its turns and their forks "
                "with --conversation (AgentClient.erase(..., conversation=True))"
            )
        what = "conversation"
    elif described.workflow_type != names.TURN:
        raise CannotErase(f"{workflow_id} is no turn (a {described.workflow_type} workflow)")
    elif parent := described.parent_id:
        above = await _described(client, parent)
        if above is not None and above.workflow_type == names.CONVERSATION:
            if not conversation:
                raise CannotErase(
                    f"turn {workflow_id} is a turn of conversation {parent}, whose record and "
                    "later turns hold its words too: erase the whole conversation (its "
                    "workflow, all its turns and their forks) with --conversation"
                )
            root, what = parent, "conversation"
        elif above is not None:
            raise CannotErase(
                f"turn {workflow_id} is a sub-agent of turn {parent}, whose history holds "
                f"its words too: erase {parent}"
            )
    return Plan(workflow_id, await _family(client, root, what))


async def carry_out(
    client: Client, planned: Plan, *, said: Callable[[Erased], None] | None = None
) -> list[Erased]:
    """Erase what `planned` names: terminate what runs (so nothing writes more), then,
    the root last, delete each workflow's runs and its stored payloads. `said` is told of
    each execution as it is erased."""
    for wf in planned.workflows:
        if wf.running:
            try:
                await client.get_workflow_handle(wf.workflow_id).terminate(reason=REASON)
            except RPCError as e:
                if e.status != RPCStatusCode.NOT_FOUND:  # it ended meanwhile
                    raise
    erased = []
    storage = client.data_converter.external_storage
    # The root last: erasing again after a failure part way finds what is left from it.
    for wf in reversed(planned.workflows):
        for run_id in wf.runs:
            request = DeleteWorkflowExecutionRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=wf.workflow_id, run_id=run_id),
            )
            try:
                await client.workflow_service.delete_workflow_execution(request)
            except RPCError as e:
                if e.status != RPCStatusCode.NOT_FOUND:  # deleted meanwhile: gone as asked
                    raise
            erased.append(Erased(wf.workflow_id, run_id, wf.what))
            if said is not None:
                said(erased[-1])
        await delete_stored(storage, Owner(client.namespace, wf.workflow_id))
    return erased


async def _family(client: Client, root: str, what: str) -> list[_Workflow]:
    """The root, its runs, and (breadth first) its children's and forks'."""
    found: dict[str, _Workflow] = {}
    queue = [(root, what)]
    searchable = await registered.available(client)
    while queue:
        workflow_id, what = queue.pop(0)
        if workflow_id in found:
            continue
        wf, children = await _runs(client, workflow_id, what)
        if not wf.runs:
            continue  # gone (retention) since its parent started it
        found[workflow_id] = wf
        if sum(len(w.runs) for w in found.values()) > MAX_EXECUTIONS:
            raise CannotErase(
                f"erasing {root} would delete more than {MAX_EXECUTIONS} executions: erase "
                "its forks or turns one by one first"
            )
        kind = "turn" if what == "conversation" else "sub-agent"
        queue.extend((child, kind) for child in children)
        if searchable and not _UNQUOTABLE & set(workflow_id):
            query = f"{search.FORK_OF.name} = '{workflow_id}'"
            async for fork in client.list_workflows(query):
                queue.append((fork.id, "fork"))
    return list(found.values())


async def _runs(client: Client, workflow_id: str, what: str) -> tuple[_Workflow, list[str]]:
    """The workflow's runs (its newest chain back through each run it continued from,
    and any other run of its id the server lists) and the children they started."""
    wf = _Workflow(workflow_id, what)
    children: list[str] = []
    run_id: str | None = None
    while len(wf.runs) < MAX_EXECUTIONS:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        described = await _described(client, workflow_id, run_id)
        if described is None:
            break
        if run_id is None:
            wf.running = described.status == WorkflowExecutionStatus.RUNNING
        wf.runs.append(described.run_id)
        run_id = None
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_execution_started_event_attributes"):
                started = event.workflow_execution_started_event_attributes
                run_id = started.continued_execution_run_id or None
            elif event.HasField("start_child_workflow_execution_initiated_event_attributes"):
                child = event.start_child_workflow_execution_initiated_event_attributes
                children.append(child.workflow_id)
        if run_id is None or run_id in wf.runs:
            break
    if wf.runs and not _UNQUOTABLE & set(workflow_id):
        # Earlier executions of the same id, outside the chain (an id used again).
        async for listed in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
            if listed.run_id not in wf.runs and len(wf.runs) < MAX_EXECUTIONS:
                wf.runs.append(listed.run_id)
    return wf, list(dict.fromkeys(children))


async def _described(
    client: Client, workflow_id: str, run_id: str | None = None
) -> WorkflowExecutionDescription | None:
    try:
        return await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
