"""The help desk inside a FastAPI service of your own: ask and get JSON back, stream a
turn to the browser as server-sent events, list and decide the calls awaiting consent,
take the events a turn waits for (`wait_for_event`) as a webhook, answer the
questions an MCP server of the agent asks the person, and ask about files (multipart).

    cd examples/helpdesk
    durable-agent-worker --agent helpdesk:agent        # terminal 1: serves the agent
    uvicorn service:app --port 8000                    # terminal 2: your service

    curl -s localhost:8000/ask -H 'X-User: demo' -H 'Content-Type: application/json' \\
        -d '{"question": "Is the VPN down?"}'
    curl -s localhost:8000/ask/files -H 'X-User: demo' \\
        -F question='What does this log say?' -F files=@vpn.log

Who asks is a `Principal` from a verified JWT (`Authorization: Bearer`) when
AGENT_WEB_JWT_SECRET (HS256) or AGENT_WEB_JWKS (a JWKS file) is set, with
AGENT_WEB_JWT_ISSUER / _AUDIENCE checked when set: `sub` is the user, `tenant` the
tenant, `roles` the roles; a request without a valid token gets 401. With neither set,
it comes from the `X-User` header, for local use only; in your service it comes from
your own authentication. Each user sees and decides only the turns they started (a turn
is looked up as theirs, `turn_for`, never recognised by its id), and a support lead the
calls of their tenant's turns that the agent's approvers give them (`turn_to_decide`).
An Idempotency-Key is the user's own, and sent again with another question it is
refused (409).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import Depends, FastAPI, File, Form, Header, HTTPException, Request, UploadFile
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from durable_agent import AgentClient, AttachmentLimits, Principal, TurnResult
from durable_agent.errors import (
    AgentClientError,
    AttachmentRefused,
    InvalidEvent,
    NotAnApprover,
    NothingPending,
    NotWaiting,
    NoWorker,
    RequestConflict,
    ServerUnavailable,
    UnknownTurn,
)
from durable_agent.frontends.web.auth import Authenticator, Unauthenticated
from durable_agent.waits import MAX_EVENT_BYTES

AGENT = "helpdesk"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One client for the service's life: TEMPORAL_ADDRESS (or a temporal.toml profile)
    # says where the server is, AGENT_TASK_QUEUE where the agent's workers listen.
    app.state.agents = await AgentClient.connect()
    yield


app = FastAPI(title="Help desk", lifespan=lifespan)


def agents(request: Request) -> AgentClient:
    client: AgentClient = request.app.state.agents
    return client


LOGIN = Authenticator.from_env()
"""The JWT settings (None: the X-User header, for local use)."""


def user(
    authorization: Annotated[str | None, Header(max_length=8_192)] = None,
    x_user: Annotated[str | None, Header(min_length=1, max_length=500)] = None,
) -> Principal:
    """Who is asking. Yours comes from your authentication, never from the request body.
    Any id will do (an email, an OIDC subject): the client checks it as a customer id."""
    if LOGIN is not None:
        try:
            return LOGIN.principal(authorization)
        except Unauthenticated as e:
            raise HTTPException(
                401, f"not signed in: {e}", {"WWW-Authenticate": "Bearer"}
            ) from None
    if x_user is None:
        raise HTTPException(401, "send X-User (or configure a JWT: AGENT_WEB_JWT_SECRET)")
    return Principal(user=x_user)


Agents = Annotated[AgentClient, Depends(agents)]
User = Annotated[Principal, Depends(user)]


class Question(BaseModel):
    question: str = Field(min_length=1, max_length=4000)


class Decision(BaseModel):
    approved: bool
    reason: str = Field(default="", max_length=500)


class Reply(BaseModel):
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = None


@app.post("/ask")
async def ask(
    body: Question,
    agents: Agents,
    who: User,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> TurnResult:
    """Ask and wait for the answer. The same Idempotency-Key is the same turn: a
    client that retries after a timeout never asks twice (the key with another
    question: 409)."""
    return await agents.ask(
        body.question, agent=AGENT, principal=who, request_id=idempotency_key or ""
    )


FILES = AttachmentLimits()
"""What a question may carry here: the agent's own limits, if it has others."""


