"""Who asks and who approves, on a real server and worker: the principal the application
gives reaches the tools and the instructions and finds the turn (tenant, user); an
agent's approvers decide who may approve a write, and a refused decider is in the
story; an approval covers the one exact call it was given on, so a call whose
arguments changed is asked again (never run on an earlier approval), and a fork of a
turn asks for its own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import jwt
import pytest
from pydantic import BaseModel
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from durable_agent import Agent, AgentClient, ApprovalPolicy, Principal, ToolContext, tool
from durable_agent.activities import DispatchActivity, DispatchInput
from durable_agent.approval import ApprovalDecision, consent_hash
from durable_agent.audit import AuditRow
from durable_agent.chat import ConversationInput
from durable_agent.commands.worker import build_worker
from durable_agent.errors import AgentClientError, NotAnApprover
from durable_agent.frontends.web import serve
from durable_agent.model import ModelCatalog, ModelRequest, Reply
from durable_agent.principal import DEFAULT_TENANT
from durable_agent.runtime.server import Connection, free_port, is_listening
from durable_agent.scripted import ScriptedModel
from durable_agent.serving import Agents
from durable_agent.settings import Settings
from durable_agent.types import Consent, Outcome, Step, StepKind, ToolCall, TurnProgress
from durable_agent.workflows import AgentTurn
from tests.conftest import last_result

ROOT = Path(__file__).resolve().parent.parent
CUSTOMER = Principal(tenant="acme", user="c-7", display_name="Cy")
LEAD = Principal(tenant="acme", user="lead-1", roles=("support-lead",))
OTHER_LEAD = Principal(tenant="globex", user="lead-1", roles=("support-lead",))


class Nothing(BaseModel):
    pass


class Refund(BaseModel):
    order_id: str
    amount: int


@dataclass
class Ledger:
    refunds: list[tuple[str, int, str]] = field(default_factory=list)


@tool(quick=True)
def whoami(args: Nothing, ctx: ToolContext[Ledger]) -> str:
    """Who is asking."""
    p = ctx.principal
    return f"{p.tenant}/{p.user}/{','.join(p.roles) or '-'}/{ctx.customer_id}"


@tool(side_effects=True)
def refund(args: Refund, ctx: ToolContext[Ledger]) -> str:
    """Refund an amount of an order."""
    ctx.deps.refunds.append((args.order_id, args.amount, ctx.principal.key))
    return f"refunded {args.amount} on {args.order_id}"


def instructions(context: dict[str, Any], deps: Ledger, *, principal: Principal) -> str:
    return f"You serve {principal.display_name or principal.user} of {principal.tenant}."


def call(amount: int, order: str = "o-1") -> ToolCall:
    # The same id every time, as a model may give it: an approval must not follow the id.
    return ToolCall(id="c1", name="refund", arguments={"order_id": order, "amount": amount})


def rounds(request: ModelRequest) -> int:
    """How many rounds of calls the model has made in this turn."""
    return sum(1 for m in request.messages if getattr(m, "role", "") == "assistant")


SCRIPT: dict[str, list[Callable[[ModelRequest], Reply]]] = {
    "Who am I?": [lambda r: Reply(calls=[ToolCall(id="w1", name="whoami")])],
    "Refund 10 on o-1.": [lambda r: Reply(calls=[call(10)])],
    "Refund 5 on o-3.": [lambda r: Reply(calls=[call(5, "o-3")])],
    "Refund 7 on o-9.": [lambda r: Reply(calls=[call(7, "o-9")])],
    # After its first refund ran, the model asks for the same call id with more money.
    "Refund 10 on o-2, then more.": [
        lambda r: Reply(calls=[call(10, "o-2")]),
        lambda r: Reply(calls=[call(1000, "o-2")]),
    ],
}


def plan(request: ModelRequest) -> Reply:
    return SCRIPT[request.question][0](request)


def decide(request: ModelRequest) -> Reply:
    steps = SCRIPT[request.question]
    n = rounds(request)
    return steps[n](request) if n < len(steps) else Reply(text=last_result(request))


@dataclass
class Served:
    agents: AgentClient
    ledger: Ledger
    model: ScriptedModel
    desk: Agent


@pytest.fixture(scope="module")
async def served(env: WorkflowEnvironment) -> AsyncIterator[Served]:
    """One worker for the module: the desk agent, whose refunds a support lead approves."""
    ledger = Ledger()
    model = ScriptedModel(plans=[plan], decisions=[decide])
    other = ScriptedModel(
        plans=[Reply(calls=[call(6, "o-3")])],
        decisions=[lambda r: Reply(text=last_result(r))],
    )
    desk = Agent(
        name="desk",
        instructions=instructions,
        tools=[whoami, refund],
        model="scripted",
        # A fork's model (`rerun(model="other")`): it asks for another refund.
        models={"scripted": lambda _: model, "other": lambda _: other},
        deps=ledger,
        approvals=ApprovalPolicy(approvers={"refund": "role:support-lead"}),
    )
    task_queue = f"test-{uuid.uuid4().hex[:8]}"
    settings = replace(Settings.from_env(), versioning=False, workflow_sandbox=True)
    async with build_worker(
        env.client, task_queue, agents=[desk], models=ModelCatalog({}), settings=settings
    ):
        yield Served(AgentClient(env.client, task_queue=task_queue), ledger, model, desk)


async def until(
    read: Callable[[], Awaitable[Any]], ready: Callable[[Any], bool], timeout: float = 30
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await read()
        if ready(value):
            return value
        assert time.monotonic() < deadline, value
        await _pause()


async def _pause() -> None:
    await asyncio.sleep(0.2)


async def waiting(turn: Any) -> TurnProgress:
    return await until(turn.progress, lambda p: bool(p.pending))


async def test_the_principal_reaches_a_tool_and_the_instructions_and_finds_the_turn(
    served: Served,
) -> None:
    result = await served.agents.ask("Who am I?", principal=CUSTOMER)
    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "acme/c-7/-/c-7"  # the tool read it; the customer is its user
    seen = [r.instructions for k, r in served.model.requests if r.question == "Who am I?"]
    assert seen and set(seen) == {"You serve Cy of acme."}

    # A customer named alone is the user of the default tenant.
    plain = await served.agents.ask("Who am I?", customer="c-7")
    assert plain.answer == f"{DEFAULT_TENANT}/c-7/-/c-7"

    async def ids(**by: str) -> set[str]:
        return {t.workflow_id for t in await served.agents.find(agent="desk", limit=50, **by)}

    mine = await until(lambda: ids(tenant="acme", user="c-7"), lambda f: result.workflow_id in f)
    assert plain.workflow_id not in mine  # same user id, another tenant
    assert result.workflow_id not in await ids(tenant="globex")
    default = await until(lambda: ids(tenant=DEFAULT_TENANT), lambda f: plain.workflow_id in f)
    assert result.workflow_id not in default
    listed = await client_py(served, "list", "--tenant", "acme", "--user", "c-7", "--limit", "50")
    assert result.workflow_id in listed.stdout and plain.workflow_id not in listed.stdout
    # The owner check compares the recorded principal, not the user id alone.
    await served.agents.turn_for(result.workflow_id, principal=CUSTOMER)
    with pytest.raises(AgentClientError):
        await served.agents.turn_for(result.workflow_id, customer="c-7")


async def client_py(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    """`client.py ARGS` against the module's server and task queue; exit 0."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OTEL_"))}
    environ |= {
        "TEMPORAL_ADDRESS": served.agents.temporal.service_client.config.target_host,
        "AGENT_TASK_QUEUE": served.agents.task_queue,
        "TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml",
    }
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "client.py", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out


