"""The way in from your own code: ask an agent, follow its turns, decide its calls.

    from durable_agent import AgentClient

    agents = await AgentClient.connect()        # TEMPORAL_* / temporal.toml, else the folder's
    result = await agents.ask("Has order 123456 shipped?", agent="support", customer="c-42")
    result.answer, result.outcome, result.usage.cost_usd, result.workflow_id

    turn = await agents.start("Return order 123456", customer="c-42", request_id=key)
    async for item in turn.events():            # steps, the answer as it is written, done
        print(item.offset, item.event)
    for waiting in await turn.pending():
        await turn.approve(waiting.call.id, by="alice")
    result = await turn.result()

    chat = agents.chat(agent="support", customer="c-42")
    first = await chat.send("Has order 123456 shipped?")
    later = agents.conversation(chat.id)        # picked up again by its id, anywhere

    await agents.find(customer="c-42", awaiting_approval=True)
    await agents.schedules.add("weekly", "Summarise last week's tickets", agent="support",
                               cron="0 9 * * MON", time_zone="Europe/Berlin")

Every turn is a workflow on the server: a handle is only its id, so a process that
crashed, or another one, picks a turn up by its id (`agents.turn(workflow_id)`; as a
customer, `await agents.turn_for(workflow_id, customer=...)`, which finds only theirs).
A `request_id` makes starting idempotent: asking again with the same one (after a
crash, a retried HTTP request) gets the same turn, never a second one; the same id
with another request is a `RequestConflict`.

Every error is an `AgentClientError` (`durable_agent.errors`) whose one-line message
says what to do: `ServerUnavailable`, `UnknownTurn`, `NothingPending`, `NoWorker`,
`WorkerNeeded`, `RequestConflict`, `InvalidContext`, ...; what the SDK or the server
raise below is said that way too (`_plainly`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, NamedTuple
from urllib.parse import quote

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import (
    ApplicationError,
    TerminatedError,
    WorkflowAlreadyStartedError,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_agent import answers, fallback
from durable_agent import attachments as attached
from durable_agent.agents import Agent
from durable_agent.approval import ApprovalResult, may_decide
from durable_agent.audit import MAX_AUDIT_TURNS, AuditRow, rows_of
from durable_agent.chat import (
    ChatMessage,
    ConversationInput,
    ConversationOutput,
    ConversationState,
    Memory,
)
from durable_agent.elicitation import Question
from durable_agent.errors import (
    AgentClientError,
    CannotFork,
    InvalidContext,
    InvalidOutputType,
    InvalidSettings,
    NoWorker,
    OutputMismatch,
    PayloadUnavailable,
    RequestConflict,
    ServerLost,
    TurnTaskFailing,
    UnknownTurn,
)
from durable_agent.memory import MemoryAccess
from durable_agent.model_settings import ModelSettings
from durable_agent.outputs import loaded_type, output_spec
from durable_agent.principal import DEFAULT_TENANT, Principal, of_customer
from durable_agent.rewind import Origin
from durable_agent.runtime import attachments as stored_attachments
from durable_agent.runtime import erase as erasing
from durable_agent.runtime import rewind, secret_refs, server, storage, turns
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.erase import Erased
from durable_agent.runtime.settings import TASK_QUEUE, client_command, worker_command
from durable_agent.runtime.storage import STORE_ENV
from durable_agent.runtime.streams import turn_events
from durable_agent.schedules import Schedules
from durable_agent.secret import SECRETS_KEY
from durable_agent.secret import split as split_secrets
from durable_agent.stream import TurnEvent
from durable_agent.types import (
    DEFAULT_CUSTOMER,
    Exchange,
    Outcome,
    OutputSpec,
    PendingApproval,
    Step,
    StepKind,
    TurnInput,
    TurnLimits,
    TurnOutput,
    TurnProgress,
    Usage,
    check_context,
)
from durable_agent.waits import Woke, WorldEvent
from durable_agent.workflows import names, search

log = logging.getLogger("durable_agent.client")

AUDIT_QUERY_S = 5.0
"""How long `audit` waits for a worker to answer for a running turn's steps."""

PendingCall = turns.Waiting
PendingQuestion = turns.Asked
Answered = turns.Answered
"""A call awaiting consent, with the turn it belongs to (`workflow_id`, `approval`)."""
TurnSummary = turns.TurnRow
"""One row of `find`: a turn's id, status, outcome, agent, customer and question."""

__all__ = [
    "AgentClient",
    "ConversationHandle",
    "PendingCall",
    "PendingQuestion",
    "Answered",
    "Streamed",
    "TurnHandle",
    "TurnResult",
    "TurnSummary",
]


class TurnResult(TurnOutput):
    """A finished turn: its answer and outcome, the steps it took, its usage and cost,
    the agent that answered (and its fingerprint), and the turn's workflow id. A typed
    turn's `output` is its value: an object of the `output_type` the turn was started
    with, or of its agent's own type when the caller gave the agent (`ask(agent=clinic)`)
    or this process has loaded the module that defines it (`output_type`, as the turn
    records it); else (no type known here) the value as JSON."""

    workflow_id: str

    @property
    def answered(self) -> bool:
        """The model answered (no cap, refusal, model failure or unknown agent)."""
        return self.outcome is Outcome.ANSWERED


class Streamed(NamedTuple):
    """One event of a turn's stream, and its offset: a reader that comes back with
    `offset + 1` (`events(from_offset=…)`) gets exactly what it had not read."""

    offset: int
    event: TurnEvent


MAX_OFFSET = 2**53
"""The largest stream offset a reader may resume from (far beyond any turn's events)."""
NO_WORKER_AFTER = 10.0
"""`ask`: seconds a turn may wait for a worker before the client checks that one
serves its task queue at all."""