@app.post("/ask/files")
async def ask_with_files(
    question: Annotated[str, Form(min_length=1, max_length=4000)],
    files: Annotated[list[UploadFile], File()],
    agents: Agents,
    who: User,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> TurnResult:
    """`ask`, about files: multipart/form-data with `question` and `files` (once per
    file). A file whose bytes are not what its name says, or over the limits: 400, no
    turn. (The upload is whole before this runs: bound request bodies at your gateway.)"""
    if len(files) > FILES.max_count:
        raise AttachmentRefused(f"{len(files)} files; at most {FILES.max_count}")
    attached = []
    for f in files:
        data = await f.read(FILES.max_bytes + 1)
        if len(data) > FILES.max_bytes:
            raise AttachmentRefused(f"{f.filename!r} is over {FILES.max_bytes:,} bytes")
        attached.append((f.filename or "", data))
    return await agents.ask(
        question,
        agent=AGENT,
        principal=who,
        request_id=idempotency_key or "",
        attachments=attached,
    )


@app.post("/turns", status_code=202)
async def start(
    body: Question,
    agents: Agents,
    who: User,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> dict[str, str]:
    """Start a turn and return at once; follow it at `events`."""
    turn = await agents.start(
        body.question,
        agent=AGENT,
        principal=who,
        request_id=idempotency_key or "",
        stream=True,  # the answer's text as the model writes it
    )
    # An id may hold `%`, `~`, `+` (`runtime.turns.workflow_id`): a path carries it quoted.
    return {"workflow_id": turn.id, "events": f"/turns/{quote(turn.id, safe='')}/events"}


@app.get("/turns/{workflow_id}/events")
async def events(
    workflow_id: str,
    agents: Agents,
    who: User,
    last_event_id: Annotated[int, Header(ge=0, le=2**53)] = 0,
) -> StreamingResponse:
    """The turn as server-sent events: each step, the answer as it is written, then
    `done`. A browser's EventSource that reconnects sends Last-Event-ID and gets what
    it missed, nothing twice."""
    turn = await agents.turn_for(workflow_id, principal=who)  # another's: 404, as no turn

    async def stream() -> AsyncIterator[str]:
        async for offset, event in turn.events(from_offset=last_event_id):
            yield f"id: {offset + 1}\nevent: {event.type}\ndata: {event.model_dump_json()}\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


@app.get("/turns/{workflow_id}")
async def result(workflow_id: str, agents: Agents, who: User) -> TurnResult:
    """The turn's result, once it has one (this waits)."""
    return await (await agents.turn_for(workflow_id, principal=who)).result()


@app.get("/approvals")
async def approvals(agents: Agents, who: User) -> list[dict[str, Any]]:
    """The calls that wait for consent which the user sees, oldest first: those of
    their own turns, and, for a support lead, those of their tenant's turns that the
    agent's approvers give them (`role:support-lead`). `asked_by`: who asked;
    `approvers`: who may decide (empty: the asker); `decide`: where to POST a decision."""
    return [
        {
            "workflow_id": waiting.workflow_id,
            "call_id": waiting.approval.call.id,
            "tool": waiting.approval.call.name,
            "arguments": waiting.approval.call.arguments,
            "why": waiting.approval.why,
            "since": waiting.approval.since.isoformat(),
            "asked_by": waiting.asker.user if waiting.asker else "",
            "approvers": waiting.approval.approvers,
            # An id may hold `%` (`turn-acme%3Aada-…`): a path carries it quoted.
            "decide": f"/turns/{quote(waiting.workflow_id, safe='')}/approvals/"
            f"{quote(waiting.approval.call.id, safe='')}",
        }
        for waiting in await agents.pending_for(who)
    ]


@app.post("/turns/{workflow_id}/approvals/{call_id}")
async def decide(
    workflow_id: str, call_id: str, body: Decision, agents: Agents, who: User
) -> dict[str, Any]:
    """Approve or reject one waiting call; the turn goes on at once. The asker, or a
    lead of their tenant where the agent's approvers say so; anyone else: 404."""
    turn = await agents.turn_to_decide(workflow_id, principal=who)
    decided = await turn.decide(
        call_id,
        approved=body.approved,
        by=who.user,
        reason=body.reason,
        principal=who,
        via="helpdesk",
    )
    return decided.model_dump()


@app.post("/turns/{workflow_id}/events/{name}")
async def event(
    workflow_id: str, name: str, agents: Agents, who: User, request: Request
) -> dict[str, Any]:
    """A webhook: the event `name` for a turn of the user's that waits for it; the JSON
    body (at most 64 KB) is its data, which the model reads as a tool's result. The
    system that calls it authenticates as the user it acts for, as on every route here."""
    turn = await agents.turn_for(workflow_id, principal=who)  # another's: 404, as no turn
    body = b""
    async for chunk in request.stream():  # read no more than an event may be
        body += chunk
        if len(body) > 2 * MAX_EVENT_BYTES:
            raise InvalidEvent(f"event {name}: the body is over {MAX_EVENT_BYTES:,} bytes")
    try:
        data = json.loads(body) if body.strip() else None
    except (ValueError, RecursionError) as e:
        raise InvalidEvent(f"event {name}: the body is not JSON ({e})") from None
    woke = await turn.send_event(name, data, by=who.user)
    return woke.model_dump()


@app.get("/questions")
async def questions(agents: Agents, who: User) -> list[dict[str, Any]]:
    """The questions an MCP server asked during the user's turns, oldest first: its
    message, and the form it asks for (a JSON schema) or the URL to visit."""
    return [
        {"workflow_id": asked.workflow_id, **asked.question.model_dump(mode="json")}
        for asked in await agents.questions(who.user, tenant=who.tenant)
    ]


@app.post("/turns/{workflow_id}/questions/{question_id}")
async def answer(
    workflow_id: str, question_id: str, body: Reply, agents: Agents, who: User
) -> dict[str, str]:
    """Answer one: accept (with the form's fields), decline or cancel. An answer that
    does not fit the form is refused (400) before the server gets it."""
    turn = await agents.turn_for(workflow_id, principal=who)
    answered = await turn.answer(question_id, action=body.action, content=body.content, by=who.user)
    return {"question_id": answered.question.id, "action": answered.action}


# The client's errors, as HTTP answers whose body says what to do.
STATUS = {
    UnknownTurn: 404,
    NothingPending: 409,
    NotAnApprover: 403,
    NotWaiting: 409,
    InvalidEvent: 422,
    RequestConflict: 409,
    NoWorker: 503,
    ServerUnavailable: 503,
}


@app.exception_handler(AgentClientError)
async def client_error(request: Request, e: AgentClientError) -> JSONResponse:
    status = next((code for kind, code in STATUS.items() if isinstance(e, kind)), 400)
    return JSONResponse({"detail": str(e)}, status_code=status)
