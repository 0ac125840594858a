"""Talking to the agent from outside: start, follow, decide and find turns and conversations.

What every front end does (`client.py` today), in one place:

    workflow_id(kind, customer, key)              ids no two customers' keys share
    start_turn(client, TurnInput(...))            one question, one AgentTurn workflow
    started_with(handle, type, input type)        whom a turn or conversation serves
    start_chat / send                             a Conversation; each message is a turn
    follow(client, turn_id)                       a turn's events as they happen (its stream)
    pending(client) / decide(client, wf, ...)     calls awaiting consent, and deciding them
    find_turns(client, customer=..., ...)         recent turns, by search attributes
    workers(client, task_queue)                   is anyone serving the queue, truly?
    history_view(handle)                          what a turn's history holds, no worker needed
    whole(handle, output) / earlier_steps(...)    a turn's story across the runs it took

Errors a person can act on are `AgentClientError`s with a one-line message.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import string
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar, cast

from temporalio.api.common.v1 import WorkflowExecution as ExecutionRef
from temporalio.api.enums.v1 import EventType, TaskQueueType, WorkerStatus, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.taskqueue.v1 import PollerInfo, TaskQueue
from temporalio.api.worker.v1 import WorkerHeartbeat
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    GetWorkflowExecutionHistoryReverseRequest,
    ListWorkersRequest,
)
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import Priority, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from durable_agent import secret
from durable_agent.answers import markdown_plain, markdown_safe
from durable_agent.approval import ApprovalDecision, ApprovalResult, may_decide
from durable_agent.chat import ChatMessage, ConversationInput, ConversationOutput, MessageAccepted
from durable_agent.elicitation import AnswerInput, Question, check_answer, filled
from durable_agent.errors import (
    AgentClientError,
    InvalidAnswer,
    InvalidEvent,
    NotAnApprover,
    NothingPending,
    NotWaiting,
    NoWorker,
    UnknownTurn,
    WorkerNeeded,
)
from durable_agent.principal import DEFAULT_TENANT, Principal
from durable_agent.runtime import deployments
from durable_agent.runtime import search as registered
from durable_agent.runtime.settings import TASK_QUEUE, client_command, worker_command
from durable_agent.runtime.streams import turn_events
from durable_agent.stream import TurnEvent
from durable_agent.types import (
    PendingApproval,
    Step,
    TurnInput,
    TurnOutput,
    TurnProgress,
)
from durable_agent.waits import Wake, Woke, WorldEvent, checked_event
from durable_agent.workflows import names, search
from durable_agent.workflows.carry import TurnCarry
from durable_agent.workflows.policies import WORKFLOW_TASK_TIMEOUT

T = TypeVar("T")
log = logging.getLogger(__name__)


ID_KEPT = frozenset(string.ascii_letters + string.digits + "_.@")
"""Characters an id part keeps as they are (`escaped_part`)."""
MAX_ID_PART = 64
"""Characters of one escaped part of an id, at most: a longer one is cut and hashed."""
_HASHED = 32
"""Hex digits of SHA-256 that stand for a part too long to keep whole (128 bits)."""


def workflow_id(kind: str, customer_id: str, key: str) -> str:
    """The workflow id of a customer's `kind` ("turn", "chat") named `key` (a request
    id, or a random one): `<kind>-<customer>-<key>`, each part escaped (`escaped_part`)
    so that it holds no `-`. The two `-` are then the only ones: the customer ends at
    the first, and no two (customer, key) pairs give one id (`bob` asking `x-k1` is
    `turn-bob-x~k1`, `bob-x` asking `k1` is `turn-bob~x-k1`). Ids made from an id by
    adding `-…` (a conversation's turns `<id>-<n>`, forks `<id>-fork-<n>`, sub-agents)
    have more, so they never equal one made here. At most 134 characters, whatever
    the customer (Temporal caps ids at 1,000; forks and sub-agents add to them)."""
    return f"{kind}-{escaped_part(customer_id)}-{escaped_part(key)}"


def owner_part(principal: Principal) -> str:
    """What names who asks in a workflow id (`workflow_id`'s customer): the user alone
    in the default tenant (ids as before tenants), else `<tenant>:<user>` with the user
    escaped: escaping never writes a `:`, so no customer of the default tenant (`a:b`
    is `a%3Ab`) and no other tenant's user names the same turns."""
    if principal.tenant == DEFAULT_TENANT:
        return principal.user
    return f"{principal.tenant}:{escaped_part(principal.user)}"


def escaped_part(text: str) -> str:
    """`text` as one part of a workflow id, readable where it can be: letters, digits,
    `_`, `.` and `@` as they are, `-` as `~`, any other character as its UTF-8 bytes in
    `%XX` (`c-42` → `c~42`, `josé` → `jos%C3%A9`, `a/b` → `a%2Fb`). Over `MAX_ID_PART`
    characters, its start and then `+` and its SHA-256 (escaping never writes a `+`, so a
    cut part never equals a whole one)."""
    pieces: list[str] = []
    size = 0
    for char in text:
        piece = char if char in ID_KEPT else "~" if char == "-" else _percent(char)
        pieces.append(piece)
        size += len(piece)
    if size <= MAX_ID_PART:
        return "".join(pieces)
    kept, room = [], MAX_ID_PART - 1 - _HASHED
    for piece in pieces:
        if len(piece) > room:
            break
        kept.append(piece)
        room -= len(piece)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return "".join(kept) + "+" + digest[:_HASHED]


def _percent(char: str) -> str:
    return "".join(f"%{b:02X}" for b in char.encode("utf-8", "surrogatepass"))


def turn_id(customer_id: str, request_id: str = "") -> str:
    """A turn's id (`workflow_id`): of the customer's request `request_id`, the same for
    the same request; without one, new each time (`turn-<customer>-<8 hex>`)."""
    return workflow_id("turn", customer_id, request_id or uuid.uuid4().hex[:8])


def chat_id(customer_id: str) -> str:
    """A new conversation's id, `chat-<customer>-<8 hex>` (`workflow_id`); its turns are
    `<chat id>-<n>`."""
    return workflow_id("chat", customer_id, uuid.uuid4().hex[:8])


REQUEST_MEMO = "request"
"""The memo entry of a turn started by this client: its request's fingerprint, which
a start with the same request id compares (`request_fingerprint`)."""


def request_fingerprint(turn: TurnInput) -> str:
    """What makes a turn's request that one, hashed (64 hex digits, whatever its size):
    who asks, the question, the agent, model, settings and limits, the output type and
    the context. Not `stream`, which changes how the turn is read, never what it does."""
    identity = turn.model_dump(
        mode="json",
        include={"customer_id", "question", "agent", "model", "limits", "output", "context"},
    )
    if turn.principal is not None:  # a customer named alone hashes as before principals
        identity["principal"] = turn.principal.model_dump(mode="json")
    identity["context"] = secret.shown(identity["context"])  # by name: sealed anew each time
    if turn.settings is not None:  # a turn without settings hashes as before they existed
        identity["settings"] = turn.settings.model_dump(mode="json", exclude_none=True)
    if turn.attachments:  # its files by their content: a reference differs each time
        identity["attachments"] = [a.sha256 for a in turn.attachments]
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


async def same_request(handle: WorkflowHandle, turn: TurnInput) -> bool:
    """Whether the turn `handle` names was started for `turn`'s request: at once when
    `handle` is the start that made it (`made_by`); else by the fingerprint in its memo,
    or (a turn started before turns kept one) by its input. A workflow of that id that
    is no turn (a conversation) is not."""
    if made_by(handle):
        return True
    described = await handle.describe()
    try:
        recorded = await described.memo_value(REQUEST_MEMO, type_hint=str)
    except KeyError:
        opened = await started_with(handle, "AgentTurn", TurnInput)
        recorded = request_fingerprint(opened) if opened is not None else ""
    return bool(recorded == request_fingerprint(turn))


def made_by(handle: WorkflowHandle) -> bool:
    """Whether `handle` is the start that made its workflow, with the input it was
    given (the server's answer to a start that may find one running says so): not one
    that found it there. False when the SDK does not say: the caller then asks."""
    response = getattr(handle, "_start_workflow_response", None)
    return bool(getattr(response, "started", False))


async def started_with(handle: WorkflowHandle, workflow_type: str, input_type: type[T]) -> T | None:
    """The input a workflow of `workflow_type` (`AgentTurn`, `Conversation`) was started
    with, as its latest run was given it; None when no workflow of that type has the
    handle's id. The customer in it is whom the workflow serves (its tools act for
    them): an owner is checked against it, never against the id."""
    converter = handle._client.data_converter  # the handle's own, payload store included
    try:
        async for event in handle.fetch_history_events(page_size=1):
            started = event.workflow_execution_started_event_attributes
            if started.workflow_type.name != workflow_type:
                return None
            [value] = await converter.decode(list(started.input.payloads), [input_type])
            return value  # type: ignore[no-any-return]
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
    return None


async def start_turn(
    client: Client, turn: TurnInput, task_queue: str = TASK_QUEUE, workflow_id: str = ""
) -> WorkflowHandle:
    """Start a turn. With `workflow_id`, a turn already started with that id is the one
    returned (running or finished; WorkflowAlreadyStartedError for a finished one):
    asking again after a crash never asks twice. Whether that turn is of the same
    request, `same_request` says: its memo holds the request's fingerprint."""
    indexed = await registered.available(client)
    if not workflow_id:
        # A new id: one that some earlier turn of the customer's already has (8 hex
        # digits meet again over tens of thousands of turns) is never reused, so no
        # turn's record is hidden behind a new run of its id; another id is drawn.
        for _ in range(RANDOM_ID_DRAWS - 1):
            with contextlib.suppress(WorkflowAlreadyStartedError):
                return await _start(client, turn, task_queue, _new_id(turn), indexed)
        return await _start(client, turn, task_queue, _new_id(turn), indexed)
    return await _start(
        client,
        turn,
        task_queue,
        workflow_id,
        indexed,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


RANDOM_ID_DRAWS = 4


def _new_id(turn: TurnInput) -> str:
    return turn_id(owner_part(turn.asker))


async def _start(
    client: Client,
    turn: TurnInput,
    task_queue: str,
    workflow_id: str,
    indexed: bool,
    id_conflict_policy: WorkflowIDConflictPolicy = WorkflowIDConflictPolicy.FAIL,
) -> WorkflowHandle:
    return await client.start_workflow(
        names.TURN,
        turn,
        result_type=TurnOutput,
        id=workflow_id,
        task_queue=task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        id_conflict_policy=id_conflict_policy,
        **start_options(turn),
        search_attributes=search.at_start(
            turn.customer_id, turn.model, agent=turn.agent, principal=turn.principal
        )
        if indexed
        else None,
        # A worker in this process with a free slot (`ask --embedded`, `web`) gets the
        # first workflow task in the start's reply; any other start is unchanged.
        request_eager_start=True,
    )


def start_options(turn: TurnInput) -> dict[str, Any]:
    """What every start of a turn carries besides its id, queue and search attributes:
    its Web UI summary and details, its request's fingerprint, its task timeout (a
    schedule's action too: `durable_agent.schedules`)."""
    return {
        "static_summary": markdown_safe(turn.question[:200]),
        "static_details": markdown_safe(details(turn)),
        "memo": {REQUEST_MEMO: request_fingerprint(turn)},
        "task_timeout": WORKFLOW_TASK_TIMEOUT,
        "priority": fair_share(turn),
    }


MAX_FAIRNESS_KEY_BYTES = 64
"""The server's bound on a fairness key: a longer one is its hash."""


def fairness_key(turn: TurnInput | ConversationInput) -> str:
    """Whose share of the task queue a turn's tasks take (Temporal's task fairness):
    its tenant's, so that one tenant's burst does not starve the others' turns; in the
    default tenant (a service that names no tenants), each customer's own share."""
    whom = turn.asker
    key = whom.user if whom.tenant == DEFAULT_TENANT else f"tenant:{whom.tenant}"
    if len(key.encode("utf-8", "surrogatepass")) <= MAX_FAIRNESS_KEY_BYTES:
        return key
    return "h-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def fair_share(turn: TurnInput | ConversationInput) -> Priority:
    """The priority a turn's workflow starts with: its fairness key. Its activities and
    child workflows (sub-agents, a conversation's turns) inherit it; a server without
    fairness (before 1.29, or with matching.enableFairness off) ignores it."""
    return Priority(fairness_key=fairness_key(turn))


def details(turn: TurnInput) -> str:
    """The turn's details in the Web UI: who asked, and which agent and model answer
    where the caller named them (the turn's AgentName and AgentModel say which did)."""
    named = [f"agent: {turn.agent}"] if turn.agent else []
    return " · ".join(
        [*named, f"customer: {turn.customer_id}", f"model: {turn.model or 'the agent’s'}"]
    )


async def start_chat(
    client: Client,
    chat: ConversationInput,
    first: str | ChatMessage,
    task_queue: str = TASK_QUEUE,
    *,
    workflow_id: str = "",
    message_id: str = "",
) -> tuple[WorkflowHandle, MessageAccepted]:
    """Start a conversation and send its first message, in one call (update-with-start).

    With `workflow_id` and `message_id` (both chosen by the caller, stable across its
    crashes), starting again is safe: a conversation already running with that id
    gets the message instead, and the server takes a message id once, so a message
    sent again is not a second one. A conversation of that id that has ended is not
    started afresh (WorkflowAlreadyStartedError)."""
    message = _message(first)
    indexed = await registered.available(client)
    again: dict[str, Any] = (
        {
            "id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING,
            "id_reuse_policy": WorkflowIDReusePolicy.REJECT_DUPLICATE,
        }
        if workflow_id
        else {"id_conflict_policy": WorkflowIDConflictPolicy.FAIL}
    )
    workflow_id = workflow_id or chat_id(chat.customer_id)
    start: WithStartWorkflowOperation[Any, ConversationOutput] = WithStartWorkflowOperation(
        names.CONVERSATION,
        chat,
        result_type=ConversationOutput,
        id=workflow_id,
        **again,
        task_queue=task_queue,
        static_summary=markdown_safe(
            f"chat with {chat.customer_id}" + (f" ({chat.agent})" if chat.agent else "")
        ),
        search_attributes=search.at_start(
            chat.customer_id, chat.model, agent=chat.agent, principal=chat.principal
        )
        if indexed
        else None,
        task_timeout=WORKFLOW_TASK_TIMEOUT,
        priority=fair_share(chat),
    )
    started: list[bool] = []

    async def send(update_id: str) -> MessageAccepted:
        if started:  # sent again: the conversation is there already
            handle = client.get_workflow_handle(workflow_id)
            return await handle.execute_update(
                names.SEND, message, id=update_id, result_type=MessageAccepted
            )
        started.append(True)
        return await client.execute_update_with_start_workflow(
            names.SEND,
            message,
            start_workflow_operation=start,
            id=update_id,
            result_type=MessageAccepted,
        )

    accepted = await _update(send, message_id)
    await _turn_started(client, accepted)
    return await start.workflow_handle(), accepted


async def send(
    conversation: WorkflowHandle, text: str | ChatMessage, message_id: str = ""
) -> MessageAccepted:
    """The next message of a conversation; returns when the turn answering it starts.
    With `message_id`, sending it again (after a crash of the sender) is not a second
    message: the server runs an update id once per run of the conversation."""
    try:
        message = _message(text)
        await _version_served(conversation)
        accepted = await _update(
            lambda update_id: conversation.execute_update(
                names.SEND, message, id=update_id, result_type=MessageAccepted
            ),
            message_id,
        )
        await _turn_started(conversation._client, accepted)  # the handle's own client
        return accepted
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            ended = ": start a new one"
            raise UnknownTurn(conversation.id, "running conversation", ended) from None
        raise


async def _version_served(conversation: WorkflowHandle) -> None:
    """Refuse at once a message to a conversation pinned to a version whose workers
    are gone: an update would wait for one for as long as the caller lets it, and
    could still be applied after the caller gave up."""
    described = await conversation.describe()
    build = _build(described.typed_search_attributes.get(VERSION) or "")
    client = conversation._client  # the handle's own client
    if build and build not in await live_builds(client, described.task_queue):
        raise NoWorker(
            f"conversation {conversation.id} runs on version {build}, and no worker of it "
            f"runs: start a worker of that release ({worker_command()}), then send again; "
            f"`{client_command()} versions` shows what needs which workers"
        )


async def _turn_started(client: Client, accepted: MessageAccepted) -> None:
    """Until the turn answering an accepted message exists. It does at once, unless
    the conversation moved to new code first: then the new run starts it, a moment
    later (`MessageAccepted.started`)."""
    delay = 0.05
    while not accepted.started:
        try:
            await client.get_workflow_handle(accepted.turn_id).describe()
            return
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


def _message(text: str | ChatMessage) -> ChatMessage:
    if isinstance(text, ChatMessage):
        return text
    try:
        return ChatMessage(text=text)
    except ValueError as e:
        raise AgentClientError(_first_error(e)) from None


async def follow(client: Client, turn_id: str, from_offset: int = 0) -> AsyncIterator[TurnEvent]:
    """The turn's events from its stream (`durable_agent/stream.py`): steps as they are
    recorded, the models' text as it is written (when the turn streams it), then
    its outcome. On a finished turn, its whole story (a worker answers that)."""
    try:
        async for _, event in turn_events(client, turn_id, from_offset):
            yield event
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise UnknownTurn(turn_id) from None
        if e.status == RPCStatusCode.UNAVAILABLE:
            raise AgentClientError(
                f"lost the Temporal server ({e.message}); turn {turn_id} is kept there: "
                f"see it with `{client_command()} show {turn_id}` once the server is back"
            ) from None
        raise


async def progress_of(handle: WorkflowHandle, timeout: float | None = None) -> TurnProgress:
    """The turn's steps so far. A query needs a worker: with `timeout`, give up
    after that many seconds (`WorkerNeeded`) instead of waiting for one."""
    try:
        rpc_timeout = timedelta(seconds=timeout) if timeout else None
        return await handle.query(names.PROGRESS, rpc_timeout=rpc_timeout, result_type=TurnProgress)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise UnknownTurn(handle.id) from None
        if timeout and e.status in (
            RPCStatusCode.CANCELLED,  # how the client reports its own deadline
            RPCStatusCode.DEADLINE_EXCEEDED,
            RPCStatusCode.FAILED_PRECONDITION,
            RPCStatusCode.UNAVAILABLE,
        ):
            raise WorkerNeeded(e.message) from None
        raise


@dataclass(frozen=True)
class Workers:
    """Who serves a task queue: the workers that poll it, as Temporal judges it."""

    live: int
    last_seen: datetime | None
    """The latest sign (a poll or a heartbeat) of any worker of the queue, live or not."""


POLL_WINDOW = timedelta(seconds=75)
"""A worker is live while it polls: an idle poller asks again when its long poll (about
a minute) runs out, so one not seen for longer has gone."""


async def workers(client: Client, task_queue: str) -> Workers:
    """Live workers of `task_queue`: each that polled it within `POLL_WINDOW`, whatever its
    heartbeats (a worker built by hand beats every minute, or never).

    Heartbeats only tell a death sooner: a worker killed outright leaves its polls
    listed for up to a minute, but once it has beaten twice its interval is known, and
    a beat overdue (or one saying it shut down) means it is gone, unless the same
    identity polled again since (a worker started again in one process)."""
    live, seen = await _live(client, task_queue)
    return Workers(live=len(live), last_seen=max(seen.values(), default=None))


async def live_identities(client: Client, task_queue: str) -> dict[str, datetime]:
    """Each live worker of `task_queue` (as `workers` counts them): its identity, and
    when it was last seen."""
    live, seen = await _live(client, task_queue)
    return {who: seen[who] for who in live}


async def live_builds(client: Client, task_queue: str) -> set[str]:
    """The build ids of the live workers of `task_queue` (as `workers` counts them;
    an unversioned worker's is empty)."""
    polls = await _poll_records(client, task_queue)
    live, _ = await _live(client, task_queue, polls)
    return {p.deployment_options.build_id for p in polls if p.identity in live}


HEARTBEAT_PAGES = 20
"""The most pages of worker heartbeats read at once (of 1,000 each)."""


async def worker_heartbeats(client: Client) -> list[WorkerHeartbeat]:
    """Every worker heartbeat the namespace lists, page by page (`HEARTBEAT_PAGES` at
    most). RPCError from a server that keeps none."""
    beats: list[WorkerHeartbeat] = []
    token = b""
    for _ in range(HEARTBEAT_PAGES):
        listed = await client.workflow_service.list_workers(
            ListWorkersRequest(namespace=client.namespace, page_size=1000, next_page_token=token)
        )
        beats.extend(info.worker_heartbeat for info in listed.workers_info)
        token = listed.next_page_token
        if not token:
            break
    return beats


async def _live(
    client: Client, task_queue: str, polls: list[PollerInfo] | None = None
) -> tuple[set[str], dict[str, datetime]]:
    """The identities of the live workers, and when each worker was last seen."""
    polled = _last_polls(polls if polls is not None else await _poll_records(client, task_queue))
    now = datetime.now(timezone.utc)
    seen = dict(polled)
    gone_at: dict[str, datetime] = {}
    beating: set[str] = set()
    try:
        beats = await worker_heartbeats(client)
    except RPCError:  # a server without worker heartbeats: the polls say it all
        beats = []
    for beat in beats:
        if beat.task_queue != task_queue:
            continue
        who, at = beat.worker_identity, beat.heartbeat_time.ToDatetime(tzinfo=timezone.utc)
        seen[who] = max(at, seen.get(who, at))
        interval = beat.elapsed_since_last_heartbeat.ToTimedelta()
        if beat.status != WorkerStatus.WORKER_STATUS_RUNNING:
            gone = at
        elif interval and now - at > 2 * interval + HEARTBEAT_GRACE:
            gone = at + 2 * interval + HEARTBEAT_GRACE
        else:
            # Beating on time, or too new for its interval to be known.
            if interval:
                beating.add(who)
            continue
        gone_at[who] = max(gone, gone_at.get(who, gone))
    live = {
        who
        for who, at in polled.items()
        if now - at <= POLL_WINDOW and (who not in gone_at or at > gone_at[who])
    }
    return live | beating, seen


HEARTBEAT_GRACE = timedelta(seconds=5)
"""Slack for a heartbeat on a busy machine, beyond two of its intervals."""


async def _poll_records(client: Client, task_queue: str) -> list[PollerInfo]:
    """The workers that polled `task_queue` for workflow tasks lately, as the server
    lists them."""
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return list(resp.pollers)


def _last_polls(polls: list[PollerInfo]) -> dict[str, datetime]:
    """Each poller's identity and last poll."""
    return {p.identity: p.last_access_time.ToDatetime(tzinfo=timezone.utc) for p in polls}


async def runs(
    handle: WorkflowHandle, run_id: str | None = None
) -> list[tuple[str, TurnCarry | None]]:
    """The runs of a turn, oldest first, up to `run_id` (default: its latest), each
    with what it took over from the run before (None: the first). A long turn
    continues as new (`durable_agent/workflows/carry.py`): one workflow id, several runs."""
    client = handle._client  # the handle's own, encryption and payload store included
    run_id = run_id or (await handle.describe()).run_id
    found: list[tuple[str, TurnCarry | None]] = []
    while run_id:
        first = client.get_workflow_handle(handle.id, run_id=run_id).fetch_history_events(
            page_size=1
        )
        async for event in first:
            started = event.workflow_execution_started_event_attributes
            break
        else:
            break
        [turn] = await client.data_converter.decode(list(started.input.payloads), [TurnInput])
        carry = TurnCarry.of(turn)
        found.append((run_id, carry))
        run_id = started.continued_execution_run_id if carry is not None else ""
    return found[::-1]


async def opening(handle: WorkflowHandle) -> TurnInput:
    """The turn's input as its latest run was given it: its question, who asked, and
    what it is a fork of (every run's input carries them). `UnknownTurn`."""
    turn = await started_with(handle, "AgentTurn", TurnInput)
    if turn is None:
        raise UnknownTurn(handle.id)
    return turn


async def earlier_steps(handle: WorkflowHandle, run_id: str | None = None) -> list[Step]:
    """The steps of a turn's runs before `run_id` (default: its latest), oldest first:
    each run's are in the input of the run after it."""
    return [s for _, carry in await runs(handle, run_id) if carry for s in carry.steps]


async def whole(handle: WorkflowHandle, output: TurnOutput | TurnProgress) -> list[Step]:
    """The story of a turn that continued as new: the earlier runs' steps, then those
    of `output` (a result, or the latest run's progress); `output.steps` if it did not."""
    if not output.earlier_steps:
        return list(output.steps)
    for _ in range(3):  # the turn may move to a new run between the two reads
        before = await earlier_steps(handle)
        if len(before) == output.earlier_steps:
            return [*before, *output.steps]
        if isinstance(output, TurnProgress):
            output = await progress_of(handle)
    raise AgentClientError(
        f"turn {handle.id}: its earlier runs hold {len(before)} steps, its result says "
        f"{output.earlier_steps}; see its runs in the Web UI"
    )


async def history_view(handle: WorkflowHandle) -> list[str]:
    """A turn's activities as its history records them (with their Web UI summaries),
    for when no worker is there to answer the `progress` query; a turn that continued
    as new, run by run."""
    chain = await runs(handle)
    lines: list[str] = []
    for number, (run_id, _) in enumerate(chain, 1):
        if len(chain) > 1:
            lines.append(f"-- run {number} of {len(chain)} ({run_id})")
        run = handle._client.get_workflow_handle(handle.id, run_id=run_id)
        lines += await _run_view(run)
    return lines


async def _run_view(handle: WorkflowHandle) -> list[str]:
    converter = handle._client.data_converter  # the client's own, encryption included
    scheduled: dict[int, str] = {}
    lines: list[str] = []
    async for event in handle.fetch_history_events():
        summary = ""
        if event.user_metadata.HasField("summary"):
            summary = markdown_plain(
                str((await converter.decode([event.user_metadata.summary]))[0])
            )
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            kind = event.activity_task_scheduled_event_attributes.activity_type.name
            # Summaries of the turn's own steps name their kind already ("plan: …").
            named = not summary or summary.partition(":")[0] == kind
            scheduled[event.event_id] = (summary or kind) if named else f"{kind}: {summary}"
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = scheduled.pop(
                event.activity_task_completed_event_attributes.scheduled_event_id, ""
            )
            lines.append(f"done     {done}")
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            failed = scheduled.pop(
                event.activity_task_failed_event_attributes.scheduled_event_id, ""
            )
            lines.append(f"failed   {failed}")
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and summary:
            lines.append(f"done     {summary}")
        elif event.event_type == EventType.EVENT_TYPE_TIMER_STARTED and summary:
            lines.append(f"waiting  {summary}")
    lines += [f"running  {what}" for what in scheduled.values()]
    return lines


@dataclass(frozen=True)
class Waiting:
    """A call awaiting consent, and the turn it belongs to."""

    workflow_id: str
    approval: PendingApproval
    version: str = ""
    """The worker version the turn runs on, `DEPLOYMENT:BUILD_ID` (empty: unversioned)."""
    stalled: bool = False
    """No worker of that version runs: the turn waits for one (a decision is kept
    until then)."""
    asker: Principal | None = None
    """Who asked the turn, as its input records it (`AgentClient.pending_for` fills it)."""

    def age(self, now: datetime) -> str:
        seconds = max(0, int((now - self.approval.since).total_seconds()))
        if seconds < 120:
            return f"{seconds}s"
        if seconds < 7200:
            return f"{seconds // 60}m"
        return f"{seconds // 3600}h"


async def pending(
    client: Client, customer_id: str | None = None, tenant: str | None = None
) -> list[Waiting]:
    """Every call awaiting consent, oldest first (of the customer's turns, if given).
    A turn whose version has no worker running is listed from its memo, `stalled`."""
    if await registered.available(client):
        # Running too: a turn that failed or was terminated while it waited (a payload it
        # could not read, say) keeps the status it had, and awaits nothing.
        query = (
            f"WorkflowType = 'AgentTurn' AND ExecutionStatus = 'Running' "
            f"AND {search.STATUS.name} = '{search.AWAITING_APPROVAL}'"
        )
        if customer_id:
            query += f" AND {search.CUSTOMER.name} = '{_quoted(customer_id)}'"
        if tenant:
            query += f" AND {search.TENANT.name} = '{_quoted(tenant)}'"
    else:  # no search attributes: look at every running turn
        query = "WorkflowType = 'AgentTurn' AND ExecutionStatus = 'Running'"
    found: list[Waiting] = []
    live: dict[str, set[str]] = {}  # task queue: build ids of its live workers
    async for wf in client.list_workflows(query):
        version = wf.typed_search_attributes.get(VERSION) or ""
        if wf.task_queue not in live:
            live[wf.task_queue] = await live_builds(client, wf.task_queue)
        waiting: list[PendingApproval] | None = None
        stalled = _build(version) not in live[wf.task_queue]
        if not stalled:
            try:
                waiting = (
                    await progress_of(client.get_workflow_handle(wf.id), QUERY_WAIT_S)
                ).pending
            except WorkerNeeded:
                stalled = True
            except (AgentClientError, RPCError):
                continue  # finished meanwhile
        if waiting is None:
            try:
                waiting = await memo_pending(wf.memo_value)
            except AgentClientError as e:
                # One turn this process cannot read (its memo in a store it lacks) must
                # not hide every other turn's calls: it is left out, and said.
                log.warning("turn %s awaits a decision but cannot be read: %s", wf.id, e)
                continue
        found += [Waiting(wf.id, p, version, stalled) for p in waiting]
    return sorted(found, key=lambda w: w.approval.since)


async def waiting_of(handle: WorkflowHandle) -> list[PendingApproval]:
    """The calls a running turn awaits a decision on: from its memo (no worker needed),
    else as its worker answers; none for a turn that does not run."""
    try:
        described = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return []
        raise
    if described.status != WorkflowExecutionStatus.RUNNING:
        return []
    listed = await memo_pending(described.memo_value)
    if listed:
        return listed
    try:
        return (await progress_of(handle, QUERY_WAIT_S)).pending
    except AgentClientError:  # no worker answers: nothing the memo does not list
        return []


QUERY_WAIT_S = 5.0
"""How long `pending` and `decide` wait for a worker to answer before they read the
turn's memo instead (its version's workers are gone, or busy for that long)."""

DECIDE_WAIT_S = 15.0
"""How long a decision waits for a worker of the turn's version to take it before it
is recorded for later instead (see `decide`)."""


async def memo_pending(memo_value: Callable[..., Awaitable[Any]]) -> list[PendingApproval]:
    """The calls a turn's memo lists as awaiting a decision, from a description or a
    listing of it (`memo_value`; none in a turn started before turns kept them there).
    Each call's arguments and reason are cut to 1,000 characters (`bounds.for_memo`)."""
    try:
        return list(await memo_value(search.PENDING_MEMO, [], type_hint=list[PendingApproval]))
    except (KeyError, ValueError, TypeError):
        return []


@dataclass(frozen=True)
class Asked:
    """An MCP server's question awaiting a person's answer, and the turn it belongs to."""

    workflow_id: str
    question: Question


async def questions(
    client: Client, customer_id: str | None = None, tenant: str | None = None
) -> list[Asked]:
    """Every MCP server's question awaiting an answer, oldest first (of the customer's
    turns, if given), read from the turns' memos: no worker needs to run."""
    query = "WorkflowType = 'AgentTurn' AND ExecutionStatus = 'Running'"
    if await registered.available(client):
        query += f" AND {search.STATUS.name} = '{search.AWAITING_APPROVAL}'"
        if customer_id:
            query += f" AND {search.CUSTOMER.name} = '{_quoted(customer_id)}'"
        if tenant:
            query += f" AND {search.TENANT.name} = '{_quoted(tenant)}'"
    found: list[Asked] = []
    async for wf in client.list_workflows(query):
        try:
            asked = await memo_questions(wf.memo_value)
        except AgentClientError as e:
            log.warning("turn %s awaits an answer but cannot be read: %s", wf.id, e)
            continue
        found += [Asked(wf.id, q) for q in asked]
    epoch = datetime.min.replace(tzinfo=timezone.utc)
    return sorted(found, key=lambda a: a.question.since or epoch)


async def questions_of(handle: WorkflowHandle) -> list[Question]:
    """One turn's questions awaiting an answer, from its memo (no worker needed)."""
    try:
        described = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise UnknownTurn(handle.id) from None
        raise
    return await memo_questions(described.memo_value)


async def memo_questions(memo_value: Callable[..., Awaitable[Any]]) -> list[Question]:
    """The questions a turn's memo lists as awaiting an answer."""
    try:
        return list(await memo_value(search.QUESTIONS_MEMO, [], type_hint=list[Question]))
    except (KeyError, ValueError, TypeError):
        return []


async def answer(
    client: Client,
    workflow_id: str,
    question_id: str | None,
    *,
    action: str,
    content: Any = None,
    by: str,
) -> Answered:
    """Answer an MCP server's question (without `question_id`: the turn's only one),
    after filling in its form's defaults (`filled`) and checking the answer against it
    (`InvalidAnswer`, one line, nothing sent).

    As a decision on consent (`decide`): a worker of the turn's version takes it as an
    update, and the call is sent again with it; while none runs, it is sent as a
    signal the server keeps, which applies when one runs the turn (`later`)."""
    handle = client.get_workflow_handle(workflow_id)
    described = await _running(handle)
    waiting = await memo_questions(described.memo_value)
    if question_id is not None:
        named = [q for q in waiting if q.id == question_id]
    else:
        named = waiting if len(waiting) == 1 else []
    if not named:
        listed = ", ".join(q.id for q in waiting) or "none"
        what = (
            f"question {question_id!r} is not"
            if question_id
            else "name a question: none or several are"
        )
        raise NothingPending(
            f"{what} awaiting an answer in turn {workflow_id} (awaiting: {listed})"
        )
    question = named[0]
    # What the server gets and the story shows: the form's defaults in the fields left out.
    content = filled(question, action, content)
    check_answer(question, action, content)
    try:
        given = AnswerInput(question_id=question.id, action=action, content=content, by=by)  # type: ignore[arg-type]
    except ValueError as e:
        raise AgentClientError(_first_error(e)) from None
    version = described.typed_search_attributes.get(VERSION) or ""
    try:
        alive = _build(version) in await live_builds(client, described.task_queue)
    except RPCError:  # a server that lists no pollers: the update tells
        alive = True
    if alive:
        sent = asyncio.ensure_future(
            _update(
                lambda u: handle.execute_update(names.ANSWER, given, id=u, result_type=Question)
            )
        )
        try:
            await asyncio.wait({sent}, timeout=DECIDE_WAIT_S)
            if sent.done() and not isinstance(sent.exception(), NoWorker):
                sent.result()
                return Answered(question=question, action=given.action)
        finally:
            if not sent.done():
                sent.cancel()
                await asyncio.gather(sent, return_exceptions=True)
    # No worker of its version runs: kept in the turn's history for when one does (an
    # update left behind and this signal: the turn takes the first, drops the other).
    await handle.signal(names.ANSWER_LATER, given)
    return Answered(question=question, action=given.action, later=True)


@dataclass(frozen=True)
class Answered:
    """An answer the turn took (`later`: recorded while no worker of its version ran; it
    applies when one runs the turn)."""

    question: Question
    action: str
    later: bool = False


def _build(version: str) -> str:
    """The build id of a `DEPLOYMENT:BUILD_ID` version (empty: unversioned)."""
    return version.rpartition(":")[2]


async def decide(
    client: Client,
    workflow_id: str,
    call_id: str | None,
    *,
    approved: bool,
    by: str,
    reason: str = "",
    seen: WorkflowExecution | None = None,
    principal: Principal | None = None,
    via: str = "",
) -> ApprovalResult:
    """Approve or reject a waiting call; without `call_id`, the turn's only one.
    `principal`: who decides, from the caller's authentication, which the agent's
    approvers are checked against (`NotAnApprover`: refused, and in the turn's story);
    `via`: the front end. The decision names the hash of the call it was made on
    (`approval.consent_hash`, as the turn lists it): a call changed since is not it.

    A worker of the turn's version takes the decision as an update, and the result
    says it applied. While none runs (its workers are gone), the decision is sent as a
    signal the server keeps in the turn's history: it applies when a worker runs the
    turn again, and the result says so (`later`). So a decision never waits for
    minutes, and one the caller was told failed is never applied afterwards.

    A call the turn's memo lists is decided at once, while its workers are checked;
    any other is first asked of the turn. `seen`: the turn as a listing or a
    description just showed it running (its memo, version and task queue), so it
    is not described again."""
    handle = client.get_workflow_handle(workflow_id)
    described = seen if seen is not None else await _running(handle)
    version = described.typed_search_attributes.get(VERSION) or ""
    checking = asyncio.ensure_future(live_builds(client, described.task_queue))
    sent: asyncio.Future[ApprovalResult] | None = None

    def send(decision: ApprovalDecision) -> asyncio.Future[ApprovalResult]:
        return asyncio.ensure_future(
            _update(
                lambda u: handle.execute_update(
                    names.DECIDE, decision, id=u, result_type=ApprovalResult
                )
            )
        )

    try:
        waiting = await memo_pending(described.memo_value)
        if any(p.call.id == call_id for p in waiting):
            # Most decisions find the turn's workers running: the update does not wait
            # for the check. A call decided meanwhile is refused by the update.
            asked = _the_call(workflow_id, call_id, waiting)
            decision = _decision(asked, approved, by, reason, principal, via)
            sent = send(decision)
            try:
                alive = _build(version) in await checking
            except RPCError:  # the decision is out already: its answer says how it went
                alive = True
        else:
            # Not listed (yet) by the memo, or no call named: the turn itself says.
            try:
                alive = _build(version) in await checking
            except RPCError:  # a server that lists no pollers (the time-skipping test
                alive = True  # server, a key without the permission): the query tells
            if alive:
                try:
                    waiting = (await progress_of(handle, QUERY_WAIT_S)).pending
                except WorkerNeeded:
                    alive = False
            asked = _the_call(workflow_id, call_id, waiting)
            decision = _decision(asked, approved, by, reason, principal, via)
            if alive:
                sent = send(decision)
        if sent is not None and alive:
            await asyncio.wait({sent}, timeout=DECIDE_WAIT_S)
            if sent.done() and not isinstance(sent.exception(), NoWorker):
                return sent.result()
        # No worker of its version runs, or it went away meanwhile: recorded for later.
    finally:
        # Whatever is left (the caller was cancelled, the wait ran out) is let go.
        for left in (checking, sent):
            if left is not None and not left.done():
                left.cancel()
                await asyncio.gather(left, return_exceptions=True)
    if asked.approvers:
        # No worker to refuse it in the story: refused here, from what the turn recorded.
        opening = await started_with(handle, "AgentTurn", TurnInput)
        asker = opening.asker if opening is not None else None
        if asker is None or (refusal := may_decide(asked.approvers, asker, principal)):
            raise NotAnApprover(refusal if asker is not None else "who asked is unknown")
    # Whichever of an update left behind and this signal the turn reads first applies;
    # the other finds the call decided and is dropped.
    await handle.signal(names.DECIDE_LATER, decision)
    return ApprovalResult(
        call_id=asked.call.id, approved=approved, tool=asked.call.name, later=True
    )


def _decision(
    waiting: PendingApproval,
    approved: bool,
    by: str,
    reason: str,
    principal: Principal | None,
    via: str,
) -> ApprovalDecision:
    try:
        return ApprovalDecision(
            call_id=waiting.call.id,
            approved=approved,
            by=by,
            reason=reason,
            principal=principal,
            via=via,
            call_hash=waiting.call_hash,
        )
    except ValueError as e:
        raise AgentClientError(_first_error(e)) from None


def _the_call(
    workflow_id: str, call_id: str | None, waiting: list[PendingApproval]
) -> PendingApproval:
    """The waiting call named `call_id`, or the only one."""
    if call_id is not None:
        for p in waiting:
            if p.call.id == call_id:
                return p
        listed = ", ".join(p.call.id for p in waiting) or "none"
        raise NothingPending(
            f"call {call_id!r} is not awaiting approval in turn {workflow_id} (awaiting: {listed})"
        )
    if len(waiting) != 1:
        listed = ", ".join(f"{p.call.id} ({p.call.render()})" for p in waiting)
        raise NothingPending(
            f"turn {workflow_id} has no call awaiting approval"
            if not waiting
            else f"turn {workflow_id} has {len(waiting)} calls awaiting approval: {listed}; "
            "name the CALL_ID"
        )
    return waiting[0]


async def _running(handle: WorkflowHandle) -> WorkflowExecutionDescription:
    """Refuse, without needing a worker, a turn that does not exist or has ended."""
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise UnknownTurn(handle.id) from None
        raise
    if desc.status != WorkflowExecutionStatus.RUNNING:
        state = desc.status.name.lower() if desc.status else "ended"
        raise NothingPending(f"turn {handle.id} is {state}: no call awaits approval")
    return desc


@dataclass(frozen=True)
class TurnRow:
    workflow_id: str
    status: str
    outcome: str
    customer_id: str
    model: str
    started: datetime
    tools: list[str]
    question: str
    agent: str = ""
    fingerprint: str = ""
    version: str = ""
    """The worker version it runs (ran) on, `DEPLOYMENT:BUILD_ID` (empty: unversioned)."""
    schedule: str = ""
    """The schedule that started it (empty: none)."""
    tenant: str = ""
    """The tenant of who asked (`AgentTenant`; empty: a turn from before tenants)."""


VERSION = deployments.VERSION


async def version_of(handle: WorkflowHandle) -> str:
    """The worker version a turn runs (ran) on (empty: unversioned)."""
    return (await handle.describe()).typed_search_attributes.get(VERSION) or ""


async def find_turns(
    client: Client,
    *,
    agent: str | None = None,
    customer_id: str | None = None,
    outcome: str | None = None,
    awaiting_approval: bool = False,
    limit: int = 20,
    schedule: str | None = None,
    tenant: str | None = None,
    user: str | None = None,
    since: datetime | None = None,
) -> list[TurnRow]:
    """Recent turns, newest first, filtered by the agent's search attributes."""
    if not await registered.available(client):
        raise AgentClientError(
            "the agent's search attributes are not registered on this namespace, so turns "
            f"cannot be filtered; register them with: {search.create_command()}"
        )
    # A turn that continued as new is one turn: its earlier runs are not listed.
    clauses = ["WorkflowType = 'AgentTurn'", "ExecutionStatus != 'ContinuedAsNew'"]
    if agent:
        clauses.append(f"{search.AGENT.name} = '{_quoted(agent)}'")
    if customer_id:
        clauses.append(f"{search.CUSTOMER.name} = '{_quoted(customer_id)}'")
    if outcome:
        clauses.append(f"{search.OUTCOME.name} = '{_quoted(outcome)}'")
    if awaiting_approval:
        clauses.append(f"{search.STATUS.name} = '{search.AWAITING_APPROVAL}'")
    if schedule:
        clauses.append(f"{search.SCHEDULE.name} = '{_quoted(schedule)}'")
    if tenant:
        clauses.append(f"{search.TENANT.name} = '{_quoted(tenant)}'")
    if user:  # a principal's user is its turn's customer
        clauses.append(f"{search.CUSTOMER.name} = '{_quoted(user)}'")
    if since is not None:
        at = (since if since.tzinfo else since.replace(tzinfo=timezone.utc)).astimezone(
            timezone.utc
        )
        clauses.append(f"StartTime >= '{at.strftime('%Y-%m-%dT%H:%M:%S')}Z'")
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
                model=attrs.get(search.MODEL) or "",
                started=wf.start_time,
                tools=list(attrs.get(search.TOOLS) or []),
                question="",
                agent=attrs.get(search.AGENT) or "",
                fingerprint=attrs.get(search.FINGERPRINT) or "",
                version=attrs.get(VERSION) or "",
                schedule=attrs.get(search.SCHEDULE) or "",
                tenant=attrs.get(search.TENANT) or "",
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
    except Exception as e:  # one turn this client cannot decode (another key, a payload
        # store it does not see) leaves its question out, not the whole listing
        return f"(unreadable here: {str(e)[:80]})"


UNPROCESSED = "UnprocessedUpdate"
"""The server's failure type for an update a worker took and let go unanswered (a
workflow task that completed without it, which a busy worker can do): nothing of it
ran, so it is sent again."""
UNPROCESSED_RETRIES = (0.2, 0.5, 1.0, 2.0, 4.0, 8.0)
"""The waits before an update is sent again: unprocessed, or refused because no worker
had polled its task queue yet (one starting, a server just restarted)."""


async def _update(send: Callable[[str], Awaitable[T]], update_id: str = "") -> T:
    """`send(update_id)`'s result, or its refusal (the validator's words) as an
    AgentClientError. An update the worker let go unprocessed is sent again, with
    the same id: the server runs an update id at most once. No `update_id`: a new one."""
    update_id = update_id or str(uuid.uuid4())
    for delay in (*UNPROCESSED_RETRIES, None):
        try:
            return await send(update_id)
        except WorkflowUpdateFailedError as e:
            cause = e.cause
            if isinstance(cause, ApplicationError) and cause.type == UNPROCESSED and delay:
                await asyncio.sleep(delay)
                continue
            message = cause.message if isinstance(cause, ApplicationError) else str(cause or e)
            refused = _REFUSALS.get(cause.type) if isinstance(cause, ApplicationError) else None
            if refused is not None:
                raise refused(message) from None
            raise AgentClientError(message) from None
        except RPCError as e:
            if e.status == RPCStatusCode.RESOURCE_EXHAUSTED:  # too many requests in flight
                raise AgentClientError(f"busy ({e.message}): try again in a moment") from None
            if _no_worker(e):
                # A worker starting (or the server just restarted) has not polled yet.
                if delay:
                    await asyncio.sleep(delay)
                    continue
                raise NoWorker(
                    "no worker serves this task queue right now: start one "
                    f"({worker_command()}), then try again"
                ) from None
            raise
    raise AssertionError("unreachable")


_REFUSALS: dict[str | None, type[AgentClientError]] = {
    e.__name__: e for e in (NothingPending, NotWaiting, InvalidEvent, InvalidAnswer, NotAnApprover)
}
"""The turn's refusals of an update (its validators' words), as the client's errors."""


async def wake(client: Client, workflow_id: str, by: str) -> Woke:
    """End the turn's waits early (`wait`, `wait_for_event`); `NotWaiting` if none runs."""
    return await _taken_or_kept(client, workflow_id, names.WAKE, names.WAKE_LATER, Wake(by=by))


async def send_event(client: Client, workflow_id: str, event: WorldEvent) -> Woke:
    """Deliver an event to a turn that waits for one of its name (`wait_for_event`):
    checked here first (`InvalidEvent`), then by the turn (`NotWaiting`), so a refused
    event is never recorded. Data over the payload store's threshold goes there."""
    checked_event(event)
    return await _taken_or_kept(client, workflow_id, names.EVENT, names.EVENT_LATER, event)


async def _taken_or_kept(
    client: Client, workflow_id: str, update: str, signal: str, arg: Wake | WorldEvent
) -> Woke:
    """`update` with `arg`, as a live worker of the turn takes it (and may refuse it).
    While none runs (all were SIGKILLed, say), `arg` is sent as `signal` instead, which
    the server keeps in the turn's history: the turn applies it when a worker runs it
    again, if it still waits for it (`later`). So an event never waits for minutes, as a
    decision does not (`decide`); whichever of an update left behind and the signal the
    turn reads first applies, and the other finds nothing waiting."""
    handle = client.get_workflow_handle(workflow_id)
    desc = await _still_running(handle)
    try:
        version = desc.typed_search_attributes.get(VERSION) or ""
        alive = _build(version) in await live_builds(client, desc.task_queue)
    except RPCError:  # a server that lists no pollers (the time-skipping test server)
        alive = True
    if alive:
        sent = asyncio.ensure_future(
            _update(lambda u: handle.execute_update(update, arg, id=u, result_type=Woke))
        )
        try:
            await asyncio.wait({sent}, timeout=DECIDE_WAIT_S)
            if sent.done() and not isinstance(sent.exception(), NoWorker):
                return cast(Woke, sent.result())
        finally:
            if not sent.done():
                sent.cancel()
                await asyncio.gather(sent, return_exceptions=True)
    await handle.signal(signal, arg)
    return Woke(calls=[], tools=[], later=True)


async def _still_running(handle: WorkflowHandle) -> WorkflowExecutionDescription:
    """The turn as the server describes it, or why nothing of it can wait: no such
    turn, or it ended."""
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise UnknownTurn(handle.id) from None
        raise
    if desc.status != WorkflowExecutionStatus.RUNNING:
        state = desc.status.name.lower() if desc.status else "ended"
        raise NotWaiting(f"turn {handle.id} is {state}: it waits for nothing")
    return desc


def _no_worker(e: RPCError) -> bool:
    """The server refused an update because no worker has polled the task queue lately."""
    return e.status == RPCStatusCode.FAILED_PRECONDITION and "no poller" in e.message


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _first_error(e: ValueError) -> str:
    errors = getattr(e, "errors", None)
    if callable(errors):
        return "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in errors())
    return str(e)


@dataclass(frozen=True)
class LostTask:
    """A running turn's workflow task that its workers lost (crashed, or failed it) in a
    row: Temporal gives it out again, later after each loss past the third (5 s, 10 s,
    20 s ... up to 10 minutes), so the turn stands still meanwhile."""

    attempt: int
    """The attempt Temporal gives out now (2: lost once)."""
    since: datetime | None
    """When the first of the lost attempts was given out."""
    first: str
    """How the first was lost, as the history has it (later losses leave no event)."""

    def line(self) -> str:
        """`workflow task: lost 6 times in a row since 2026-12-08 14:02:11 UTC (the first:
        failed, ...); Temporal gives it out again later after each, up to 10 minutes
        apart: the workers' logs say why`."""
        lost = self.attempt - 1
        since = f" since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since else ""
        first = f" (the first: {self.first})" if self.first else ""
        return (
            f"workflow task: lost {lost} time{'s' if lost != 1 else ''} in a row{since}{first}; "
            "Temporal gives it out again later after each, up to 10 minutes apart: the "
            "workers' logs say why"
        )


LOST_MESSAGE_CHARS = 160
"""How much of a failed workflow task's message `LostTask.first` keeps."""


async def lost_task(
    handle: WorkflowHandle, described: WorkflowExecutionDescription | None = None
) -> LostTask | None:
    """The turn's workflow task lost in a row (None: it is not, or the turn does not
    run). `described`: the turn's description, if just had. Reads the server only: a
    turn whose task is lost has no worker to ask."""
    described = described if described is not None else await handle.describe()
    raw = described.raw_description
    pending = raw.pending_workflow_task
    if not raw.HasField("pending_workflow_task") or pending.attempt < 2:
        return None
    since = pending.original_scheduled_time
    return LostTask(
        attempt=pending.attempt,
        since=since.ToDatetime(timezone.utc) if since.seconds else None,
        first=await _first_loss(handle),
    )


async def _first_loss(handle: WorkflowHandle) -> str:
    """The newest workflow task failure or timeout in the history, in a few words: the
    first loss of the task now lost in a row (its later losses write no event)."""
    client: Client = handle._client  # the handle's own: the turn's namespace
    request = GetWorkflowExecutionHistoryReverseRequest(
        namespace=client.namespace,
        execution=ExecutionRef(workflow_id=handle.id),
        maximum_page_size=100,
    )
    try:
        page = await client.workflow_service.get_workflow_execution_history_reverse(request)
    except RPCError:
        return ""
    return next(filter(None, map(loss_of, page.history.events)), "")


def loss_of(event: HistoryEvent) -> str:
    """A workflow task's failure or timeout, in a few words on one line a terminal shows
    as it is (no control sequence of the failure's message); empty for other events."""
    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
        return "timed out: a worker died holding it, or took longer than its timeout"
    if event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
        return ""
    failed = event.workflow_task_failed_event_attributes
    cause = WorkflowTaskFailedCause.Name(failed.cause)
    cause = cause.removeprefix("WORKFLOW_TASK_FAILED_CAUSE_").lower().replace("_", " ")
    shown = "".join(c if c.isprintable() else " " for c in failed.failure.message)
    message = " ".join(shown.split())
    if len(message) > LOST_MESSAGE_CHARS:
        message = message[: LOST_MESSAGE_CHARS - 1] + "…"
    return f"failed, {cause}: {message}" if message else f"failed, {cause}"
