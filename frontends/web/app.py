"""The web chat's HTTP side: one page, and a small JSON and server-sent events API.

    GET  /                                  the page (static/index.html)
    GET  /api/session                       who the page chats as
    POST /api/chats               {text}    a new conversation and its first message
    POST /api/chats/{id}/messages {text}    the next message (returns when its turn starts)
    GET  /api/chats/{id}/events             the conversation as server-sent events
                                            (`events.py`), resumable with Last-Event-ID
    GET  /api/turns/{id}/events             one turn of this customer's as server-sent
                                            events (a fork of a turn, which no
                                            conversation shows; the page's `?turn=ID`)
    GET  /api/approvals                     the calls awaiting consent this user sees: their
                                            own turns', and a support lead's, their
                                            tenant's that the agent's approvers give them
    POST /api/turns/{id}/decisions {call_id, approved, reason?}
                                            approve or reject a call awaiting consent (the
                                            asker's, or a lead's: `turn_to_decide`)
    GET  /api/turns/{id}/files/{n}          the n-th file (from 0) of this user's turn's
                                            message, as it was stored (`attachment`)
    POST /api/stream-tickets {path}         with a login: a ticket (60 s) that opens the
                                            stream or file at `path` as `PATH?ticket=...`,
                                            for an EventSource or an <img>, which send
                                            no header
    GET  /api/turns/{id}/questions          an MCP server's questions awaiting an answer
    POST /api/turns/{id}/answers {question_id, action, content?}
                                            answer one: accept (a form's fields),
                                            decline or cancel (`durable_agent.elicitation`)

New conversations and messages are limited per client (`limits.py`: 429 with
`Retry-After` past them).

Everything goes through `runtime.turns`, as `client.py chat` does. Errors are JSON
`{"error": "..."}` in one line, which the page shows as a line of the chat.

Who chats is the user of a verified JWT (`auth.py`: `AGENT_WEB_JWT_SECRET` or
`AGENT_WEB_JWKS`; a request without a valid token gets 401, and an EventSource opens
its stream with a short-lived ticket, never the JWT in a URL). With neither set, the
chat runs for one local user: whoever reaches the server chats and approves as its
customer (its principal: `ConversationInput.asker`, which an agent's approvers are
checked against; decisions record `via` `web`), meant for loopback or behind the
operator's own gateway. Two
guards keep other web sites out of it: writes must be JSON (a cross-site form or
`fetch` cannot send that without a preflight this server never answers) and come
from the page's own origin (the `Origin` a browser sends names the `Host` it
asked: a gateway must pass `Host` on), and only `allowed_hosts` are served, so a
name rebound to 127.0.0.1 reaches nothing (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.agents import Agent, AgentCard
from durable_agent.approval import ApprovalDecision
from durable_agent.attachments import IMAGES, MAX_COUNT, TEXT, Attachment
from durable_agent.chat import ConversationInput
from durable_agent.client import AgentClient, ConversationHandle
from durable_agent.errors import (
    AgentClientError,
    AttachmentRefused,
    InvalidAnswer,
    MemoryUnavailable,
    NotAnApprover,
    PayloadUnavailable,
    UnknownTurn,
)
from durable_agent.frontends.web.auth import (
    STREAM_TICKET_S,
    Authenticator,
    StreamTickets,
    Unauthenticated,
)
from durable_agent.frontends.web.events import (
    Event,
    Position,
    conversation,
    one_turn,
    with_keepalive,
)
from durable_agent.frontends.web.limits import Buckets, RateLimits, client_key, retry_after
from durable_agent.memory import Memory, MemoryAccess
from durable_agent.principal import Principal
from durable_agent.rewind import Origin
from durable_agent.runtime import attachments as stored_files
from durable_agent.runtime import deployments, turns
from durable_agent.runtime.server import LOOPBACK_NAMES, Connection, host_allowed
from durable_agent.runtime.settings import TASK_QUEUE
from durable_agent.types import check_question

log = logging.getLogger("durable_agent.web")

STATIC = Path(__file__).resolve().parent / "static"
DECIDED_BY = "web"
"""Who decided, for the turn's record: the channel (the Lex front end records `lex:…`)."""
KEEPALIVE_S = 15.0
RETRY_MS = 1000
"""How soon EventSource reconnects when a stream ends unexpectedly (a restart)."""
PROBLEM_RETRY_MS = 5000
"""How soon after a `problem` event."""
LOOPBACK_HOSTS = LOOPBACK_NAMES
MAX_BODY_BYTES = 64 * 1024
"""A message or a decision; a longer body is refused (413) before it is read whole."""
MAX_FILES_BYTES = 8 * 1024 * 1024
"""A message's files together, as bytes (the agent's own limits, `Agent(attachments=...)`,
are checked too); their base64 in the body may take a third more."""
MAX_MESSAGE_BYTES = MAX_BODY_BYTES + MAX_FILES_BYTES * 4 // 3 + 4096
"""A message's body with its files, at most."""
FILE_POLICY = "default-src 'none'; sandbox"
"""A served file runs nothing and loads nothing, opened by itself or not: an HTML or SVG
file someone attached (stored as text) cannot script the chat's origin."""