class AgentClient:
    """Starts, follows and decides turns of the agents that workers serve on one task
    queue. Built on any Temporal client (`AgentClient(client)`: it gets the project's
    data converter, keeping the client's own codec), or `await AgentClient.connect()`."""

    def __init__(
        self, client: Client, *, task_queue: str = TASK_QUEUE, ui_url: str | None = None
    ) -> None:
        self.temporal = _with_our_converter(client)
        """The Temporal client underneath, for anything this one does not do."""
        self.task_queue = task_queue
        self.ui_url = ui_url
        """The Web UI's base URL, when known (`turn_url`)."""

    @classmethod
    async def connect(
        cls,
        address: str | None = None,
        *,
        namespace: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
        task_queue: str = TASK_QUEUE,
    ) -> AgentClient:
        """Connect as the commands do: the TEMPORAL_* variables or a `temporal.toml`
        profile, overridden by what is given here; with no address anywhere, the
        folder's own server, as the state folder records it (this never starts one: a
        worker does). `ServerUnavailable` when none can be reached."""
        settings = server.connect_settings()
        given = {"target_host": address, "namespace": namespace, "api_key": api_key, "tls": tls}
        settings.update({k: v for k, v in given.items() if v is not None})
        if "target_host" not in settings:
            conn = await server.connect()
            return cls(conn.client, task_queue=task_queue, ui_url=conn.ui_url)
        client = await server.open_client(settings)
        ui_url = await server.named_ui_url(client, settings["target_host"])
        return cls(client, task_queue=task_queue, ui_url=ui_url)

    # -- turns --------------------------------------------------------------------------

    async def ask(
        self,
        question: str,
        *,
        agent: str | Agent = "",
        customer: str = DEFAULT_CUSTOMER,
        model: str | Sequence[str] = "",
        limits: TurnLimits | None = None,
        request_id: str = "",
        no_worker_after: float | None = NO_WORKER_AFTER,
        output_type: Any = None,
        context: dict[str, Any] | None = None,
        settings: ModelSettings | Mapping[str, Any] | None = None,
        principal: Principal | None = None,
        secret: Sequence[str] = (),
        attachments: Sequence[attached.Source] = (),
    ) -> TurnResult:
        """Ask once and wait for the answer. `NoWorker` when the turn is still waiting
        after `no_worker_after` seconds and no worker serves the task queue (the turn
        stays: it runs once one starts; ask again with the same `request_id`).
        `output_type`: the answer is a value of this type (`result.output`), see `start`;
        `agent`: a name, or the `Agent` itself, whose own type `result.output` is then."""
        turn = await self.start(
            question,
            agent=agent,
            customer=customer,
            model=model,
            limits=limits,
            request_id=request_id,
            output_type=output_type,
            context=context,
            settings=settings,
            principal=principal,
            secret=secret,
            attachments=attachments,
        )
        return await turn.result(no_worker_after=no_worker_after)

    async def start(
        self,
        question: str,
        *,
        agent: str | Agent = "",
        customer: str = DEFAULT_CUSTOMER,
        model: str | Sequence[str] = "",
        limits: TurnLimits | None = None,
        request_id: str = "",
        stream: bool = False,
        output_type: Any = None,
        context: dict[str, Any] | None = None,
        settings: ModelSettings | Mapping[str, Any] | None = None,
        principal: Principal | None = None,
        secret: Sequence[str] = (),
        attachments: Sequence[attached.Source] = (),
    ) -> TurnHandle:
        """Start a turn and return at once. `agent`: the served agent's name (empty:
        the worker's first), or its definition (`Agent`: its name is asked, and a value
        of its own `output_type` is given as an object of it, without naming the type
        again); `customer`: who asks, trusted (tools get it); `model`: a
        model spec, or several in order, the next asked when one fails for good
        (empty: the agent's); `limits`: exactly these caps (None: the agent's);
        `stream`: publish the model's text as it writes (`events`); `output_type`: the
        turn ends with a value of this type instead of text (a pydantic model,
        dataclass, TypedDict, list or scalar type; None: the agent's own, if any), which
        `result().output` gives as an object of it; `context`: a JSON object about who
        asks (name, plan, locale, tenant, date) that tools read as `ctx.context` and
        instructions functions get (`InvalidContext` when it is not one, holds NaN or
        Infinity, is nested over 32 deep or larger than 16 KB); `settings`: how its
        models are asked (`ModelSettings`, or a dict of its fields), over the agent's own
        field by field (`InvalidSettings` when out of bounds); `principal`: who asks, from
        your own authentication (`durable_agent.Principal`: tenant, user, roles), instead
        of `customer` (which is the user of the default tenant): tools read it as
        `ctx.principal`, and the turn is found by it (`find(tenant=, user=)`);
        `secret`: the context's keys whose values are secrets, as a `Secret` value is
        (`runtime/secret_refs.py`): stored encrypted in the payload store, given to tools
        and instructions functions inside their activities only, never written in the
        turn's history (`InvalidSecret` without AGENT_ENCRYPTION_KEY); `attachments`:
        files and images of the question, each bytes, a path or (name, bytes), stored in
        the payload store before the turn starts (`AttachmentRefused`, and no turn, for a
        file whose bytes are not what its name says, or over the agent's limits: those of
        the `Agent` given, else `AttachmentLimits()`).

        With `request_id` (an Idempotency-Key), a turn already started with it for the
        same request (question, context, agent, model, settings, limits and output type)
        is the one returned; one started for another request is a `RequestConflict`. A
        customer's request ids are theirs alone: another customer's same key is
        another turn (`request_workflow_id`)."""
        context, secrets = split_secrets(context, secret)
        turn = self.turn_input(
            question,
            agent=agent,
            customer=customer,
            model=model,
            limits=limits,
            stream=stream,
            output_type=output_type,
            context=context,
            settings=settings,
            principal=principal,
        )
        taken = agent.attachments if isinstance(agent, Agent) else None
        turn, workflow_id = await self.attach(turn, attachments, taken, request_id=request_id)
        turn, workflow_id = await self.seal(
            turn, secrets, workflow_id=workflow_id, request_id=request_id
        )
        handle = await self.start_turn(turn, request_id=request_id, workflow_id=workflow_id)
        handle.output_type = output_type if output_type is not None else _agent_of(agent)[1]
        return handle

    def turn_input(
        self,
        question: str,
        *,
        agent: str | Agent = "",
        customer: str = DEFAULT_CUSTOMER,
        model: str | Sequence[str] = "",
        limits: TurnLimits | None = None,
        stream: bool = False,
        output_type: Any = None,
        context: dict[str, Any] | None = None,
        settings: ModelSettings | Mapping[str, Any] | None = None,
        principal: Principal | None = None,
    ) -> TurnInput:
        """The `TurnInput` that `start` sends for these arguments (a schedule's turns
        too), checked as `start` checks them: an `AgentClientError` in one line."""
        context = checked_context(context)
        settings = checked_settings(settings)
        name, _ = _agent_of(agent)
        try:
            return TurnInput(
                question=question,
                customer_id=principal.user if principal is not None else customer,
                agent=name,
                model=_models(model),
                limits=limits,
                stream=stream,
                output=_output_spec(output_type),
                context=context,
                settings=settings,
                principal=principal,
            )
        except ValidationError as e:
            raise AgentClientError(_first_error(e)) from None

    async def seal(
        self,
        turn: TurnInput,
        secrets: Mapping[str, Any],
        *,
        workflow_id: str = "",
        request_id: str = "",
    ) -> tuple[TurnInput, str]:
        """`turn` with `secrets` (name: value, `secret.split`'s) stored encrypted as
        payloads of the turn and its context holding only their reference (`start`'s
        `secret`), and the id it must start with (`start_turn(workflow_id=)`): the one
        given, else its request's or a new one. No secrets: both as they are.
        `InvalidSecret` without AGENT_ENCRYPTION_KEY, before anything is stored."""
        if not secrets:
            return turn, workflow_id
        # Stored under the turn: its id is known before it starts.
        workflow_id = workflow_id or await self._new_turn_id(turn, request_id)
        sealed = await self._sealed(turn.context, turn.customer_id, secrets, workflow_id)
        return turn.model_copy(update={"context": sealed}), workflow_id

    async def _sealed(
        self, context: dict[str, Any], customer: str, secrets: Mapping[str, Any], workflow_id: str
    ) -> dict[str, Any]:
        """`context` with `secrets` stored under `workflow_id`, by reference."""
        ref = await secret_refs.sealed(
            secrets,
            customer_id=customer,
            namespace=self.temporal.namespace,
            workflow_id=workflow_id,
        )
        return checked_context({**context, SECRETS_KEY: ref})

    async def start_turn(
        self, turn: TurnInput, *, request_id: str = "", workflow_id: str = ""
    ) -> TurnHandle:
        """`start`, for a `TurnInput` built by the caller. `workflow_id`: the turn's id
        of the caller's own naming (unique in the namespace), as idempotent as a
        `request_id`'s, and as checked (`RequestConflict`)."""
        if turn.output is not None:
            try:
                output_spec(turn.output)  # refused here, not by the worker mid-turn
            except TypeError as e:
                raise InvalidOutputType(str(e)) from None
        if request_id and not workflow_id:
            workflow_id = turns.turn_id(turns.owner_part(turn.asker), request_id)
        with _plainly(workflow_id):
            try:
                handle = await turns.start_turn(self.temporal, turn, self.task_queue, workflow_id)
                found = TurnHandle(self, handle.id, handle)
            except WorkflowAlreadyStartedError:  # that request's turn has ended: it is the one
                found = self.turn(workflow_id)
                found.started = False
            # A start with an id that names a turn already there returns that turn: it
            # answers this request only if it was started for this request.
            if workflow_id and not await turns.same_request(found.temporal, turn):
                raise RequestConflict(
                    f"{_named(request_id, workflow_id)} was used for another request (turn "
                    f"{workflow_id}: another question, context, agent, model, settings, limits or "
                    "output type); send that request again to get its turn, or use a new "
                    "request id for this one"
                )
        return found

    async def attach(
        self,
        turn: TurnInput,
        attachments: Sequence[attached.Source],
        limits: attached.AttachmentLimits | None = None,
        *,
        request_id: str = "",
    ) -> tuple[TurnInput, str]:
        """`turn` with these files (`start`'s `attachments`), and the id it must start
        with (`start_turn(workflow_id=)`): each file is read, sniffed and checked against
        `limits` (None: `AttachmentLimits()`), then stored as a payload of that turn.
        `AttachmentRefused` before anything is stored. No files: `turn` as it is, and
        no id (`start_turn` draws one)."""
        if not attachments:
            return turn, ""
        files = _files(attachments, limits or attached.AttachmentLimits())
        with _plainly():
            workflow_id = await self._new_turn_id(turn, request_id)
            stored = await stored_attachments.store(self.temporal, workflow_id, files)
        return turn.model_copy(update={"attachments": stored}), workflow_id

    async def _new_turn_id(self, turn: TurnInput, request_id: str) -> str:
        """The id a turn will have, known before it starts (its attachments and secrets
        are stored as its payloads), as `start_turn` names it: its request's, or a new
        one no turn has."""
        owner = turns.owner_part(turn.asker)
        if request_id:
            return turns.turn_id(owner, request_id)
        for _ in range(turns.RANDOM_ID_DRAWS):
            workflow_id = turns.turn_id(owner)
            try:
                await self.temporal.get_workflow_handle(workflow_id).describe()
            except RPCError as e:
                if e.status == RPCStatusCode.NOT_FOUND:
                    return workflow_id
                raise
        return turns.turn_id(owner)

    def turn(self, workflow_id: str, output_type: Any = None) -> TurnHandle:
        """A turn started earlier (by this process or any other), by its workflow id;
        `output_type`: what `start` took (a type, an `OutputSpec`), for `result().output`
        as an object of that type (an `OutputSpec`'s value stays JSON). Whoever asked
        it: a service that serves many customers uses `turn_for`."""
        _output_spec(output_type)  # a type pydantic cannot take is refused now, in one line
        handle = TurnHandle(self, workflow_id)
        handle.output_type = output_type
        return handle

    async def turn_for(
        self,
        workflow_id: str,
        *,
        customer: str | None = None,
        principal: Principal | None = None,
        output_type: Any = None,
    ) -> TurnHandle:
        """`turn`, for `customer` (or `principal`) only: the turn if it was started for
        them (who asks, as its input records it: tenant and user, which its tools act
        for), else `UnknownTurn`, the same error as for a turn that does not exist, so
        that no one learns of another's turns. What a service calls with an id its user
        sent, before reading or deciding."""
        if (customer is None) == (principal is None):
            raise AgentClientError("turn_for: name the customer or the principal, one of them")
        whom = _whom_or_none(customer, principal)
        if whom is None:  # a name no person can have: no turn is theirs
            raise UnknownTurn(workflow_id)
        with _plainly(workflow_id):
            opening = await turns.started_with(
                self.temporal.get_workflow_handle(workflow_id), "AgentTurn", TurnInput
            )
        if opening is None or not opening.asker.same_person(whom):
            raise UnknownTurn(workflow_id)
        return self.turn(workflow_id, output_type)

    async def turn_to_decide(
        self, workflow_id: str, *, principal: Principal, output_type: Any = None
    ) -> TurnHandle:
        """`turn_for`, for a decider too: the turn if `principal` asked it, or if a call
        of it awaits a decision that the agent's approvers give them (`role:NAME` of the
        turn's tenant; `ApprovalPolicy.approvers`), as the turn recorded who asked and
        whom its waiting calls need. Anyone else, a lead of another tenant included,
        gets `UnknownTurn`, as for a turn that does not exist. What a service calls
        before a support lead decides on a customer's turn."""
        handle = self.temporal.get_workflow_handle(workflow_id)
        with _plainly(workflow_id):
            opening = await turns.started_with(handle, "AgentTurn", TurnInput)
        if opening is None:
            raise UnknownTurn(workflow_id)
        if opening.asker.same_person(principal):
            return self.turn(workflow_id, output_type)
        if opening.asker.tenant == principal.tenant:  # a role counts only in its tenant
            with _plainly(workflow_id):
                waiting = await turns.waiting_of(handle)
            if any(_decides(p, opening.asker, principal) for p in waiting):
                return self.turn(workflow_id, output_type)
        raise UnknownTurn(workflow_id)

    async def pending_for(self, principal: Principal) -> list[PendingCall]:
        """The calls awaiting consent that `principal` sees, oldest first: those of the
        turns they asked, and those of their tenant's turns that the agent's approvers
        give them to decide (`role:NAME`). Each is checked against what its turn
        recorded (who asked, in its input; whom the call needs, in its pending list),
        never against an id; `asker` says who asked. A support lead's queue."""
        with _plainly():
            waiting = await turns.pending(self.temporal, None, principal.tenant)
        askers: dict[str, Principal | None] = {}
        seen: list[PendingCall] = []
        for w in waiting:
            if w.workflow_id not in askers:
                handle = self.temporal.get_workflow_handle(w.workflow_id)
                with _plainly(w.workflow_id):
                    opening = await turns.started_with(handle, "AgentTurn", TurnInput)
                askers[w.workflow_id] = opening.asker if opening is not None else None
            asker = askers[w.workflow_id]
            if asker is not None and (
                asker.same_person(principal) or _decides(w.approval, asker, principal)
            ):
                seen.append(dataclasses.replace(w, asker=asker))
        return seen

    async def pending(
        self, customer: str | None = None, *, tenant: str | None = None
    ) -> list[PendingCall]:
        """Every call awaiting consent, oldest first (of one customer's turns, and one
        tenant's, if given: a principal's user is its turns' customer)."""
        with _plainly():
            return await turns.pending(self.temporal, customer, tenant)

    async def questions(
        self, customer: str | None = None, *, tenant: str | None = None
    ) -> list[PendingQuestion]:
        """Every MCP server's question awaiting a person's answer, oldest first (of one
        customer's turns, and one tenant's, if given); answer with `TurnHandle.answer`."""
        with _plainly():
            return await turns.questions(self.temporal, customer, tenant)

    async def find(
        self,
        *,
        agent: str | None = None,
        customer: str | None = None,
        outcome: Outcome | str | None = None,
        awaiting_approval: bool = False,
        limit: int = 20,
        schedule: str | None = None,
        tenant: str | None = None,
        user: str | None = None,
    ) -> list[TurnSummary]:
        """Recent turns, newest first: by agent, customer, outcome, the schedule that
        started them, who asked (`tenant`, `user`: a `Principal`'s; a customer named
        alone is a user of the tenant `default`), or those waiting for a decision (the
        turns' search attributes; `client.py list`)."""
        with _plainly():
            return await turns.find_turns(
                self.temporal,
                agent=agent,
                customer_id=customer,
                outcome=_outcome(outcome),
                awaiting_approval=awaiting_approval,
                limit=limit,
                schedule=schedule,
                tenant=tenant,
                user=user,
            )

    async def audit(
        self,
        *,
        tenant: str | None = None,
        user: str | None = None,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[AuditRow]:
        """Every decision on a write in the newest `limit` turns (of `tenant`, `user`,
        started `since`), oldest first: who asked, who decided (name, principal, front
        end, time), the call's tool, arguments and sha256, and its result
        (`durable_agent.audit`; `durable-agent audit`). A running turn no worker answers
        for in time is left out, and said in the log."""
        if isinstance(limit, bool) or not 1 <= limit <= MAX_AUDIT_TURNS:
            raise AgentClientError(f"limit: 1 to {MAX_AUDIT_TURNS:,} turns, not {limit!r}")
        with _plainly():
            found = await turns.find_turns(
                self.temporal, tenant=tenant, user=user, since=since, limit=limit
            )
        rows: list[AuditRow] = []
        for turn in reversed(found):
            steps = await self._steps_of(turn)
            rows += rows_of(
                turn.workflow_id, turn.tenant or DEFAULT_TENANT, turn.customer_id, steps
            )
        return sorted(rows, key=lambda r: r.at)

    async def _steps_of(self, found: TurnSummary) -> list[Step]:
        handle = self.turn(found.workflow_id)
        try:
            if found.status == search.DONE:
                return (await handle.result()).steps
            return (await handle.progress(timeout=AUDIT_QUERY_S)).steps
        except AgentClientError as e:
            log.warning("audit: turn %s left out: %s", found.workflow_id, e)
            return []

    @functools.cached_property
    def schedules(self) -> Schedules:
        """The schedules that start this client's turns (`durable_agent.schedules`)."""
        return Schedules(self)

    @functools.cached_property
    def memory(self) -> MemoryAccess:
        """The customers' memories (`durable_agent.memory`), in this folder's store (the
        state folder's, which its workers share): list, export, forget. For another
        store, `durable_agent.memory.MemoryAccess(name=..., store=...)`. Its `forget`
        erases the turn that told the memory too, with `erase_turn=True` (`erase`)."""
        return MemoryAccess(erase=self.erase)

    async def erase(
        self,
        workflow_id: str,
        *,
        conversation: bool = False,
        said: Callable[[Erased], None] | None = None,
    ) -> list[Erased]:
        """Erase the turn `workflow_id` from the server and the payload store: every run
        of it, of its sub-agents and of its forks (`rerun`, `replay`) is deleted (a
        running one terminated first), and their stored payloads (`runtime/erase.py`).
        A turn of a conversation is erased only with its whole conversation, with
        `conversation` (its workflow, all its turns and theirs): its record and later
        turns hold the turn's words too. Erases only what it is named; who may erase is
        the caller's to decide (an operator's act, as forgetting a memory is). Each run
        erased, in order (`said` hears of each as it goes). `UnknownTurn`; `CannotErase`
        (nothing erased)."""
        with _plainly(workflow_id):
            planned = await erasing.plan(self.temporal, workflow_id, conversation=conversation)
            return await erasing.carry_out(self.temporal, planned, said=said)

    def turn_url(self, workflow_id: str) -> str | None:
        """The turn's page in the Web UI of the server this client uses, when its address
        is known (`ui_url`; `runtime.server.named_ui_url`), else None."""
        if not self.ui_url:
            return None
        namespace, workflow = (quote(p, safe="") for p in (self.temporal.namespace, workflow_id))
        return f"{self.ui_url}/namespaces/{namespace}/workflows/{workflow}"

    async def workers(self) -> turns.Workers:
        """Who serves the task queue right now, as Temporal judges it."""
        with _plainly():
            return await turns.workers(self.temporal, self.task_queue)

    async def rerun(
        self,
        workflow_id: str,
        *,
        from_step: int,
        model: str = "",
        instructions: str = "",
        live_reads: bool = False,
        stream: bool = False,
        current: bool = False,
    ) -> TurnHandle:
        """Fork the finished turn `workflow_id` from its step `from_step` (the `[N]` of
        its steps): a new turn that starts from its conversation before that step and
        goes on with `model` and `instructions` (empty: the original's, the text its
        agent's instructions function gave it included). Calls the original ran answer
        with their recorded results: writes always (never done twice), reads unless
        `live_reads` (`durable_agent/rewind.py`). `UnknownTurn`; `CannotFork` for a turn
        still running or a step past its end (and, from `result()`, when the worker
        serves another version of the turn's agent).

        `current`: run the fork on the agent as the worker serves it now, after a fix to
        its prompt or tools: its instructions (a function's evaluated again, from the
        original's context) and tools, with no version check. The recorded results still
        answer the calls that repeat the original's; a recorded call whose tool was
        removed, or whose schema changed, is said in a `changed` step, and the fork stops
        (`CannotFork`, from `result()`) where its conversation holds one the agent can no
        longer take."""
        if isinstance(from_step, bool) or not isinstance(from_step, int) or from_step < 1:
            raise CannotFork(f"from_step: give a step of the turn (1, 2, ...), not {from_step!r}")
        with _plainly(workflow_id):
            handle = await rewind.start_fork(
                self.temporal,
                workflow_id,
                from_step,
                model=model,
                instructions=instructions,
                live_reads=live_reads,
                stream=stream,
                task_queue=self.task_queue,
                current=current,
            )
        return TurnHandle(self, handle.id, handle)

    async def replay(
        self,
        workflow_id: str,
        *,
        model: str = "",
        instructions: str = "",
        stream: bool = False,
        own_world: bool = False,
        replay_id: str = "",
        current: bool = False,
    ) -> TurnHandle:
        """Ask `model` the finished turn `workflow_id` again, from its question: while its
        calls repeat the recording's in order (same tool and arguments), they are answered
        from the record; from the first that does not, reads run live, and a write the
        original made is still never made again. Compare the two with
        `durable_agent.rewind.compare`. Errors as `rerun`'s; `current` as `rerun`'s.

        `own_world`: the replay's tools serve a world of its own, a fresh copy of the one
        the original ran in (an evaluation's episode database): from the first difference
        every call runs live there, writes too, and each tool is told how many of the
        recording's calls the replay was answered from the record before it
        (`ToolContext.followed`), so that world can apply them first. `replay_id`: the
        replay's workflow id, of your naming (default `<workflow id>-replay-<n>`); asking
        again finds the replay of that id, running or ended (then `started` is False)."""
        with _plainly(workflow_id):
            try:
                handle = await rewind.start_fork(
                    self.temporal,
                    workflow_id,
                    1,
                    model=model,
                    instructions=instructions,
                    stream=stream,
                    task_queue=self.task_queue,
                    replay=True,
                    own_world=own_world,
                    fork_id=replay_id,
                    current=current,
                )
            except WorkflowAlreadyStartedError:  # that replay has ended: it is the one
                found = self.turn(replay_id)
                found.started = False
                return found
        return TurnHandle(self, handle.id, handle)

    # -- conversations ------------------------------------------------------------------

    def chat(
        self,
        *,
        agent: str | Agent = "",
        customer: str = DEFAULT_CUSTOMER,
        model: str | Sequence[str] = "",
        limits: TurnLimits | None = None,
        memory: Memory | None = None,
        conversation_id: str = "",
        stream: bool = True,
        context: dict[str, Any] | None = None,
        settings: ModelSettings | Mapping[str, Any] | None = None,
        principal: Principal | None = None,
        secret: Sequence[str] = (),
        **options: Any,
    ) -> ConversationHandle:
        """A conversation: each `send` is a turn that sees the earlier exchanges. It
        starts with its first message; with `conversation_id` (a workflow id of your
        naming: make it `request_workflow_id`'s way, `turns.workflow_id("chat", customer,
        key)`, so that no two customers name one), one already running under that id is
        continued instead, if it is this customer's (else `RequestConflict`).
        `agent`, `context`, `settings`, `principal` and `secret`: every turn's (see
        `start`; the secrets are stored under the conversation, with its first message).
        `options`: the rest of `ConversationInput` (`idle_timeout`,
        `max_turns_per_run`, `max_cost`: a spending cap across its turns)."""
        context, secrets = split_secrets(context, secret)
        context = checked_context(context)
        settings = checked_settings(settings)
        agent, own = _agent_of(agent)
        try:
            template = ConversationInput(
                customer_id=principal.user if principal is not None else customer,
                principal=principal,
                agent=agent,
                model=_models(model),
                limits=limits,
                memory=memory or Memory(),
                stream=stream,
                context=context,
                settings=settings,
                **options,
            )
        except ValidationError as e:
            raise AgentClientError(_first_error(e)) from None
        handle = self.chat_from(template, conversation_id=conversation_id)
        handle.output_type = own
        handle._secrets = secrets
        return handle

    def chat_from(
        self, template: ConversationInput, *, conversation_id: str = ""
    ) -> ConversationHandle:
        """`chat`, for a `ConversationInput` built by the caller."""
        workflow_id = conversation_id or turns.chat_id(turns.owner_part(template.asker))
        handle = ConversationHandle(self, workflow_id, template)
        handle._named = bool(conversation_id)
        return handle

    def conversation(self, workflow_id: str) -> ConversationHandle:
        """A running conversation, by its workflow id: its next message is a turn of it.
        Whoever it is of: a service that serves many customers uses `conversation_for`."""
        return ConversationHandle(self, workflow_id, None)

    async def conversation_for(
        self, workflow_id: str, *, customer: str | None = None, principal: Principal | None = None
    ) -> ConversationHandle:
        """`conversation`, for `customer` (or `principal`) only: the conversation if it
        was started for them (its input says so), else `UnknownTurn` as for one that does
        not exist (`turn_for`). Its turns (`<id>-<n>`, from `start`) are theirs too."""
        if (customer is None) == (principal is None):
            raise AgentClientError("name the customer or the principal, one of them")
        whom = _whom_or_none(customer, principal)
        if whom is None:  # a name no person can have: no conversation is theirs
            raise UnknownTurn(workflow_id, "conversation")
        with _plainly(workflow_id, "conversation"):
            opening = await _conversation_input(self.temporal, workflow_id)
        if opening is None or not opening.asker.same_person(whom):
            raise UnknownTurn(workflow_id, "conversation")
        return self.conversation(workflow_id)


def _whom_or_none(customer: str | None, principal: Principal | None) -> Principal | None:
    """Who a lookup is for; None for a customer id no principal can have (a space at an
    end, an invisible character): the same answer as for a turn that does not exist."""
    if principal is not None:
        return principal
    try:
        return of_customer(customer or "")
    except ValueError:  # pydantic's ValidationError
        return None


def _decides(waiting: PendingApproval, asker: Principal, decider: Principal) -> bool:
    """Whether the approvers a waiting call names give `decider` its decision: a call
    that names none is decided by whoever reaches the turn, so it gives a stranger
    nothing."""
    return bool(waiting.approvers) and not may_decide(waiting.approvers, asker, decider)


async def _conversation_input(client: Client, workflow_id: str) -> ConversationInput | None:
    handle = client.get_workflow_handle(workflow_id)
    return await turns.started_with(handle, "Conversation", ConversationInput)


MAX_CONTEXT_DEPTH = 32
"""How deep a context's lists and objects may nest (its serializer stops near 250)."""


def checked_context(context: dict[str, Any] | None) -> dict[str, Any]:
    """A turn's context as it may travel; `InvalidContext`, one line, otherwise: not a
    JSON object, NaN or Infinity anywhere in it (JSON has neither: a tool or a model
    API would choke on them), nested over `MAX_CONTEXT_DEPTH`, or too large."""
    context = {} if context is None else context
    _walk_context(context)
    try:
        return check_context(context)
    except ValueError as e:
        raise InvalidContext(str(e)) from None


def _walk_context(context: Any) -> None:
    """Refuse a non-finite number or nesting too deep, looking without recursion (a
    context nested 100,000 deep is refused, not a RecursionError)."""
    found: list[tuple[Any, str, int]] = [(context, "context", 0)]
    while found:
        value, where, depth = found.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidContext(
                f"{where} is {value!r}, which JSON cannot hold: give a number, a string or null"
            )
        if isinstance(value, (dict, list, tuple)):
            if depth >= MAX_CONTEXT_DEPTH:
                raise InvalidContext(
                    f"the context nests lists and objects over {MAX_CONTEXT_DEPTH} deep: "
                    "give it flatter"
                )
            items = value.items() if isinstance(value, dict) else enumerate(value)
            found += [(v, f"{where}[{k!r}]", depth + 1) for k, v in items]


def checked_settings(
    settings: ModelSettings | Mapping[str, Any] | None,
) -> ModelSettings | None:
    """A turn's model settings as they may travel; `InvalidSettings`, one line, otherwise."""
    if settings is None or isinstance(settings, ModelSettings):
        return settings
    try:
        return ModelSettings.model_validate(settings)
    except ValidationError as e:
        raise InvalidSettings(_first_error(e)) from None


def _models(model: str | Sequence[str]) -> str:
    """One model spec, or several in order, as a turn carries them (`a,b`)."""
    try:
        return fallback.joined(fallback.check(model))
    except ValueError as e:
        raise AgentClientError(str(e)) from None


def _outcome(outcome: Outcome | str | None) -> str | None:
    if not outcome:
        return None
    try:
        return Outcome(outcome).value
    except ValueError:
        known = ", ".join(o.value for o in Outcome)
        raise AgentClientError(f"outcome {outcome!r}: give one of {known}") from None


def request_workflow_id(customer: str, request_id: str) -> str:
    """The workflow id of a customer's request: `turn-<customer>-<request id>`, both
    escaped (`runtime.turns.workflow_id`), so no two (customer, request id) pairs give
    one id: one customer's request id never reaches another's turn."""
    return turns.turn_id(customer, request_id)


def _named(request_id: str, workflow_id: str) -> str:
    """The request id a caller gave, or the workflow id they named, for a message."""
    return f"request id {request_id[:100]!r}" if request_id else f"workflow id {workflow_id!r}"


def _files(
    sources: Sequence[attached.Source], limits: attached.AttachmentLimits
) -> list[attached.File]:
    """The files of a question, read and checked before anything is stored or started."""
    limits.check_count(len(sources))
    return [attached.read(s, limits) for s in sources]


def _agent_of(agent: str | Agent) -> tuple[str, Any]:
    """The name a turn asks for, and the agent's own output type when the caller gave
    the agent itself (None: a name gives none)."""
    if isinstance(agent, Agent):
        return agent.name, agent.output_type
    return agent, None


def _output_spec(output_type: Any) -> OutputSpec | None:
    """What a turn carries of an output type (None: the agent's own), as `start` and
    `turn` take it; a type pydantic cannot describe, or whose schema cannot be checked
    (a pattern no linear-time engine takes), is `InvalidOutputType`."""
    try:
        return None if output_type is None else output_spec(output_type)
    except TypeError as e:
        raise InvalidOutputType(_one_line(str(e))) from None


class TurnHandle:
    """One turn, by its workflow id: its events, its result, and its waiting calls."""

    def __init__(
        self, client: AgentClient, workflow_id: str, handle: WorkflowHandle | None = None
    ) -> None:
        self.client = client
        self.id = workflow_id
        self.temporal = handle or client.temporal.get_workflow_handle(
            workflow_id, result_type=TurnOutput
        )
        """The Temporal workflow handle underneath."""
        self.started = True
        """False when a start found the turn of its request id already ended."""
        self.output_type: Any = None
        """What `result().output` is validated as: a type, or (None, an `OutputSpec`)
        the value as JSON."""

    def __repr__(self) -> str:
        return f"TurnHandle({self.id!r})"

    @property
    def url(self) -> str | None:
        """The turn's page in the Web UI, when known."""
        return self.client.turn_url(self.id)

    async def events(self, from_offset: int = 0) -> AsyncIterator[Streamed]:
        """The turn's events as it writes them (`durable_agent.stream`): each step, the
        model's text while it writes (turns started with `stream=True`), then
        `DoneEvent`. On a finished turn, its whole story. Resumes at `from_offset`."""
        if isinstance(from_offset, bool) or not 0 <= from_offset <= MAX_OFFSET:
            raise AgentClientError(
                f"from_offset: give an event's offset from 0 to {MAX_OFFSET}, not {from_offset!r}"
            )
        with _plainly(self.id):
            try:
                async for offset, event in turn_events(self.client.temporal, self.id, from_offset):
                    yield Streamed(offset, event)
            except (RPCError, WorkflowQueryFailedError) as e:
                # A turn that ended before its stream was read to the end (no worker could
                # replay it, for a payload it lacked, say): its result says how it ended.
                if not await self._running():
                    return
                if isinstance(e, RPCError):
                    raise _rpc_error(e, self.id) from None
                raise await self._unreadable(e) from None

    async def result(self, *, no_worker_after: float | None = None) -> TurnResult:
        """Wait for the turn's end. With `no_worker_after`, `NoWorker` when it has
        not ended by then and no worker serves its task queue."""
        waiting = asyncio.ensure_future(self._result())
        if no_worker_after is None:
            return await waiting
        try:
            done, _ = await asyncio.wait({waiting}, timeout=no_worker_after)
            if not done and not (await self.client.workers()).live:
                waiting.cancel()
                raise NoWorker(
                    f"no worker serves task queue {self.client.task_queue!r}: turn {self.id} "
                    f"waits for one; start `{worker_command()}`, then ask for its result"
                )
            return await waiting
        finally:
            waiting.cancel()

    async def _result(self) -> TurnResult:
        with _plainly(self.id):
            try:
                output = await self.temporal.result()
            except WorkflowFailureError as e:  # terminated or cancelled by an operator
                if (ended := _ended_unavailable(e, self.id)) is not None:
                    return ended
                if isinstance(e.cause, ApplicationError) and e.cause.type == CannotFork.__name__:
                    # A fork its worker refused (another version of its agent, a call of
                    # its record the agent as served now cannot take): its own line.
                    raise CannotFork(e.cause.message) from None
                raise AgentClientError(
                    f"turn {self.id} did not finish: {_one_line(str(e.cause or e))}"
                ) from None
            # A turn that continued as new: its earlier runs' steps too, one story.
            steps = await turns.whole(self.temporal, output)
        result = TurnResult(
            **{**dict(output), "steps": steps, "earlier_steps": 0}, workflow_id=self.id
        )
        # The type the caller named, else the agent's own where this process has it.
        kind = self.output_type
        if kind is None and output.output_type:
            kind = loaded_type(output.output_type)
        if kind is not None and output.output is not None:
            result.output = _typed(kind, output.output, self.id)
        return result

    async def progress(self, timeout: float | None = None) -> TurnProgress:
        """The steps so far (of all the turn's runs), the usage and the calls awaiting
        a decision (a worker answers: with `timeout`, `WorkerNeeded` after that many
        seconds)."""
        with _plainly(self.id):
            try:
                progress = await turns.progress_of(self.temporal, timeout)
            except WorkflowQueryFailedError as e:  # no worker can replay it
                raise await self._unreadable(e) from None
            if not progress.earlier_steps:
                return progress
            steps = await turns.whole(self.temporal, progress)
        return progress.model_copy(update={"steps": steps, "earlier_steps": 0})

    async def size(self) -> storage.TurnSize:
        """What the turn costs: its history's bytes over all its runs, its number of
        runs, and its payloads' bytes in the payload store (`TurnSize.line()` says it)."""
        with _plainly(self.id):
            return await storage.size_of(self.client.temporal, self.id)

    async def lost_task(self) -> turns.LostTask | None:
        """The turn's workflow task, when its workers lost it (crashed holding it, or
        failed it) in a row: how often, since when, and how the first was lost
        (`LostTask.line()` says it); None when it is not. Read from the server: a turn
        in that state has no worker to ask."""
        with _plainly(self.id):
            return await turns.lost_task(self.temporal)

    async def _running(self) -> bool:
        try:
            return (await self.temporal.describe()).status == WorkflowExecutionStatus.RUNNING
        except RPCError as e:
            raise _rpc_error(e, self.id) from None

    async def _unreadable(self, e: Exception) -> Exception:
        """Why no worker can replay the turn to answer a query: a stored payload it
        lacks, said in one line (`PayloadUnavailable`); else `e`."""
        line = await storage.first_unreadable(self.client.temporal, self.id)
        return PayloadUnavailable(line) if line else e

    async def pending(self) -> list[PendingApproval]:
        """The calls of this turn that await a decision."""
        return (await self.progress()).pending

    async def questions(self) -> list[Question]:
        """The MCP servers' questions of this turn that await a person's answer (read
        from the turn's memo: no worker needs to run)."""
        with _plainly(self.id):
            return await turns.questions_of(self.temporal)

    async def answer(
        self,
        question_id: str | None = None,
        *,
        action: Literal["accept", "decline", "cancel"],
        content: dict[str, Any] | None = None,
        by: str,
    ) -> Answered:
        """Answer a server's question (`question_id`: the only one when left out):
        `accept` with `content` that fits its form (none in URL mode), `decline` or
        `cancel`. The answer is checked first (`InvalidAnswer`, nothing sent); the
        call is then sent to the server again, which gets the answer. While no worker
        of the turn's version runs, it is recorded for when one does (`later`)."""
        with _plainly(self.id):
            return await turns.answer(
                self.client.temporal,
                self.id,
                question_id,
                action=action,
                content=content,
                by=by,
            )

    async def version(self) -> str:
        """The worker version the turn runs (ran) on, `DEPLOYMENT:BUILD_ID` (empty:
        unversioned workers)."""
        with _plainly(self.id):
            return await turns.version_of(self.temporal)

    async def approve(
        self,
        call_id: str | None = None,
        *,
        by: str,
        principal: Principal | None = None,
        via: str = "client",
    ) -> ApprovalResult:
        """Let a waiting call run (`call_id`: the only one when left out). `by`: who
        decided, for the record; `principal`: who decided, from your authentication,
        which the agent's approvers are checked against (`NotAnApprover`, recorded in
        the turn's story); `via`: the front end it came through, for the record."""
        return await self.decide(call_id, approved=True, by=by, principal=principal, via=via)

    async def reject(
        self,
        call_id: str | None = None,
        *,
        by: str,
        reason: str = "",
        principal: Principal | None = None,
        via: str = "client",
    ) -> ApprovalResult:
        """Drop a waiting call; the model reads that it was declined, and why."""
        return await self.decide(
            call_id, approved=False, by=by, reason=reason, principal=principal, via=via
        )

    async def decide(
        self,
        call_id: str | None,
        *,
        approved: bool,
        by: str,
        reason: str = "",
        principal: Principal | None = None,
        via: str = "client",
    ) -> ApprovalResult:
        """`approve` or `reject`, as a decision that arrived as data (a form, a message)."""
        with _plainly(self.id):
            return await turns.decide(
                self.client.temporal,
                self.id,
                call_id,
                approved=approved,
                by=by,
                reason=reason,
                principal=principal,
                via=via,
            )

    async def wake(self, *, by: str = "") -> Woke:
        """End this turn's waits early (`wait`, `wait_for_event`: `durable_agent.waits`);
        the model reads that `by` woke it, and when. `NotWaiting` if nothing waits."""
        with _plainly(self.id):
            return await turns.wake(self.client.temporal, self.id, by)

    async def send_event(self, name: str, data: Any = None, *, by: str = "") -> Woke:
        """Deliver the event `name` with `data` (any JSON, at most
        `durable_agent.waits.MAX_EVENT_BYTES`) to this turn, which waits for it
        (`wait_for_event`); the model reads the data as a tool's result. `InvalidEvent`
        for a bad name or data, `NotWaiting` if the turn waits for no such event."""
        with _plainly(self.id):
            return await turns.send_event(
                self.client.temporal, self.id, WorldEvent(name=name, data=data, by=by)
            )

    async def rerun(self, from_step: int, **options: Any) -> TurnHandle:
        """This turn forked from `from_step` (`AgentClient.rerun`, which takes `options`)."""
        return await self.client.rerun(self.id, from_step=from_step, **options)

    async def origin(self) -> Origin | None:
        """Which turn this one is a fork of, and from which step (None: not a fork)."""
        with _plainly(self.id):
            return await rewind.origin(self.temporal)


class ConversationHandle:
    """A conversation, by its workflow id: each message is answered by a turn of it."""

    def __init__(
        self, client: AgentClient, workflow_id: str, template: ConversationInput | None
    ) -> None:
        self.client = client
        self.id = workflow_id
        self._template = template
        """What starts it with its first message; None once it runs (or when picked up)."""
        self._named = False
        """Its id is the caller's (`chat(conversation_id=...)`): one of that id may run."""
        self.output_type: Any = None
        """What its turns' values are read as (`chat(agent=...)` with an `Agent`)."""
        self._secrets: dict[str, Any] = {}
        """Its turns' secrets (`chat(secret=...)`), stored when it starts."""

    def __repr__(self) -> str:
        return f"ConversationHandle({self.id!r})"

    @property
    def _handle(self) -> WorkflowHandle:
        return self.client.temporal.get_workflow_handle(self.id, result_type=ConversationOutput)

    async def start(
        self,
        text: str,
        *,
        message_id: str = "",
        attachments: Sequence[attached.Source] = (),
        limits: attached.AttachmentLimits | None = None,
    ) -> TurnHandle:
        """Send a message; returns when the turn answering it has started. With
        `message_id`, sending it again (after a crash) is not a second message.
        `attachments`: its files, as `AgentClient.start` takes them (checked against
        `limits`, default `AttachmentLimits()`), stored as the conversation's payloads."""
        message: str | ChatMessage = text
        if attachments:
            files = _files(attachments, limits or attached.AttachmentLimits())
            with _plainly(self.id, "conversation"):
                stored = await stored_attachments.store(self.client.temporal, self.id, files)
            try:
                message = ChatMessage(text=text, attachments=stored)
            except ValidationError as e:
                raise AgentClientError(_first_error(e)) from None
        with _plainly(self.id, "conversation"):
            if self._template is not None:
                if self._named:
                    await self._of_customer(self._template.asker)
                if self._secrets:
                    template = self._template
                    sealed = await self.client._sealed(
                        template.context, template.customer_id, self._secrets, self.id
                    )
                    self._template = template.model_copy(update={"context": sealed})
                    self._secrets = {}
                _, accepted = await turns.start_chat(
                    self.client.temporal,
                    self._template,
                    message,
                    self.client.task_queue,
                    workflow_id=self.id,
                    message_id=message_id,
                )
                self._template = None
            else:
                accepted = await turns.send(self._handle, message, message_id)
        return self.client.turn(accepted.turn_id, self.output_type)

    async def _of_customer(self, whom: Principal) -> None:
        """A conversation of the caller's naming that runs already gets the message, so
        it must be this customer's: a message never lands in another's conversation."""
        running = await _conversation_input(self.client.temporal, self.id)
        if running is not None and not running.asker.same_person(whom):
            raise RequestConflict(
                f"conversation {self.id} is another customer's: name this customer's "
                "conversations apart (turns.workflow_id('chat', customer, key))"
            )

    async def send(
        self,
        text: str,
        *,
        message_id: str = "",
        attachments: Sequence[attached.Source] = (),
        limits: attached.AttachmentLimits | None = None,
    ) -> TurnResult:
        """Send a message and wait for the answer (`start`'s arguments)."""
        started = await self.start(
            text, message_id=message_id, attachments=attachments, limits=limits
        )
        return await started.result()

    async def state(self) -> ConversationState:
        """The exchanges so far, the turn being answered, and whether it has ended."""
        with _plainly(self.id, "conversation"):
            return await self._handle.query(names.STATE, result_type=ConversationState)

    async def history(self) -> list[Exchange]:
        """The conversation's questions and answers so far (within its memory). An
        answer is there once the conversation has heard of it, a moment after the
        turn's own result."""
        return (await self.state()).exchanges

    async def end(self) -> None:
        """End the conversation (its current turn, if any, finishes first)."""
        with _plainly(self.id, "conversation"):
            await self._handle.signal(names.END)


def _with_our_converter(client: Client) -> Client:
    """`client`, or a client on its connection with the project's data converter
    (pydantic payloads, encrypted when AGENT_ENCRYPTION_KEY is set): a turn's input
    and output are pydantic models. A codec of the client's own is kept."""
    ours = data_converter()
    current = client.data_converter
    if current.payload_converter_class is ours.payload_converter_class:
        return client
    if current.payload_codec is not None:
        ours = dataclasses.replace(ours, payload_codec=current.payload_codec)
    config = client.config()
    config["data_converter"] = ours
    return Client(**config)


@contextlib.contextmanager
def _plainly(workflow_id: str = "", what: str = "turn") -> Iterator[None]:
    """What the SDK and the server raise about `what` (a turn or a conversation, by
    `workflow_id` when it has one), as the `AgentClientError` it means, in one line
    (the cause kept as `__cause__` for whoever debugs it)."""
    try:
        yield
    except (AgentClientError, WorkflowUpdateRPCTimeoutOrCancelledError):
        # The latter is how the SDK says that an update's caller was cancelled (or its
        # deadline passed): a cancellation, which the caller's own code handles.
        raise
    except RPCError as e:
        raise _rpc_error(e, workflow_id, what) from None
    except Exception as e:
        raise AgentClientError(f"{_subject(workflow_id, what)}: {_cannot(e)}") from e


def _subject(workflow_id: str, what: str) -> str:
    return f"{what} {workflow_id}" if workflow_id else f"the {what}"


def _cannot(e: Exception) -> str:
    """What an exception from below means, for a person, in one line."""
    text = _one_line(str(e))
    if isinstance(e, (RecursionError, PydanticSerializationError)) or "depth exceeded" in text:
        return f"a value in it is nested too deeply to send ({text}); give it flatter"
    if "TMPRL1105" in text or "TMPRL1106" in text:
        return (
            "its payloads are kept in a payload store this client does not read "
            f"({text}); set {STORE_ENV} (and AGENT_ENCRYPTION_KEY) as the workers have them"
        )
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _rpc_error(e: RPCError, workflow_id: str, what: str = "turn") -> AgentClientError:
    subject = _subject(workflow_id, what)
    if e.status == RPCStatusCode.NOT_FOUND:
        return UnknownTurn(workflow_id, what)
    if task_failing(e):
        return TurnTaskFailing(workflow_id, what)
    if e.status == RPCStatusCode.UNAVAILABLE:
        said = _one_line(e.message)
        lost = f"lost the Temporal server ({said})"
        if not workflow_id:
            return ServerLost(f"{lost}: ask again once it is back", said)
        return ServerLost(
            f"{lost}; {subject} is kept there: "
            f"see it with `{client_command()} show {workflow_id}` once the server is back",
            said,
        )
    if _too_large(e):
        return AgentClientError(
            f"{subject}: too large for the Temporal server ({_one_line(e.message)}); send "
            f"less (a shorter output type's schema, say), or set {STORE_ENV} so that large "
            "values go to the payload store"
        )
    return AgentClientError(
        f"{subject}: the Temporal server refused ({e.status.name if e.status else 'error'}: "
        f"{_one_line(e.message)})"
    )


def _too_large(e: RPCError) -> bool:
    """A request over the server's limits: a payload over its blob limit (2 MB by
    default), or a message over gRPC's (4 MB)."""
    message = e.message.lower()
    return "blob data size exceeds limit" in message or (
        "larger than max" in message and "message" in message
    )


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ended_unavailable(e: WorkflowFailureError, workflow_id: str) -> TurnResult | None:
    """A turn its worker ended because a payload of its record could not be had (failed
    with `PayloadUnavailable`, or terminated with it as the reason: `runtime/storage.py`),
    as a result: its outcome, and one step with the store's line."""
    cause, marker = e.cause, f"{PayloadUnavailable.__name__}: "
    if isinstance(cause, ApplicationError) and cause.type == PayloadUnavailable.__name__:
        line = cause.message
    elif isinstance(cause, TerminatedError) and cause.message.startswith(marker):
        line = cause.message.removeprefix(marker)
    else:
        return None
    step = Step(kind=StepKind.LIMIT, text=f"payload store: {line}")
    return TurnResult(
        answer=answers.PAYLOAD_UNAVAILABLE,
        outcome=Outcome.PAYLOAD_UNAVAILABLE,
        steps=[step],
        usage=Usage(),
        workflow_id=workflow_id,
    )


def _typed(output_type: Any, value: Any, workflow_id: str) -> Any:
    """A typed turn's value (JSON) as an object of its type; an `OutputSpec`'s, as the
    JSON it is (the worker checked it by the schema)."""
    if isinstance(output_type, OutputSpec):
        return value
    try:
        adapter = _adapter(output_type)
    except TypeError:  # an unhashable type (Annotated with a list, say): not cached
        adapter = TypeAdapter(output_type)
    try:
        return adapter.validate_python(value)
    except ValidationError as e:
        raise OutputMismatch(
            f"turn {workflow_id}: its value does not fit "
            f"{getattr(output_type, '__name__', output_type)!s} as this process has it "
            f"({_first_error(e)}): the worker checked it by a JSON schema (give the agent "
            "the type, Agent(output_type=...), so it checks it whole) or by its own copy of "
            "the type (give this process the same one)"
        ) from None


@functools.lru_cache(maxsize=64)
def _adapter(output_type: Any) -> TypeAdapter[Any]:
    return TypeAdapter(output_type)


def task_failing(e: RPCError) -> bool:
    """Whether Temporal refused a query or an update because the workflow's task fails."""
    return e.status == RPCStatusCode.FAILED_PRECONDITION and "task in failed state" in (
        e.message.lower()
    )


def _first_error(e: ValidationError) -> str:
    return _one_line("; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors()))
