"""Talking to the agent from outside: start, follow, decide and find turns and conversations.

What every front end does (`client.py` today), in one place:

    start_turn(client, TurnInput(...))            one question, one AgentTurn workflow
    start_chat / send                             a Conversation; each message is a turn
    follow(handle)                                a turn's steps as they happen
    pending(client) / decide(client, wf, ...)     calls awaiting consent, and deciding them
    find_turns(client, customer=..., ...)         recent turns, by search attributes

Errors a person can act on are `AgentClientError`s with a one-line message.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from agent.approval import ApprovalDecision, ApprovalResult
from agent.chat import ChatMessage, ConversationInput, MessageAccepted
from agent.types import PendingApproval, Step, TurnInput, TurnProgress
from runtime import search as registered
from runtime.settings import TASK_QUEUE
from workflows import AgentTurn, Conversation, search

FOLLOW_POLL_S = 0.2


class AgentClientError(Exception):
    """A problem a person can fix, said in one line."""


def turn_id(customer_id: str) -> str:
    """`turn-<customer>-<8 hex>`: readable in the Web UI, unique per turn."""
    return f"turn-{customer_id}-{uuid.uuid4().hex[:8]}"


def chat_id(customer_id: str) -> str:
    """`chat-<customer>-<8 hex>`; its turns are `<chat id>-<n>`."""
    return f"chat-{customer_id}-{uuid.uuid4().hex[:8]}"


async def start_turn(
    client: Client, turn: TurnInput, task_queue: str = TASK_QUEUE
) -> WorkflowHandle:
    indexed = await registered.available(client)
    return await client.start_workflow(
        AgentTurn.run,
        turn,
        id=turn_id(turn.customer_id),
        task_queue=task_queue,
        static_summary=turn.question[:200],
        static_details=f"customer: {turn.customer_id} · model: {turn.model or 'worker default'}",
        search_attributes=search.at_start(turn.customer_id, turn.model) if indexed else None,
    )


async def start_chat(
    client: Client, chat: ConversationInput, first: str, task_queue: str = TASK_QUEUE
) -> tuple[WorkflowHandle, MessageAccepted]:
    """Start a conversation and send its first message, in one call (update-with-start)."""
    message = _message(first)
    indexed = await registered.available(client)
    start = WithStartWorkflowOperation(
        Conversation.run,
        chat,
        id=chat_id(chat.customer_id),
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        task_queue=task_queue,
        static_summary=f"chat with {chat.customer_id}",
        search_attributes=search.at_start(chat.customer_id, chat.model) if indexed else None,
    )
    accepted = await _update(
        client.execute_update_with_start_workflow(
            Conversation.send, message, start_workflow_operation=start
        )
    )
    return await start.workflow_handle(), accepted


async def send(conversation: WorkflowHandle, text: str) -> MessageAccepted:
    """The next message of a conversation; returns when the turn answering it starts."""
    try:
        return await _update(conversation.execute_update(Conversation.send, _message(text)))
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise AgentClientError(
                f"conversation {conversation.id} has ended (or never existed); start a new one"
            ) from None
        raise


def _message(text: str) -> ChatMessage:
    try:
        return ChatMessage(text=text)
    except ValueError as e:
        raise AgentClientError(_first_error(e)) from None


async def follow(handle: WorkflowHandle) -> AsyncIterator[Step]:
    """Yield the turn's steps as they happen (polls the `progress` query)."""
    seen = 0
    while True:
        progress = await progress_of(handle)
        for step in progress.steps[seen:]:
            yield step
        seen = len(progress.steps)
        if progress.done:
            return
        await asyncio.sleep(FOLLOW_POLL_S)


async def progress_of(handle: WorkflowHandle) -> TurnProgress:
    try:
        return await handle.query(AgentTurn.progress)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise AgentClientError(f"no turn with workflow id {handle.id!r}") from None
        raise


@dataclass(frozen=True)
class Waiting:
    """A call awaiting consent, and the turn it belongs to."""

    workflow_id: str
    approval: PendingApproval

    def age(self, now: datetime) -> str:
        seconds = max(0, int((now - self.approval.since).total_seconds()))
        if seconds < 120:
            return f"{seconds}s"
        if seconds < 7200:
            return f"{seconds // 60}m"
        return f"{seconds // 3600}h"