async def test_a_customer_cannot_approve_what_needs_a_lead_and_a_lead_can(served: Served) -> None:
    turn = await served.agents.start("Refund 10 on o-1.", principal=CUSTOMER)
    (pending,) = (await waiting(turn)).pending
    assert pending.approvers == ["role:support-lead"]

    with pytest.raises(NotAnApprover, match="role 'support-lead'"):
        await turn.approve(by="cy", principal=CUSTOMER)
    with pytest.raises(NotAnApprover):  # a lead, but of another tenant
        await turn.approve(by="gl", principal=OTHER_LEAD)
    with pytest.raises(NotAnApprover):  # a name alone is no principal
        await turn.approve(by="lead-1")
    assert not served.ledger.refunds

    decided = await turn.approve(by="lead-1", principal=LEAD, via="test")
    assert decided.approved and not decided.later
    result = await turn.result()
    assert result.answer == "refunded 10 on o-1"
    assert ("o-1", 10, "acme:c-7") in served.ledger.refunds  # run for the asker

    decisions = [s for s in result.steps if s.kind is StepKind.DECISION]
    refused = [s for s in decisions if "refused a decision" in s.text]
    assert len(refused) == 3 and "(acme:c-7) may not decide" in refused[0].text
    assert all(s.consent is not None and s.consent.refused for s in refused)
    (approved,) = [s for s in decisions if s.consent is not None and not s.consent.refused]
    consent = approved.consent
    assert consent is not None
    assert consent.principal == LEAD and consent.via == "test" and consent.tool == "refund"
    assert consent.call_hash == consent_hash(call(10))


