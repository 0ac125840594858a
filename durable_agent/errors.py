"""Errors of the agent and its tools.

Temporal retries an activity unless its error is marked non-retryable, and it
names the error type after the exception class. An error below that is not
`retryable` leaves an activity marked non-retryable (the worker's
`activities._common.PermanentErrors`, which also covers the subclasses an agent's
own code defines); everything else (timeouts, throttling, dropped connections) is
retried with backoff.

    AgentError                     permanent unless said otherwise
    ├── UnknownAgent               a turn names an agent this worker does not serve
    ├── ToolListUnavailable        a turn's tool list (by its hash) cannot be had here
    ├── AgentDefinitionError       an agent cannot be served as defined (stops the worker)
    ├── KnowledgeError             a knowledge source cannot be read or indexed (skipped)
    ├── MemoryUnavailable          an agent's memory store cannot be opened or reached
    ├── ModelError                 the model backend failed
    │   ├── UnknownModel           no backend for that model spec
    │   ├── InvalidModelOutput     the model's reply cannot be used
    │   ├── ModelRequestRejected   refused: bad credentials, bad request, no such model
    │   ├── InvalidConversation    the turn's conversation breaks the providers' rules (a bug)
    │   ├── AttachmentUnreadable   an attachment's text cannot be read (a damaged PDF; no pypdf)
    │   ├── ModelCannotAnswer      this model will not take this request (its context window,
    │   │                          its content filter): not retried; a fallback model may
    │   └── ModelUnavailable       transient: retried (throttling, 5xx, timeouts)
    ├── InvalidCall                a tool call fails validation; the model sees the message
    ├── ConsentMismatch            a write's arguments are not those approved: it does not run
    ├── BudgetExceeded             a model call would pass a budget of the person the turn
    │                              serves (`durable_agent.budgets`): the turn ends, budget_limit
    ├── BudgetSoftLimit            a model call would pass a budget's soft line: the turn asks
    │                              a person first (approved: the call is made again)
    └── ToolError                  a tool could not answer; the model sees the message
        ├── NotFound               no such record (for this customer)
        ├── NotAllowed             the request breaks a rule (e.g. returning an unshipped order)
        ├── UnusableQuestion       an MCP server asked for input no person can be shown
        └── ToolUnavailable        transient: retried

What a client (`durable_agent.AgentClient`, and every front end built on it) raises:

    AgentClientError               a request could not be done; the message says what to do
    ├── ServerUnavailable          no Temporal server reached, or its settings cannot work
    │   └── ServerLost             the server stopped answering mid-request
    ├── UnknownTurn                no turn (or conversation) has that workflow id
    ├── NothingPending             no call of the turn awaits a decision (or several: name one)
    ├── NotAnApprover              the decider may not approve that call (the agent's policy);
    │                              refused, and recorded in the turn's story
    ├── NoWorker                   no worker serves the task queue
    ├── WorkerNeeded               no worker answered in time (the turn waits for one)
    ├── OutputMismatch             a typed turn's value fails its type's own validators
    ├── InvalidContext             a turn's context is not a JSON object, holds NaN, or too large
    ├── InvalidSettings            a turn's model settings are out of their bounds
    ├── InvalidOutputType          a turn's output type cannot be described or checked
    ├── TurnTaskFailing            the turn's workflow task fails: it cannot be read or moved
    ├── CannotFork                 a turn cannot be forked as asked (`client.py rerun`)
    ├── CannotErase                a turn cannot be erased as asked: a conversation's (erase
    │                              it with --conversation), a sub-agent, too many executions
    ├── RequestConflict            a request id already names a turn of another request
    ├── UnknownSchedule            no schedule of turns has that name
    ├── InvalidSchedule            a schedule's name, cron, interval, time or zone cannot be used
    ├── ScheduleNameTaken          a schedule of that name exists already
    ├── UnknownMemory              no memory of that id for that customer, or a malformed
    │                              customer or tenant id (`AgentClient.memory`)
    ├── NotWaiting                 the turn waits for no event of that name (or not at all)
    ├── InvalidEvent               an event's name or data is refused (too large, not JSON)
    ├── InvalidAnswer              an answer to a server's question breaks its form
    ├── AttachmentRefused          a file of a question is refused: its bytes are not what its
    │                              name says, or its type, size or count is over the agent's
    └── PayloadUnavailable         a stored payload cannot be read (missing, altered, refused,
                                   never stored): also a non-retryable `ApplicationError`, so
                                   a worker that meets one ends the turn at once
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from durable_agent.runtime.settings import client_command, worker_command


class AgentError(Exception):
    """Base class of the agent's own errors."""

    retryable = False


