"""Amazon Lex V2 front end: the Lambda function behind a bot's fallback intent.

    Lex V2 bot ── FallbackIntent, fulfillment code hook ──▶ handler(event, context)
                                                              │ AgentClient
                                                              ▼
                              Conversation workflow, one per Lex session (chat / send)
                              └── AgentTurn per utterance; Lex gets its answer, or
                                  "still working" when it takes longer than the budget

Lex waits 30 s for a fulfillment function, then tells the user it failed. The
handler therefore waits for a turn's answer at most AGENT_LEX_BUDGET_S (20 s, and
never past the Lambda's own remaining time less 2 s), leaving room for a cold
start and the connection. A turn that takes longer, or waits for a person's
approval, goes on; the handler answers that it is still working, and keeps the
turn's id in the session, so the user's next utterance first brings that answer.

AGENT_LEX_AGENT names the agent that answers (default: the worker's first).

Session attributes (strings, as Lex requires; Lex gives them back on every event):

    customerToken       read: whose orders the agent may see, signed by the application
                        that calls Lex with AGENT_LEX_CUSTOMER_SECRET (`customer_token`);
                        without one, AGENT_LEX_CUSTOMER; with neither, no answer (the
                        session id and plain attributes are the caller's to choose)
    agentConversation   the session's conversation (workflow id); an ended one, e.g.
                        after 30 idle minutes, is replaced by a new one
    agentTurn           a turn still being worked on; "" once its answer was given

Calls that need approval wait for an operator (`python client.py pending`, then
`approve` / `reject`; the handler logs the exact command). With
AGENT_LEX_SELF_APPROVAL=1 the Lex user decides instead: "yes" or "no", recorded as
`lex:<session id>`. Every error becomes a polite answer and a log line; nothing
escapes the handler, since Lex would only tell the user that something failed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Awaitable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.agents import AGENT_NAME_PATTERN
from durable_agent.chat import ConversationInput
from durable_agent.client import AgentClient
from durable_agent.errors import AgentClientError, UnknownTurn
from durable_agent.frontends._lexv2 import BadEvent, LexEvent, attributes_of, close, intent_of
from durable_agent.runtime.server import ServerUnavailable, connect
from durable_agent.runtime.settings import TASK_QUEUE
from durable_agent.runtime.turns import progress_of
from durable_agent.types import PendingApproval, TurnOutput
from durable_agent.workflows import AgentTurn

T = TypeVar("T")
_log = logging.getLogger(__name__)
_log.setLevel(logging.INFO)  # Lambda's root logger passes on what its loggers let through

BUDGET_ENV = "AGENT_LEX_BUDGET_S"
AGENT_ENV = "AGENT_LEX_AGENT"
CUSTOMER_ENV = "AGENT_LEX_CUSTOMER"
SECRET_ENV = "AGENT_LEX_CUSTOMER_SECRET"
SELF_APPROVAL_ENV = "AGENT_LEX_SELF_APPROVAL"
DEFAULT_BUDGET_S = 20.0
MAX_BUDGET_S = 900.0
"""Lambda's own limit. Lex waits 30 s unless the intent's fulfillment updates
(streaming conversations only) allow it more."""
LAMBDA_MARGIN_S = 2.0
"""Kept free of the Lambda's remaining time, to build and return the answer."""
POLL_S = 0.25
QUERY_TIMEOUT_S = 2.0

CUSTOMER = "customerId"
TOKEN = "customerToken"
CONVERSATION = "agentConversation"
TURN = "agentTurn"

TROUBLE = (
    "Sorry, I can't answer right now because of a problem on our side. "
    "Please try again in a few minutes."
)
NOT_UNDERSTOOD = "Sorry, I didn't get that. Could you say it again?"

YES = frozenset({"yes", "y", "yes please", "yeah", "yep", "sure", "ok", "okay", "go ahead"})
NO = frozenset({"no", "n", "nope", "no thanks", "cancel", "don't", "do not", "stop"})
STATUS_CHECKS = (
    frozenset(
        {
            "",
            "any news",
            "news",
            "any update",
            "any updates",
            "update",
            "status",
            "and",
            "and now",
            "so",
            "well",
            "done",
            "is it done",
            "are you done",
            "ready",
            "is it ready",
            "still there",
            "are you still there",
        }
    )
    | YES
    | NO
)
"""Utterances that ask about the earlier question rather than ask a new one."""


class SetupError(Exception):
    """The function's settings, or what the calling application passes, cannot work;
    the message says what to change. The Lex user gets an apology."""