async def test_an_approval_of_arguments_a_never_lets_arguments_b_run(served: Served) -> None:
    turn = await served.agents.start("Refund 10 on o-2, then more.", principal=CUSTOMER)
    (first,) = (await waiting(turn)).pending
    await turn.approve(by="lead-1", principal=LEAD)
    # After it ran, the model asks for the same write with other arguments: asked again.
    progress = await until(
        turn.progress, lambda p: bool(p.pending) and p.pending[0].call.arguments["amount"] == 1000
    )
    (second,) = progress.pending
    assert second.call_hash == consent_hash(call(1000, "o-2")) != first.call_hash
    # The approval of the first call, given for the one waiting now, is refused.
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await turn.temporal.execute_update(
            AgentTurn.decide,
            ApprovalDecision(
                call_id=second.call.id,
                approved=True,
                by="lead-1",
                principal=LEAD,
                call_hash=first.call_hash,
            ),
        )
    assert "not the call decided on" in str(refused.value.cause)
    assert [r for r in served.ledger.refunds if r[0] == "o-2"] == [("o-2", 10, "acme:c-7")]

    await turn.reject(by="lead-1", principal=LEAD, reason="too much")
    result = await turn.result()
    assert [r for r in served.ledger.refunds if r[0] == "o-2"] == [("o-2", 10, "acme:c-7")]
    assert "declined by lead-1" in result.answer

    # And where the write happens, its dispatch runs only the call the approval covers.
    dispatch = DispatchActivity(Agents([served.desk]))
    sent = DispatchInput(
        call=call(1000, "o-2"),
        customer_id="c-7",
        idempotency_key=f"{turn.id}/9/0",
        agent="desk",
        principal=CUSTOMER,
        consent=first.call_hash,
    )
    with pytest.raises(ApplicationError) as mismatch:
        await ActivityEnvironment().run(dispatch.dispatch, sent)
    assert mismatch.value.type == "ConsentMismatch" and mismatch.value.non_retryable
    assert [r for r in served.ledger.refunds if r[0] == "o-2"] == [("o-2", 10, "acme:c-7")]