class UnknownAgent(AgentError):
    """A turn names an agent that no agent of this worker is called."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"no agent {name!r} is served here (this worker serves: {', '.join(known)}); "
            f"start a worker for it with `{worker_command()} --agent MODULE:ATTRIBUTE`"
        )


class ToolListUnavailable(AgentError):
    """A turn records each MCP server's tool list by its hash (`AgentInfo.tool_lists`),
    and this worker can get that list neither from its own listing nor from the
    tool-list store, or the store's copy does not have that hash; the message names
    the server, the hash, the store and what to set."""


class AgentDefinitionError(AgentError):
    """An agent cannot be served as defined (a bad `--agent`, a tool name used twice,
    two agents with one name); the message says what to fix."""


class KnowledgeError(AgentError):
    """A source of an agent's knowledge cannot be read or indexed (too large, not a
    readable PDF, a kind it cannot read); the worker skips it, logging this one line
    (`durable_agent.knowledge`)."""


class MemoryUnavailable(AgentError):
    """An agent's memory store cannot be opened or reached (a PostgreSQL server that
    does not answer, psycopg not installed): the worker stops as it starts, with this
    line; `AgentClient.memory` and `durable-agent memory` say it in one line."""


class BudgetExceeded(AgentError):
    """A model call would pass a spending budget of the tenant or user the turn serves, or
    one that cannot be kept (the model has no price); the message names the budget and
    when it resets. The turn ends with the outcome `budget_limit`, saying so."""


class BudgetSoftLimit(AgentError):
    """A model call would take a budget's spend past its soft line (`tenant=5/day@80%`)
    and the turn has no approval to pass it this period; its reservation is released.
    `details`: the budget's ledger, what it holds, who may approve going past it (the
    cap's approver rules; empty: the asker), and the line in words. The turn asks a
    person, as for a write, and makes the call again once approved."""

    def __init__(
        self, line: str, ledger: str, spent: float, cap: float, approvers: list[str] | None = None
    ) -> None:
        super().__init__(line)
        details = {"ledger": ledger, "spent": spent, "cap": cap, "approvers": approvers or []}
        self.details = (details,)


class ModelError(AgentError):
    """The model backend failed."""


class UnknownModel(ModelError):
    """No backend is registered for the requested model spec."""

    def __init__(self, spec: str, known: list[str]) -> None:
        super().__init__(
            f"unknown model {spec!r}: use one of {', '.join(sorted(known))} "
            f"(set it per turn with `{client_command()} ask --model SPEC`)"
        )


class InvalidModelOutput(ModelError):
    """The model replied with something that is neither tool calls nor an answer."""


class ModelRequestRejected(ModelError):
    """The backend refused the request in a way a retry will not fix; the message
    says what to change (credentials, model name, base URL)."""


class InvalidConversation(ModelError):
    """The conversation about to be sent breaks the rules every provider enforces
    (see `agent.conversation.check`). A bug in the turn, never in the model: caught
    before the request, so it reads as what it is rather than as a provider's 400."""


class AttachmentUnreadable(ModelError):
    """An attachment's text cannot be read: a PDF without the `documents` extra (pypdf),
    or one too damaged to read; the message names the file and what to do."""


class ModelCannotAnswer(ModelError):
    """This model will not take this request, for a reason of its own: the conversation
    is longer than its context window, or its content filter stopped the request or the
    reply. A retry will not help; another model (a turn's fallback) may answer."""