class NotAnswering(Exception):
    """The agent did not take a message or a decision within the budget."""


@dataclass(frozen=True)
class Settings:
    """The handler's settings, read from the environment on every invocation."""

    budget: float = DEFAULT_BUDGET_S
    """Seconds to wait for an answer before saying "still working"."""
    task_queue: str = TASK_QUEUE
    agent: str = ""
    """The agent that answers the bot's users (empty: the worker's first)."""
    customer: str = ""
    """The customer of every session that carries no signed token (e.g. `demo`)."""
    secret: str = ""
    """Signs the customer tokens the calling application sets (`customer_token`)."""
    self_approval: bool = False
    """Whether the Lex user may approve the agent's writes for themself."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        return cls(
            budget=_budget(env.get(BUDGET_ENV, "")),
            task_queue=env.get("AGENT_TASK_QUEUE", "") or TASK_QUEUE,
            agent=_agent(env.get(AGENT_ENV, "")),
            customer=env.get(CUSTOMER_ENV, "").strip(),
            secret=env.get(SECRET_ENV, "").strip(),
            self_approval=_switch(SELF_APPROVAL_ENV, env.get(SELF_APPROVAL_ENV, "")),
        )


def _budget(raw: str) -> float:
    try:
        budget = float(raw) if raw.strip() else DEFAULT_BUDGET_S
    except ValueError:
        budget = -1.0
    if not 0 < budget <= MAX_BUDGET_S:
        raise SetupError(
            f"{BUDGET_ENV}={raw!r}: set the seconds to wait for an answer, more than 0 and "
            f"at most {MAX_BUDGET_S:g}; keep it well under the 30 s Lex waits (default "
            f"{DEFAULT_BUDGET_S:g})"
        )
    return budget


def _agent(raw: str) -> str:
    name = raw.strip()
    if name and not re.fullmatch(AGENT_NAME_PATTERN, name):
        raise SetupError(
            f"{AGENT_ENV}={raw!r}: name the agent that answers (as its workers serve it), "
            "or leave it unset for the worker's first"
        )
    return name


def _switch(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise SetupError(f"{name}={raw!r}: set 1 (on) or 0 (off)")


def conversation_input(
    event: LexEvent, settings: Settings, now: float | None = None
) -> ConversationInput:
    """The session's conversation. Whoever calls Lex sets the session's id and its
    attributes, so neither names the customer by itself: the customer is the one a
    `customerToken` attribute signed with AGENT_LEX_CUSTOMER_SECRET names (set by the
    application after its own login: `customer_token`), else AGENT_LEX_CUSTOMER (one
    customer for every session: a demo, a single-account bot)."""
    token = event.attributes.get(TOKEN)
    if settings.secret and token:
        customer = verify_customer_token(token, settings.secret, now)
    elif settings.customer:
        customer = settings.customer
    elif settings.secret:
        raise SetupError(
            f"session {event.session_id!r} carries no {TOKEN} attribute: the application "
            f"that calls Lex sets it after its login (durable_agent.frontends.lex.customer_token)"
        )
    else:
        raise SetupError(
            f"no customer source: set {SECRET_ENV} (the application signs each session's "
            f"customer into its {TOKEN} attribute) or {CUSTOMER_ENV} (one customer for all)"
        )
    try:
        return ConversationInput(customer_id=customer, agent=settings.agent)
    except ValidationError as e:
        problem = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
        raise SetupError(f"customer id {customer!r}: {problem}; fix {CUSTOMER_ENV}") from None


def customer_token(
    customer: str, secret: str, ttl_s: float = 3600, now: float | None = None
) -> str:
    """The `customerToken` session attribute for `customer`, valid for `ttl_s`: what the
    application calling Lex sets once it knows who the user is."""
    expires = int((time.time() if now is None else now) + ttl_s)
    return f"{customer}:{expires}:{_signature(customer, expires, secret)}"


def verify_customer_token(token: str, secret: str, now: float | None = None) -> str:
    """The customer a `customer_token` names, if it is signed with `secret` and not
    expired; else SetupError."""
    shape = _TOKEN_SHAPE.fullmatch(token)
    if shape is None:
        raise SetupError(
            f"the {TOKEN} attribute is not a customer token (CUSTOMER:EXPIRY:SIGNATURE, as "
            "durable_agent.frontends.lex.customer_token makes it)"
        )
    customer, expires, signature = shape[1], int(shape[2]), shape[3]
    # Bytes: compare_digest refuses str with characters beyond ASCII.
    expected = _signature(customer, expires, secret).encode()
    if not hmac.compare_digest(signature.encode("utf-8", "surrogatepass"), expected):
        raise SetupError(f"the {TOKEN} attribute's signature does not match {SECRET_ENV}")
    if expires < (time.time() if now is None else now):
        raise SetupError(f"the {TOKEN} attribute expired: the application signs a new one")
    return customer


_TOKEN_SHAPE = re.compile(r"([^:]{1,200}):([0-9]{1,12}):([^:]{0,200})")
"""A customer token's parts: the expiry in plain digits (`int` takes `²` and other
scripts' digits, and refuses thousands of them), nothing of any length."""