async def test_a_fork_asks_for_its_own_approval_and_the_audit_lists_each_write_once(
    served: Served,
) -> None:
    original = await served.agents.start("Refund 5 on o-3.", principal=CUSTOMER)
    await waiting(original)
    await original.approve(by="lead-1", principal=LEAD, via="first")
    first = await original.result()
    assert ("o-3", 5, "acme:c-7") in served.ledger.refunds

    # The fork's model makes another write: the original's approval does not cover it.
    fork = await served.agents.rerun(original.id, from_step=1, model="other")
    (pending,) = (await waiting(fork)).pending
    assert pending.call.arguments == {"order_id": "o-3", "amount": 6}
    with pytest.raises(NotAnApprover):
        await fork.approve(by="cy", principal=CUSTOMER)
    await fork.approve(by="lead-1", principal=LEAD, via="fork")
    forked = await fork.result()
    assert [r for r in served.ledger.refunds if r[0] == "o-3"] == [
        ("o-3", 5, "acme:c-7"),
        ("o-3", 6, "acme:c-7"),
    ]

    def taken(steps: list[Step]) -> list[Consent]:
        return [s.consent for s in steps if s.consent is not None and not s.consent.refused]

    (mine,) = taken(forked.steps)
    (theirs,) = taken(first.steps)
    assert mine.via == "fork" and theirs.via == "first"
    assert mine.call_hash == consent_hash(call(6, "o-3")) != theirs.call_hash
    assert mine.at > theirs.at

    # The audit lists each write once, with its own approval: the fork's is not the original's.
    ids = {original.id: "first", fork.id: "fork"}

    async def audited() -> list[AuditRow]:
        rows = await served.agents.audit(tenant="acme", user="c-7", limit=50)
        return [r for r in rows if r.workflow_id in ids]

    rows = await until(audited, lambda rows: len(rows) >= 2)
    assert sorted((ids[r.workflow_id], r.via, r.refused, r.ran) for r in rows) == [
        ("first", "first", 0, True),
        ("fork", "fork", 1, True),
    ]
    for row in rows:
        assert (row.tenant, row.user, row.principal) == ("acme", "c-7", LEAD)
        assert row.call_hash == consent_hash(
            ToolCall(id="-", name="refund", arguments=row.arguments)
        )
    assert {r.result for r in rows} == {"refunded 5 on o-3", "refunded 6 on o-3"}

    # The same as JSON lines, from the command line.
    out = await client_py(served, "audit", "--tenant", "acme", "--since", "1h", "--json")
    exported = [AuditRow.model_validate_json(line) for line in out.stdout.splitlines()]
    assert sorted(r.call_hash for r in exported if r.workflow_id in ids) == sorted(
        r.call_hash for r in rows
    )


SECRET = "a-shared-secret-of-the-tests-32-bytes!"


def token(secret: str = SECRET, **claims: Any) -> str:
    body = {"sub": "c-7", "tenant": "acme", "aud": "desk-web", "exp": time.time() + 300}
    return jwt.encode({**body, **claims}, secret, algorithm="HS256")