class ModelUnavailable(ModelError):
    """The model could not be reached or is throttled; Temporal retries the call,
    after `retry_after` seconds when the backend said so (HTTP Retry-After)."""

    retryable = True

    def __init__(self, message: str = "model unavailable", retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ConversationNotRecorded(AgentError):
    """An activity needs the conversation as a model call had it, this worker has no
    copy, and the call is not in the turn's history yet: a call made as a local
    activity is recorded when its workflow task completes or is extended, within
    seconds. Retried: the retry finds it there."""

    retryable = True


class InvalidCall(AgentError):
    """A tool call the registry refuses (unknown tool, bad arguments)."""


class ConsentMismatch(AgentError):
    """A write reached its dispatch with arguments other than those a person approved
    (`approval.consent_hash`): it is not run. The turn never sends one; this is the
    last check, where the write happens."""


class ToolError(AgentError):
    """A tool could not produce a result. The message is shown to the model, so it
    should say what went wrong in words the model (and the user) can act on."""


class NotFound(ToolError):
    """The record does not exist, or belongs to another customer (same message)."""


class NotAllowed(ToolError):
    """The tool refuses the request; the message says why and what to do instead."""


class OutcomeUnknown(ToolError):
    """A write that may have happened: its call reached (or may have reached) a system
    that takes no idempotency key, and its answer was lost. It is not sent again by
    itself: the turn asks a person whether to send it again."""


class UnusableQuestion(ToolError):
    """An MCP server asked for input in a way no person can be shown (a form that is not
    flat, too large, a URL that is not http(s)): the call fails with it
    (`durable_agent.elicitation`)."""


class ToolUnavailable(ToolError):
    """The tool's backend is temporarily unavailable; Temporal retries the call."""

    retryable = True


class AgentClientError(Exception):
    """A request from a client could not be done; the message, one line, says what to
    do about it."""


class ServerUnavailable(AgentClientError):
    """No Temporal client could be opened: no server could be reached or started, or
    the connection or encryption settings cannot work (the message says which)."""


class ServerLost(ServerUnavailable):
    """The server stopped answering a client that had it (`said`: what the connection
    said): what it holds is kept there, for when it is back."""

    def __init__(self, message: str, said: str = "") -> None:
        super().__init__(message)
        self.said = said


class UnknownTurn(AgentClientError):
    """No turn (or conversation) has that workflow id in the namespace."""

    def __init__(self, workflow_id: str, what: str = "turn", hint: str = "") -> None:
        super().__init__(f"no {what} with workflow id {workflow_id!r}" + hint)
        self.workflow_id = workflow_id


class NothingPending(AgentClientError):
    """No call of the turn awaits a decision, or several do and none was named."""


class NotAnApprover(AgentClientError):
    """Who decided may not decide on that call: the agent's approval policy names who
    may (`ApprovalPolicy.approvers`). Nothing is decided; the turn's story records the
    refusal."""


class NotWaiting(AgentClientError):
    """The turn waits for no event of that name (`wait_for_event`), or for nothing at all
    (`wake`): the event or wake-up is refused, and nothing is recorded."""


class InvalidEvent(AgentClientError):
    """An event for a turn is refused before it is sent: its name is not one a turn can
    wait for, or its data is not JSON or is over `durable_agent.waits.MAX_EVENT_BYTES`."""


class InvalidAnswer(AgentClientError):
    """An answer to an MCP server's question that the question cannot take (it breaks
    the requested form, or an action that carries no content has some): nothing was
    recorded (`durable_agent.elicitation`)."""


class NoWorker(AgentClientError):
    """No live worker serves the task queue: a turn started there waits for one."""


class WorkerNeeded(AgentClientError):
    """No worker answered a query in time (the turn is kept, and waits for one)."""


class OutputMismatch(AgentClientError):
    """A typed turn's value, valid by the type's JSON schema (what the worker checks a
    turn's own type by), fails the type's own validators here at the client."""


class InvalidContext(AgentClientError):
    """A turn's context is not a JSON object, holds NaN or Infinity, nests too deep
    (`durable_agent.client.MAX_CONTEXT_DEPTH`), or is too large to travel with the turn
    (`durable_agent.types.MAX_CONTEXT_BYTES`); the message says which."""


class InvalidSecret(InvalidContext):
    """A turn's secrets (`Secret` context values, `secret=[keys]`) cannot travel: no
    AGENT_ENCRYPTION_KEY (they would be stored in clear), the payload store is off, or
    they are not where the context's top level has them; the message says which."""


class InvalidSettings(AgentClientError):
    """A turn's model settings (`ask(settings=)`, `--set`) are unknown or out of their
    bounds; the message names the setting and its bounds."""


class InvalidOutputType(AgentClientError):
    """A turn's output type that cannot be used: pydantic cannot describe it, its JSON
    schema is not one, or a pattern in it cannot be checked in linear time (look-around,
    backreferences: `durable_agent.schemas`). Refused before the turn starts; the
    message names the type and the pattern."""


class TurnTaskFailing(AgentClientError):
    """The turn's workflow task fails each time a worker runs it (a bug in the workflow
    code, or a value over Temporal's limits): Temporal answers no query or update of
    it until a worker that can run it picks it up."""

    def __init__(self, workflow_id: str, what: str = "turn") -> None:
        super().__init__(
            f"{what} {workflow_id} cannot be read now: its workflow task fails each time a "
            "worker runs it (see the worker's log); it stays running, and a worker with the "
            f"fix goes on with it. Its history so far: `{client_command()} show {workflow_id}`"
        )
        self.workflow_id = workflow_id


class CannotFork(AgentClientError):
    """A turn cannot be forked as asked: it is still running or did not finish, the step
    is past its end, or the agent that would run the fork is not the one that ran it
    (then the fork's workflow fails with this type: only a worker knows its agents)."""


class CannotErase(AgentClientError):
    """A turn cannot be erased as asked (`AgentClient.erase`, `durable-agent erase`): it is
    a turn of a conversation (whose record and later turns hold its words: erase the
    conversation), a sub-agent of a turn (erase that turn), not a turn at all, or its
    family is more executions than one erasure takes. Nothing was erased."""


class PayloadUnavailable(AgentClientError, ApplicationError):
    """A payload the history refers to cannot be had from the payload store
    (`durable_agent/runtime/storage.py`): it is missing (deleted, swept, or stored where
    this process does not read), it does not match its hash, its reference is refused
    (it names a place outside the store, or another workflow's payload), or it was never
    stored (the store refused the write). The message names the payload and the store,
    and says what to do.

    Raised as a non-retryable `ApplicationError`: a worker that meets one while it runs
    a turn's workflow task fails the turn at once (the SDK fails the workflow rather than
    its task, which Temporal would retry forever; replaying older events, where it cannot,
    the worker terminates the turn instead), and an activity that meets one fails for
    good. A client raises it as the `AgentClientError` it also is."""

    def __init__(self, message: str) -> None:
        super().__init__(message, type=PayloadUnavailable.__name__, non_retryable=True)

    def __str__(self) -> str:  # the line itself, as every client error says it
        return self.message


class AttachmentRefused(AgentClientError):
    """A file of a question is refused before its turn starts (`durable_agent.attachments`):
    its bytes are not what its name says (a `.pdf` that is an image, a `.png` that is a
    program), it is of no type attachments take, or over its agent's size, count or type
    limits. The message names the file and the limit."""


class UnknownMemory(AgentClientError):
    """A customer's memory asked for from outside (`AgentClient.memory`, `durable-agent
    memory`) is not there: no memory of that id belongs to that customer of that tenant
    (another's is never named), or the customer or tenant id is malformed."""


class RequestConflict(AgentClientError):
    """A request id (an Idempotency-Key) already names a turn started for another
    request (another question, context, agent, model, settings, limits or output type), or a
    conversation id of the caller's naming is another customer's. The same request
    again gets its turn; a new request needs a new id."""


class UnknownSchedule(AgentClientError):
    """No schedule of turns has that name in the namespace (`durable_agent.schedules`)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no schedule of turns named {name!r}; see `{client_command()} schedule list`"
        )
        self.name = name


class InvalidSchedule(AgentClientError):
    """A schedule's name, cron expression, interval, time, time zone or policy cannot be
    used; the message names which, and what to give."""


class ScheduleNameTaken(AgentClientError):
    """A schedule of that name exists already in the namespace (names are the schedules'
    ids); delete it first, or choose another name."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"a schedule named {name!r} exists already: choose another name, or delete it "
            f"first (`{client_command()} schedule delete {name}`)"
        )
        self.name = name