def _signature(customer: str, expires: int, secret: str) -> str:
    message = f"{customer}:{expires}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


# -- where a turn stands ---------------------------------------------------------------


@dataclass(frozen=True)
class Answered:
    answer: str


@dataclass(frozen=True)
class Unanswered:
    """The turn ended without an answer (terminated, failed), or is gone."""

    why: str


@dataclass(frozen=True)
class Working:
    """Still running when the budget ran out, or waiting for approval of `waiting`."""

    turn_id: str
    waiting: list[PendingApproval] = field(default_factory=list)


TurnState = Answered | Unanswered | Working


async def watch(
    client: Client, turn_id: str, deadline: float, decided: frozenset[str] = frozenset()
) -> TurnState:
    """Wait for the turn's answer until `deadline`, and stop early when it waits for
    approval (of calls other than `decided`): nobody will answer it within seconds.

    The answer comes from the turn's result, which the server holds without any
    worker; the approval check is a query, which needs one, so a missing worker
    only means "still working"."""
    handle = client.get_workflow_handle_for(AgentTurn.run, turn_id)
    result = asyncio.ensure_future(handle.result())
    try:
        while True:
            await asyncio.wait({result}, timeout=max(0.0, min(POLL_S, _left(deadline))))
            if result.done():
                return _ended(result)
            if _left(deadline) <= 0:
                return Working(turn_id)
            waiting = [p for p in await _waiting(handle, deadline) if p.call.id not in decided]
            if waiting:
                return Working(turn_id, waiting)
    finally:
        result.cancel()


def _ended(result: asyncio.Future[TurnOutput]) -> Answered | Unanswered:
    try:
        return Answered(result.result().answer)
    except WorkflowFailureError as e:
        _log.warning("lex: a turn ended without an answer: %s", e.cause or e)
        return Unanswered("it stopped before it had an answer")
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return Unanswered("it is no longer on record")
        raise


async def _waiting(handle: WorkflowHandle, deadline: float) -> list[PendingApproval]:
    try:
        timeout = max(0.0, min(QUERY_TIMEOUT_S, _left(deadline)))
        return (await asyncio.wait_for(progress_of(handle), timeout)).pending
    except (asyncio.TimeoutError, AgentClientError, RPCError):
        return []  # no worker to ask yet, or the turn ended meanwhile: the result tells


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


# -- one invocation ----------------------------------------------------------------------