async def test_the_web_chat_takes_its_user_from_a_verified_jwt_only(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_WEB_JWT_SECRET", SECRET)
    monkeypatch.setenv("AGENT_WEB_JWT_AUDIENCE", "desk-web")
    port = free_port()
    conn = Connection(client=served.agents.temporal, ui_url=None)
    serving = asyncio.create_task(
        serve(conn, ConversationInput(agent="desk"), port=port, task_queue=served.agents.task_queue)
    )
    try:
        await until(lambda: asyncio.to_thread(is_listening, "127.0.0.1", port), bool)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

            async def session(bearer: str | None) -> httpx.Response:
                headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
                return await http.get("/api/session", headers=headers)

            refused = {
                "none": await session(None),
                "bad signature": await session(token(secret="another-secret-of-32-bytes-long!!")),
                "wrong audience": await session(token(aud="another-app")),
                "expired": await session(token(exp=time.time() - 60)),
                "no expiry": await session(token(exp=None)),
            }
            for why, response in refused.items():
                assert response.status_code == 401, (why, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
            assert "signature" in refused["bad signature"].json()["error"]
            assert "audience" in refused["wrong audience"].json()["error"]
            assert "expired" in refused["expired"].json()["error"]

            ok = await session(token(name="Cy"))
            assert ok.status_code == 200, ok.text
            assert (ok.json()["customer_id"], ok.json()["tenant"]) == ("c-7", "acme")
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def test_a_lead_sees_and_decides_the_tenants_calls_in_the_web_chat(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A customer's refund waits for a support lead: acme's lead lists it and approves
    it in the web chat; another customer of acme and globex's lead neither see it nor
    reach it (404, as a turn that does not exist)."""
    monkeypatch.setenv("AGENT_WEB_JWT_SECRET", SECRET)
    monkeypatch.setenv("AGENT_WEB_JWT_AUDIENCE", "desk-web")
    turn = await served.agents.start("Refund 7 on o-9.", principal=CUSTOMER)
    await waiting(turn)
    port = free_port()
    conn = Connection(client=served.agents.temporal, ui_url=None)
    serving = asyncio.create_task(
        serve(conn, ConversationInput(agent="desk"), port=port, task_queue=served.agents.task_queue)
    )
    lead = {"sub": "lead-1", "roles": ["support-lead"]}
    try:
        await until(lambda: asyncio.to_thread(is_listening, "127.0.0.1", port), bool)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

            def bearer(**claims: Any) -> dict[str, str]:
                return {"Authorization": f"Bearer {token(**claims)}"}

            async def listed(**claims: Any) -> list[str]:
                shown = await http.get("/api/approvals", headers=bearer(**claims))
                assert shown.status_code == 200, shown.text
                return [a["turn_id"] for a in shown.json()["approvals"]]

            async def decide(**claims: Any) -> httpx.Response:
                return await http.post(
                    f"/api/turns/{quote(turn.id, safe='')}/decisions",  # an id may hold `%`
                    json={"call_id": "c1", "approved": True},
                    headers=bearer(**claims),
                )

            assert turn.id in await listed(**lead)
            assert turn.id not in await listed(sub="c-8")
            assert turn.id not in await listed(**lead, tenant="globex")
            assert (await decide(sub="c-8")).status_code == 404
            assert (await decide(**lead, tenant="globex")).status_code == 404
            decided = await decide(**lead)
            assert decided.status_code == 200, decided.text
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    result = await turn.result()
    assert ("o-9", 7, "acme:c-7") in served.ledger.refunds
    (consent,) = [s.consent for s in result.steps if s.consent and not s.consent.refused]
    assert consent.principal is not None and consent.principal.key == "acme:lead-1"
    assert consent.via == "web"


async def test_an_event_source_opens_its_stream_with_a_ticket_not_the_jwt(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a login, a page's EventSource (no header) opens a turn's stream with a
    ticket it got with its bearer token: for that stream only, and never with the JWT
    itself in the URL; a forged or another stream's ticket is 401."""
    monkeypatch.setenv("AGENT_WEB_JWT_SECRET", SECRET)
    monkeypatch.setenv("AGENT_WEB_JWT_AUDIENCE", "desk-web")
    mine = await served.agents.ask("Who am I?", principal=CUSTOMER)
    theirs = await served.agents.ask("Who am I?", principal=LEAD)
    port = free_port()
    conn = Connection(client=served.agents.temporal, ui_url=None)
    serving = asyncio.create_task(
        serve(conn, ConversationInput(agent="desk"), port=port, task_queue=served.agents.task_queue)
    )

    def events(turn_id: str) -> str:
        return f"/api/turns/{quote(turn_id, safe='')}/events"

    try:
        await until(lambda: asyncio.to_thread(is_listening, "127.0.0.1", port), bool)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            bearer = {"Authorization": f"Bearer {token()}"}
            asked = await http.post(
                "/api/stream-tickets", json={"path": events(mine.workflow_id)}, headers=bearer
            )
            assert asked.status_code == 200, asked.text
            ticket = asked.json()["ticket"]
            assert (await http.post("/api/stream-tickets", json={"path": "/"})).status_code == 401

            async def opened(path: str, **params: str) -> tuple[int, str]:
                async with http.stream("GET", path, params=params) as response:
                    if response.status_code != 200:
                        return response.status_code, (await response.aread()).decode()
                    async for line in response.aiter_lines():
                        if line.startswith("event: "):
                            return 200, line
                return 200, ""

            status, first = await opened(events(mine.workflow_id), ticket=ticket)
            assert status == 200 and first.startswith("event: "), first
            refused = {
                "none": await opened(events(mine.workflow_id)),
                "another stream": await opened(events(theirs.workflow_id), ticket=ticket),
                "forged": await opened(events(mine.workflow_id), ticket=token()),
                "the jwt": await opened(events(mine.workflow_id), token=token()),
            }
            for why, (status, said) in refused.items():
                assert status == 401, (why, said)
            assert "another stream" in refused["another stream"][1]
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