class Problem(Exception):
    """A request the chat cannot serve, said in one line, with its HTTP status (and
    headers to send with it)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


Handler = Callable[[Request], Awaitable[Response]]


def create_app(
    conn: Connection,
    chat: ConversationInput | None = None,
    *,
    task_queue: str = TASK_QUEUE,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
    agent: Agent | None = None,
    rate_limits: RateLimits | None = None,
    auth: Authenticator | None = None,
) -> Starlette:
    """The chat for `chat`'s customer (model and limits too; its turns always stream),
    talking to Temporal through `conn` on `task_queue`, for requests to
    `allowed_hosts` (host names; `*`: any), in `agent`'s words (its card; None: the
    card of the agent that answers on the task queue, read as each page opens), with
    `rate_limits` per client (None: as the environment sets them, `limits.py`). With
    `auth`, each request is for the principal of its verified bearer token (401
    without one), and `chat`'s customer is only the template of their chats."""
    template = (chat or ConversationInput()).model_copy(update={"stream": True})
    client = conn.client
    agents = AgentClient(client, task_queue=task_queue, ui_url=conn.ui_url)
    # What a message's files are checked against here (the worker checks its agent's).
    taken = agent.attachments if agent is not None else None
    # The only conversations and turns a request reads or decides are its principal's
    # (the one local user's, without a login), as each records whom it was started for
    # (`AgentClient.turn_for`): another's is answered as one that does not exist.

    def who(request: Request) -> Principal:
        """Whom this request is for: its token's principal, else the one local user."""
        if auth is None:
            return template.asker
        return auth.principal(request.headers.get("authorization"))

    tickets = StreamTickets()

    def reader(request: Request) -> Principal:
        """Whom a stream is for: as `who`, or, for a browser's `EventSource` (which
        cannot send a header), the principal of the `ticket` it got for this path."""
        ticket = request.query_params.get("ticket")
        if auth is None or ticket is None or "authorization" in request.headers:
            return who(request)
        return tickets.principal(ticket, request.scope["path"])

    async def stream_ticket(request: Request) -> Response:
        whom = who(request)  # the bearer token, verified
        path = unquote(_field(await _body(request), "path", str))
        try:
            ticket = tickets.issue(whom, path)
        except ValueError as e:
            raise Problem(400, str(e)) from None
        return JSONResponse({"ticket": ticket, "expires_in": STREAM_TICKET_S})

    limits = rate_limits or RateLimits.from_env()
    new_chats, messages = Buckets(limits.chats), Buckets(limits.messages)

    def within(request: Request, buckets: Buckets, what: str) -> None:
        """Refused (429) when this request's client has sent `what` too often."""
        peer = request.client.host if request.client else ""
        client = client_key(
            peer, request.headers.getlist("x-forwarded-for"), limits.trusted_proxies
        )
        wait = buckets.take(client)
        if wait is not None:
            raise Problem(
                429,
                f"too many {what} from your address (at most {buckets.rate}): "
                f"try again in {retry_after(wait)} s",
                {"Retry-After": retry_after(wait)},
            )

    async def own_chat(chat_id: str, whom: Principal) -> ConversationHandle:
        try:
            return await agents.conversation_for(chat_id, principal=whom)
        except UnknownTurn:
            # Ended long ago or never begun, or another's: the page starts a new one.
            raise Problem(410, f"no conversation {chat_id} of yours: start a new one") from None

    async def session(request: Request) -> Response:
        whom = who(request)
        card = agent.card() if agent is not None else await _answering(client, template, task_queue)
        return JSONResponse(
            {
                "customer_id": whom.user,
                "tenant": whom.tenant,
                # A principal with a role gets the page's queue of the calls it decides.
                "roles": list(whom.roles),
                # No login: the chat says it runs for one local user.
                "login": "jwt" if auth is not None else "none: one local user",
                "agent": card.model_dump(exclude={"fingerprint"}),
            }
        )

    async def new_chat(request: Request) -> Response:
        whom = who(request)
        body = await _body(request, MAX_MESSAGE_BYTES)
        text, files = _text(body), _files(body)
        within(request, new_chats, "new conversations")
        within(request, messages, "messages")
        started = agents.chat_from(
            template.model_copy(update={"principal": whom, "customer_id": whom.user})
            if auth is not None
            else template
        )
        turn = await started.start(text, attachments=files, limits=taken)
        return JSONResponse({"chat_id": started.id, "turn_id": turn.id}, status_code=201)

    async def message(request: Request) -> Response:
        whom = who(request)
        body = await _body(request, MAX_MESSAGE_BYTES)
        text, files = _text(body), _files(body)
        ongoing = await own_chat(str(request.path_params["chat_id"]), whom)
        within(request, messages, "messages")
        try:
            turn = await ongoing.start(text, attachments=files, limits=taken)
        except AttachmentRefused:
            raise
        except AgentClientError as e:
            # An ended conversation is gone for good: the page starts a new one.
            running = await _running(client.get_workflow_handle(ongoing.id))
            raise Problem(409 if running else 410, str(e)) from None
        return JSONResponse({"chat_id": ongoing.id, "turn_id": turn.id}, status_code=202)

    async def decision(request: Request) -> Response:
        whom = who(request)
        turn_id = str(request.path_params["turn_id"])
        body = await _body(request)
        call_id, approved = _field(body, "call_id", str), _field(body, "approved", bool)
        reason = _field(body, "reason", str) if "reason" in body else ""
        try:  # refused as the request it is (400), whatever the turn's state
            ApprovalDecision(call_id=call_id, approved=approved, by=DECIDED_BY, reason=reason)
        except ValidationError as e:
            raise Problem(400, _invalid(e)) from None
        # The asker's own turn, or one whose waiting call the agent's approvers give
        # this principal (a support lead of its tenant); anyone else's: 404.
        turn = await agents.turn_to_decide(turn_id, principal=whom)
        result = await turn.decide(
            call_id,
            approved=approved,
            by=whom.user if auth is not None else DECIDED_BY,
            reason=reason,
            principal=whom,
            via="web",
        )
        return JSONResponse(result.model_dump(mode="json"))

    async def approvals(request: Request) -> Response:
        """The calls awaiting consent this principal sees: their own turns', and a
        lead's, their tenant's that the agent's approvers give them."""
        shown = await agents.pending_for(who(request))
        return JSONResponse(
            {
                "approvals": [
                    {
                        "turn_id": w.workflow_id,
                        "asked_by": w.asker.user if w.asker else "",
                        **w.approval.model_dump(mode="json"),
                    }
                    for w in shown
                ]
            }
        )

    async def questions(request: Request) -> Response:
        whom = who(request)
        turn = await agents.turn_for(str(request.path_params["turn_id"]), principal=whom)
        asked = await turn.questions()
        return JSONResponse({"questions": [q.model_dump(mode="json") for q in asked]})

    async def answer(request: Request) -> Response:
        body = await _body(request)
        question_id, action = _field(body, "question_id", str), _field(body, "action", str)
        content = body.get("content")
        turn = await agents.turn_for(str(request.path_params["turn_id"]), principal=who(request))
        try:
            asked = await turn.answer(question_id, action=action, content=content, by=DECIDED_BY)  # type: ignore[arg-type]
        except InvalidAnswer as e:
            raise Problem(400, str(e)) from None
        return JSONResponse(
            {"question_id": asked.question.id, "action": action, "later": asked.later}
        )

    async def events(request: Request) -> Response:
        after = Position.parse(request.headers.get("last-event-id"))
        chat = str(request.path_params["chat_id"])
        missing = f"no conversation {chat} (it ended long ago, or never began)"
        whom = reader(request)

        async def story() -> AsyncIterator[Event]:
            await agents.conversation_for(chat, principal=whom)
            async for event in in_words(conversation(conn.client, chat, after, conn.workflow_url)):
                yield event

        return _streaming(_sse(story(), closing, what="the conversation", missing=missing))

    memories = _memory_access(agent)

    async def in_words(
        story: AsyncIterator[Event], asker: Principal | None = None
    ) -> AsyncIterator[Event]:
        """`story` with each memory its turns recalled (recorded `[memory mem_…]`) in its
        words, as `show` prints them (`MemoryAccess.words_for`): for the customer each
        turn records as its asker (`asker`: the one turn's, read already), never the
        reader's claim; `[forgotten memory mem_…]` once forgotten. Read from the store
        once per turn, at its first step that names a memory."""
        words: dict[str, Callable[[str], str]] = {}
        async for event in story:
            step = event.data.get("step") if event.name == "step" else None
            if step is not None and _names_a_memory(step):
                turn_id = str(event.data["turn_id"])
                if turn_id not in words:
                    words[turn_id] = await memory_words(turn_id, asker)
                event = Event(
                    event.position, event.name, {**event.data, "step": _said(step, words[turn_id])}
                )
            yield event

    async def memory_words(turn_id: str, asker: Principal | None) -> Callable[[str], str]:
        if asker is None:
            asker = (await turns.opening(client.get_workflow_handle(turn_id))).asker
        try:
            return await memories.words_for(asker.user, tenant=asker.tenant)
        except (AgentClientError, MemoryUnavailable, OSError, sqlite3.Error) as e:
            # The steps matter more than the words: shown as recorded.
            log.warning("turn %s: recalled memories shown as recorded: %s", turn_id, e)
            return str

    async def turn_events(request: Request) -> Response:
        """A turn of this customer's by itself, headed by what it is a fork of."""
        turn_id = str(request.path_params["turn_id"])
        after = Position.parse(request.headers.get("last-event-id"))
        whom = reader(request)
        missing = f"no turn {turn_id} of customer {whom.user}"

        async def story() -> AsyncIterator[Event]:
            turn = await agents.turn_for(turn_id, principal=whom)
            opening = await turns.opening(turn.temporal)
            origin = Origin.of(opening.fork) if opening.fork else None
            head = {
                "turn_id": turn_id,
                "question": opening.question,
                "files": [a.name for a in opening.attachments],
                "url": conn.workflow_url(turn_id),
                "origin": {**origin.model_dump(mode="json"), "line": origin.line()}
                if origin
                else None,
            }
            async for event in in_words(one_turn(client, turn_id, head, after), opening.asker):
                yield event

        return _streaming(_sse(story(), closing, what="the turn", missing=missing, ending=True))

    async def attachment(request: Request) -> Response:
        """The n-th file of a turn of this principal's (an `<img>` or a link: a ticket
        in its URL, behind a login), read from the payload store by the reference the
        turn recorded (its conversation's or fork's files only as its lineage allows:
        `runtime.attachments.read`), as the type sniffed when it was attached. Its size
        is bounded as the turn recorded it (`attachments.MAX_BYTES`), and the bytes read
        must be those of its recorded sha256."""
        turn_id, n = str(request.path_params["turn_id"]), int(request.path_params["n"])
        turn = await agents.turn_for(turn_id, principal=reader(request))
        files = (await turns.opening(turn.temporal)).attachments
        if n >= len(files):
            raise Problem(404, f"turn {turn_id} has no file {n}")
        shown = files[n]
        try:
            data = await stored_files.read(client, turn_id, shown)
        except PayloadUnavailable as e:
            raise Problem(410, _one_line(e)) from None
        return Response(data, headers=_file_headers(shown))

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    closing = asyncio.Event()
    app = Starlette(
        routes=[
            Route("/", page),
            Route("/api/session", _guarded(session)),
            Route("/api/chats", _guarded(new_chat), methods=["POST"]),
            Route("/api/chats/{chat_id}/messages", _guarded(message), methods=["POST"]),
            Route("/api/chats/{chat_id}/events", _guarded(events)),
            Route("/api/turns/{turn_id}/events", _guarded(turn_events)),
            Route("/api/turns/{turn_id}/files/{n:int}", _guarded(attachment)),
            Route("/api/approvals", _guarded(approvals)),
            Route("/api/stream-tickets", _guarded(stream_ticket), methods=["POST"]),
            Route("/api/turns/{turn_id}/decisions", _guarded(decision), methods=["POST"]),
            Route("/api/turns/{turn_id}/questions", _guarded(questions)),
            Route("/api/turns/{turn_id}/answers", _guarded(answer), methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[
            Middleware(RequestFraming),
            Middleware(HostCheck, allowed_hosts=allowed_hosts),
        ],
    )
    app.state.closing = closing  # set by the server as it shuts down: streams end
    return app


async def _answering(client: Client, chat: ConversationInput, task_queue: str) -> AgentCard:
    """The card of the agent that answers the chat's turns on `task_queue`, as the
    current version of its deployment published it (AGENT_DEPLOYMENT, else the task
    queue); a neutral one with the agent's name when that cannot be known (workers
    without versions), never another agent's."""
    deployment = os.environ.get("AGENT_DEPLOYMENT", "").strip() or task_queue
    try:
        cards = await deployments.current_agents(client, deployment)
    except RPCError as e:
        log.warning("could not read the agents of deployment %s: %s", deployment, e.message)
        cards = None
    if cards:
        found = next((c for c in cards if c.name == chat.agent), None) if chat.agent else cards[0]
        if found is not None:
            return found
    return AgentCard.unknown(chat.agent)


def _memory_access(agent: Agent | None) -> MemoryAccess:
    """Where the chat reads the memories its turns recalled: the store of `agent`'s
    memory (`MemorySettings(name=..., store=...)`), else the folder's default one, as
    `durable-agent show` reads it."""
    memory = agent.memory if agent is not None else None
    if isinstance(memory, Memory):
        return MemoryAccess(memory.settings.name, memory.settings.store)
    return MemoryAccess()


def _names_a_memory(step: dict[str, Any]) -> bool:
    observation = step.get("observation") or {}
    return any("[memory mem_" in str(t) for t in (step.get("text"), observation.get("text")))


def _said(step: dict[str, Any], words: Callable[[str], str]) -> dict[str, Any]:
    """A step's line and its result's text (a JSON step) through `words`."""
    said = {**step, "text": words(str(step.get("text", "")))}
    if observation := step.get("observation"):
        said["observation"] = {**observation, "text": words(str(observation.get("text", "")))}
    return said


def _guarded(handler: Handler) -> Handler:
    """The handler, with writes kept to the page's own origin and every failure
    answered as one JSON line (never a blank page or a stack trace)."""

    async def guarded(request: Request) -> Response:
        try:
            if request.method == "POST":
                _same_origin_json(request)
            return await handler(request)
        except Problem as e:
            return _error(e.status, str(e), e.headers)
        except ClientDisconnect:  # gone before its body arrived (the server's deadline)
            return _error(400, "the request ended before its body did")
        except Unauthenticated as e:  # no valid bearer token: nothing else is looked at
            return _error(401, f"not signed in: {e}", {"WWW-Authenticate": "Bearer"})
        except UnknownTurn as e:  # none of that id, or another customer's: the same
            return _error(404, str(e))
        except NotAnApprover as e:  # the agent's approvers leave this user out
            return _error(403, str(e))
        except AttachmentRefused as e:  # a file of another type than it says, or too large
            return _error(422, str(e))
        except AgentClientError as e:  # the validator's or the client's own words
            return _error(409, str(e))
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return _error(404, e.message)
            log.warning("Temporal refused %s %s: %s", request.method, request.url.path, e)
            return _error(502, f"the Temporal server said: {e.message}")
        except Exception as e:
            log.exception("%s %s failed", request.method, request.url.path)
            return _error(500, f"the chat server failed: {_one_line(e)}")

    return guarded


def _same_origin_json(request: Request) -> None:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise Problem(415, "send JSON (Content-Type: application/json)")
    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.headers.get("host"):
        raise Problem(403, f"requests from {origin} are not accepted")


async def _body(request: Request, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The request's JSON object, read no further than `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise Problem(413, f"the request body is over {limit} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise Problem(413, f"the request body is over {limit} bytes")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise Problem(400, "the request body is nested too deeply") from None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise Problem(400, "the request body is not a JSON object")
    return body


class RequestFraming:
    """A request whose body length is told twice (Content-Length and Transfer-Encoding)
    is refused (400) and its connection closed: a proxy in front might read the body
    by the one and this server by the other (request smuggling)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            names = {k for k, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                response = _error(400, "send a body with Content-Length or chunked, not both")
                response.headers["Connection"] = "close"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class HostCheck:
    """Only requests to `allowed_hosts` (`*`: any) are served: a name rebound to this
    address reaches nothing (DNS rebinding). IPv6 literals (`[::1]:8080`) included."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self.allowed = tuple(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = next((v for k, v in scope["headers"] if k == b"host"), b"")
            if not host_allowed(host.decode("latin-1"), self.allowed):
                response = _error(400, "this server does not answer to that host name")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _field(body: dict[str, Any], name: str, kind: type) -> Any:
    """A field of the request's JSON object, of the type the endpoint needs."""
    value = body.get(name)
    if not isinstance(value, kind):
        raise Problem(400, f"{name}: expected a {kind.__name__}")
    return value


def _file_headers(a: Attachment) -> dict[str, str]:
    """How a served file goes to the browser: as its sniffed type and nothing else
    (`nosniff`), shown in place when an image and saved otherwise, under a policy that
    runs nothing (`FILE_POLICY`), never embedded by another site, and its URL (which may
    carry a ticket) sent nowhere."""
    ascii_name = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\;' else "_" for c in a.name
    )
    disposition = "inline" if a.content_type in IMAGES else "attachment"
    return {
        "Content-Type": f"{TEXT}; charset=utf-8" if a.content_type == TEXT else a.content_type,
        "Content-Disposition": (
            f"{disposition}; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(a.name, safe='')}"
        ),
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": FILE_POLICY,
        "Cross-Origin-Resource-Policy": "same-origin",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "private, no-store",
    }


def _files(body: dict[str, Any]) -> list[tuple[str, bytes]]:
    """A message's files (`files`: a list of `{"name", "data"}`, the data in base64), as
    `AgentClient` takes them; refused (400, 413) when not that shape, not base64, too
    many or too large together. What each is, and whether the agent takes it, the
    client checks (`AttachmentRefused`: 422)."""
    given = body.get("files", [])
    if not isinstance(given, list) or len(given) > MAX_COUNT:
        raise Problem(400, f"files: a list of at most {MAX_COUNT} {{name, data}} objects")
    files: list[tuple[str, bytes]] = []
    total = 0
    for n, f in enumerate(given, 1):
        if not isinstance(f, dict) or set(f) != {"name", "data"}:
            raise Problem(400, f"file {n}: give its name and data (base64), nothing else")
        name, data = _field(f, "name", str), _field(f, "data", str)
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            raise Problem(400, f"file {n}: its data is not base64") from None
        total += len(raw)
        if total > MAX_FILES_BYTES:
            raise Problem(413, f"a message's files are at most {MAX_FILES_BYTES:,} bytes together")
        files.append((name, raw))
    return files


def _text(body: dict[str, Any]) -> str:
    """A message's text, refused (400) when empty, too long or not text."""
    try:
        return check_question(_field(body, "text", str))
    except ValueError as e:
        raise Problem(400, str(e)) from None


async def _running(handle: WorkflowHandle) -> bool:
    try:
        return (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    except RPCError:
        return False


def _streaming(events: AsyncIterator[str]) -> Response:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _sse(
    story: AsyncIterator[Event],
    closing: asyncio.Event,
    *,
    what: str,
    missing: str,
    ending: bool = False,
) -> AsyncIterator[str]:
    """The events of `what` (a conversation, a turn) as server-sent events, until it
    ends or the server closes; `ending`: its end is an `ended` event (a conversation
    has its own). Nothing to read is a `missing` event (`missing` says what); a problem
    ends the response with a `problem` event, and EventSource comes back with its last
    event id."""
    yield f"retry: {RETRY_MS}\n\n"
    try:
        async for event in with_keepalive(story, KEEPALIVE_S, closing):
            yield event.encode() if event else ": keepalive\n\n"
        if ending and not closing.is_set():
            yield f"event: ended\ndata: {json.dumps({'reason': 'done'})}\n\n"
    except UnknownTurn:
        yield _named("missing", missing)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            yield _named("missing", missing)
        else:
            yield _named("problem", f"the Temporal server said: {e.message}")
    except Exception as e:  # the response has begun: say it in the stream
        log.exception("reading %s failed", what)
        yield _named("problem", f"reading {what} failed: {_one_line(e)}")


def _named(name: str, message: str) -> str:
    """An event with no id (reconnecting resumes after the last event that had one),
    and a slower reconnect: the problem may take a while to go away."""
    data = json.dumps({"message": message})
    return f"retry: {PROBLEM_RETRY_MS}\nevent: {name}\ndata: {data}\n\n"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _invalid(e: ValidationError) -> str:
    """A refused field, in one line: `reason: String should have at most 500 characters`."""
    first = e.errors()[0]
    return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]