async def pending(client: Client, customer_id: str | None = None) -> list[Waiting]:
    """Every call awaiting consent, oldest first (of the customer's turns, if given)."""
    if await registered.available(client):
        query = (
            f"WorkflowType = 'AgentTurn' AND {search.STATUS.name} = '{search.AWAITING_APPROVAL}'"
        )
        if customer_id:
            query += f" AND {search.CUSTOMER.name} = '{_quoted(customer_id)}'"
    else:  # no search attributes: look at every running turn
        query = "WorkflowType = 'AgentTurn' AND ExecutionStatus = 'Running'"
    found: list[Waiting] = []
    async for wf in client.list_workflows(query):
        handle = client.get_workflow_handle(wf.id)
        try:
            progress = await progress_of(handle)
        except (AgentClientError, RPCError):
            continue  # finished meanwhile
        for p in progress.pending:
            found.append(Waiting(wf.id, p))
    return sorted(found, key=lambda w: w.approval.since)


async def decide(
    client: Client,
    workflow_id: str,
    call_id: str | None,
    *,
    approved: bool,
    by: str,
    reason: str = "",
) -> ApprovalResult:
    """Approve or reject a waiting call; without `call_id`, the turn's only one."""
    handle = client.get_workflow_handle(workflow_id)
    await _running(handle)
    if call_id is None:
        waiting = (await progress_of(handle)).pending
        if len(waiting) != 1:
            listed = ", ".join(f"{p.call.id} ({p.call.render()})" for p in waiting)
            raise AgentClientError(
                f"turn {workflow_id} has no call awaiting approval"
                if not waiting
                else f"turn {workflow_id} has {len(waiting)} calls awaiting approval: {listed}; "
                "name the CALL_ID"
            )
        call_id = waiting[0].call.id
    try:
        decision = ApprovalDecision(call_id=call_id, approved=approved, by=by, reason=reason)
    except ValueError as e:
        raise AgentClientError(_first_error(e)) from None
    return await _update(handle.execute_update(AgentTurn.decide, decision))


async def _running(handle: WorkflowHandle) -> None:
    """Refuse, without needing a worker, a turn that does not exist or has ended."""
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise AgentClientError(f"no turn with workflow id {handle.id!r}") from None
        raise
    if desc.status != WorkflowExecutionStatus.RUNNING:
        state = desc.status.name.lower() if desc.status else "ended"
        raise AgentClientError(f"turn {handle.id} is {state}: no call awaits approval")


@dataclass(frozen=True)
class TurnRow:
    workflow_id: str
    status: str
    outcome: str
    customer_id: str
    started: datetime
    tools: list[str]
    question: str


async def find_turns(
    client: Client,
    *,
    customer_id: str | None = None,
    outcome: str | None = None,
    awaiting_approval: bool = False,
    limit: int = 20,
) -> list[TurnRow]:
    """Recent turns, newest first, filtered by the agent's search attributes."""
    if not await registered.available(client):
        raise AgentClientError(
            "the agent's search attributes are not registered on this namespace, so turns "
            f"cannot be filtered; register them with: {search.create_command()}"
        )
    clauses = ["WorkflowType = 'AgentTurn'"]
    if customer_id:
        clauses.append(f"{search.CUSTOMER.name} = '{_quoted(customer_id)}'")
    if outcome:
        clauses.append(f"{search.OUTCOME.name} = '{_quoted(outcome)}'")
    if awaiting_approval:
        clauses.append(f"{search.STATUS.name} = '{search.AWAITING_APPROVAL}'")
    rows = []
    async for wf in client.list_workflows(" AND ".join(clauses), limit=limit):
        attrs = wf.typed_search_attributes
        rows.append(
            TurnRow(
                workflow_id=wf.id,
                status=attrs.get(search.STATUS)
                or (wf.status.name.lower() if wf.status else "unknown"),
                outcome=attrs.get(search.OUTCOME) or "",
                customer_id=attrs.get(search.CUSTOMER) or "",
                started=wf.start_time,
                tools=list(attrs.get(search.TOOLS) or []),
                question="",
            )
        )
    questions = await asyncio.gather(*(_summary(client, r.workflow_id) for r in rows))
    return [TurnRow(**{**r.__dict__, "question": q}) for r, q in zip(rows, questions, strict=True)]


async def _summary(client: Client, workflow_id: str) -> str:
    try:
        return (
            await (await client.get_workflow_handle(workflow_id).describe()).static_summary() or ""
        )
    except RPCError:
        return ""


async def _update(pending_update):  # type: ignore[no-untyped-def]
    """An update's result, or its refusal (the validator's words) as an AgentClientError."""
    try:
        return await pending_update
    except WorkflowUpdateFailedError as e:
        cause = e.cause
        message = cause.message if isinstance(cause, ApplicationError) else str(cause or e)
        raise AgentClientError(message) from None


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _first_error(e: ValueError) -> str:
    errors = getattr(e, "errors", None)
    if callable(errors):
        return "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in errors())
    return str(e)