class Session:
    """One invocation's view of a Lex session: its conversation, the turn it may still
    wait for, and the session attributes Lex gets back (kept current as it goes, so
    even an answer cut short by the deadline carries them)."""

    def __init__(
        self, event: LexEvent, settings: Settings, chat: ConversationInput, deadline: float
    ) -> None:
        self.event = event
        self.settings = settings
        self.chat = chat
        self.deadline = deadline
        self.attributes = dict(event.attributes)
        conversation = self.attributes.get(CONVERSATION, "")
        turn = self.attributes.get(TURN, "")
        self.conversation = conversation
        self.turn = turn if conversation and _is_turn_of(conversation, turn) else ""

    @property
    def conversation(self) -> str:
        return self.attributes[CONVERSATION]

    @conversation.setter
    def conversation(self, workflow_id: str) -> None:
        self.attributes[CONVERSATION] = workflow_id

    @property
    def turn(self) -> str:
        return self.attributes[TURN]

    @turn.setter
    def turn(self, workflow_id: str) -> None:
        # "" rather than deleting it: whether Lex replaces or merges the attributes,
        # a turn whose answer was given must not be given again.
        self.attributes[TURN] = workflow_id

    def answer(self, texts: list[str], *, fulfilled: bool) -> dict[str, Any]:
        return close(
            self.event.intent,
            self.attributes,
            texts,
            fulfilled=fulfilled,
            active_contexts=self.event.active_contexts,
        )

    async def reply(self, client: Client) -> list[str]:
        """What to say: the earlier turn's answer if one is pending, then the answer
        to this utterance (unless it only asked about the earlier one)."""
        texts: list[str] = []
        status_check = _normalized(self.event.text) in STATUS_CHECKS
        await self._own_conversation(client)
        if self.turn:
            earlier = await self._earlier(client)
            if isinstance(earlier, Working):
                # One question at a time, as the conversation answers them: a new
                # one would only queue behind this one.
                return [self._still_working(earlier)]
            self.turn = ""
            texts.append(_earlier_text(earlier, alone=status_check))
            if status_check:
                return texts
        state = await self._ask(client, self.event.text)
        texts.append(self._text(state))
        return texts

    async def _own_conversation(self, client: Client) -> None:
        """Keep the session's conversation only if it is the customer's own, as it
        records whom it was started for: the attribute comes from outside, and must not
        lead into someone else's chat (nor its turn, `<conversation>-<n>`)."""
        if not self.conversation:
            return
        customer = self.chat.customer_id
        agents = self._agents(client)
        try:
            await self._bounded(agents.conversation_for(self.conversation, customer=customer))
        except UnknownTurn:
            _log.warning(
                "lex: session %s names conversation %r, not one of customer %r; starting anew",
                self.event.session_id,
                self.conversation,
                customer,
            )
            self.conversation, self.turn = "", ""

    async def _earlier(self, client: Client) -> TurnState:
        """Where the pending turn stands; with self-approval on, a "yes" or "no" to the
        calls it waits for decides them first."""
        state = await watch(client, self.turn, self.deadline)
        verdict = _yes_or_no(self.event.text) if self.settings.self_approval else None
        if isinstance(state, Working) and state.waiting and verdict is not None:
            decided = await self._decide(client, state, verdict)
            state = await watch(client, self.turn, self.deadline, decided)
        return state

    async def _decide(self, client: Client, state: Working, approved: bool) -> frozenset[str]:
        by = f"lex:{self.event.session_id}"[:100]
        for waiting in state.waiting:
            try:
                turn = self._agents(client).turn(state.turn_id)
                await self._bounded(turn.decide(waiting.call.id, approved=approved, by=by))
            except AgentClientError as e:  # decided meanwhile, e.g. by an operator
                _log.info("lex: %s", e)
        return frozenset(w.call.id for w in state.waiting)

    async def _ask(self, client: Client, text: str) -> TurnState:
        self.turn = await self._bounded(self._send(client, text))
        state = await watch(client, self.turn, self.deadline)
        if not isinstance(state, Working):
            self.turn = ""
        return state

    async def _send(self, client: Client, text: str) -> str:
        """Send `text` to the session's conversation, or to a new one when there is
        none or it has ended; the id of the turn that answers it."""
        agents = self._agents(client)
        if self.conversation:
            ongoing = agents.conversation(self.conversation)
            try:
                return (await ongoing.start(text)).id
            except AgentClientError:
                if await _running(client.get_workflow_handle(ongoing.id)):
                    raise  # the conversation refused this message: the user hears why
                _log.info("lex: conversation %s has ended; starting a new one", ongoing.id)
        started = agents.chat_from(self.chat)
        turn = await started.start(text)
        self.conversation = started.id
        return turn.id

    def _agents(self, client: Client) -> AgentClient:
        return AgentClient(client, task_queue=self.settings.task_queue)

    async def _bounded(self, step: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(step, max(0.0, _left(self.deadline)))
        # An update cut short says so in its own words, not as a cancellation.
        except (asyncio.TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            raise NotAnswering(
                f"the agent took no message or decision within the budget; is a worker "
                f"polling task queue {self.settings.task_queue!r}?"
            ) from None

    def _text(self, state: TurnState) -> str:
        if isinstance(state, Answered):
            return state.answer
        if isinstance(state, Unanswered):
            return f"Sorry, I couldn't answer that: {state.why}. Please ask again."
        return self._still_working(state)

    def _still_working(self, state: Working) -> str:
        if not state.waiting:
            return (
                'I\'m still working on that. Ask me "any news?" in a moment '
                f"(reference {state.turn_id})."
            )
        calls = " and ".join(w.call.render() for w in state.waiting)
        verb = "needs" if len(state.waiting) == 1 else "need"
        if self.settings.self_approval:
            return f'{calls} {verb} your approval: say "yes" to go ahead or "no" to cancel.'
        for w in state.waiting:
            _log.info(
                "lex: turn %s waits for approval of %s; decide with: python client.py "
                "approve %s %s (or reject)",
                state.turn_id,
                w.call.render(),
                state.turn_id,
                w.call.id,
            )
        return (
            f"{calls} {verb} approval by our team first; I'll have your answer once they "
            f'have decided. Ask me "any news?" any time (reference {state.turn_id}).'
        )


def _earlier_text(state: Answered | Unanswered, *, alone: bool) -> str:
    if isinstance(state, Unanswered):
        return f"Your earlier question got no answer: {state.why}. Please ask it again."
    return state.answer if alone else f"About your earlier question: {state.answer}"


def _is_turn_of(conversation: str, turn: str) -> bool:
    return re.fullmatch(rf"{re.escape(conversation)}-\d+", turn) is not None


def _normalized(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def _yes_or_no(text: str) -> bool | None:
    said = _normalized(text)
    return True if said in YES else False if said in NO else None


async def _running(handle: WorkflowHandle) -> bool:
    try:
        return (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise


# -- the Lambda entry point -----------------------------------------------------------


class _Process:
    """What outlives one invocation: an event loop, and the Temporal client on it.

    Lambda calls a synchronous handler, one event at a time per execution
    environment, and keeps the process between events. A Temporal client belongs to
    the event loop it was created on, so every invocation runs on the same loop,
    and warm invocations reuse the client's connection instead of opening one
    (TLS and API-key exchange included) each time."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Client | None = None

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(main)

    async def client(self) -> Client:
        if self._client is None:
            self._client = (await connect()).client
        return self._client

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
        self._loop, self._client = None, None


_PROCESS = _Process()


def handler(event: Any, context: Any = None) -> dict[str, Any]:
    """The Lambda handler (`durable_agent.frontends.lex.handler`): a Lex V2 event in, a Lex V2
    answer out, always (an escaping exception would reach the user as a failure)."""
    started = time.monotonic()
    try:
        return _PROCESS.run(_answer(event, context, started))
    except Exception:
        _log.exception("lex: unexpected failure; answered with an apology")
        return close(intent_of(event), attributes_of(event), [TROUBLE], fulfilled=False)


async def _answer(event: Any, context: Any, started: float) -> dict[str, Any]:
    try:
        lex = LexEvent.parse(event)
    except BadEvent as e:
        _log.error("lex: cannot answer this event: %s", e)
        return close(intent_of(event), attributes_of(event), [NOT_UNDERSTOOD], fulfilled=False)
    try:
        settings = Settings.from_env()
        session = Session(lex, settings, conversation_input(lex, settings), 0.0)
    except SetupError as e:
        _log.error("lex: %s", e)
        return close(lex.intent, lex.attributes, [TROUBLE], fulfilled=False)
    session.deadline = _deadline(started, settings.budget, context)
    try:
        client = await asyncio.wait_for(_PROCESS.client(), max(0.0, _left(session.deadline)))
    except (ServerUnavailable, asyncio.TimeoutError) as e:
        _log.error("lex: no Temporal client: %s", str(e) or "connecting took the whole budget")
        return session.answer([TROUBLE], fulfilled=False)
    return await _reply(session, client)


async def _reply(session: Session, client: Client) -> dict[str, Any]:
    try:
        # The session keeps to its deadline; this only guards against a step that
        # would not (Lex must hear something, and the attributes must get back).
        texts = await asyncio.wait_for(session.reply(client), _left(session.deadline) + 1.0)
    except asyncio.TimeoutError:
        _log.warning("lex: session %s: cut short at the deadline", session.event.session_id)
        texts = ['I\'m still working on that. Ask me "any news?" in a moment.']
    except AgentClientError as e:
        _log.info("lex: session %s: message refused: %s", session.event.session_id, e)
        return session.answer([f"Sorry, I can't take that message: {e}."], fulfilled=False)
    except (NotAnswering, RPCError) as e:
        _log.error("lex: session %s: %s", session.event.session_id, e)
        return session.answer([TROUBLE], fulfilled=False)
    _log.info(
        "lex: session %s, conversation %s, turn pending: %s",
        session.event.session_id,
        session.conversation or "-",
        session.turn or "-",
    )
    return session.answer(texts, fulfilled=True)


def _deadline(started: float, budget: float, context: Any) -> float:
    """When to stop waiting: after the budget, and before the Lambda itself times out."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if callable(remaining):
        budget = min(budget, remaining() / 1000 - LAMBDA_MARGIN_S)
    return started + budget
