"""The project inside a team's own application, as docs/from-your-application.md shows
it: a team folder with its own `workflows.py`, `client.py`, `worker.py`, … beside its
agent; the installed worker serves the agent there, the FastAPI service of the page
asks, streams and approves through HTTP, and a short script of the team's uses the
client directly. The write waits for consent across a SIGKILLed worker and runs once."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import jwt
import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent.runtime.server import free_port, is_listening
from tests.test_examples import HELPDESK, Process, code_blocks

BIN = Path(sys.executable).parent
BUDGET = "tenant:acme=0.12/day"
PRICES = "offline=100/1"
REFUND = "Please refund 45.00 of charge CHG-5002, the headset arrived broken."
"""Ada's question on the page: CHG-5002 is her $89.00 headset in the desk's seed."""
ASKED = {"charge_id": "CHG-5002", "amount": "45.00", "reason": "the headset arrived broken"}
"""The call the offline model makes of it, which the lead approves (the page shows it)."""
"""As docs/from-your-application.md sets them: the offline model at $100 / $1 per million
tokens in / out, and acme's day at 12 cents: a few of its turns."""
TEAM_MODULES = [
    "workflows",
    "activities",
    "client",
    "worker",
    "shop",
    "evals",
    "bench",
    "frontends",
]
"""Names every Temporal project may have: each of the team's raises when imported,
so a command that imported one in place of its own would fail."""


@pytest.fixture
def team(tmp_path: Path, env: WorkflowEnvironment) -> Iterator[tuple[Path, dict[str, str]]]:
    folder = tmp_path / "team"
    folder.mkdir()
    for name in ("helpdesk.py", "desk.py", "service.py"):
        shutil.copy(HELPDESK / name, folder / name)
    for name in TEAM_MODULES:
        (folder / f"{name}.py").write_text(
            f"raise SystemExit('the team\\'s own {name}.py was imported by durable-agent')\n"
        )
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))},
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "AGENT_TASK_QUEUE": f"team-{uuid.uuid4().hex[:6]}",
        "HELPDESK_DB": str(tmp_path / "helpdesk.db"),
        # First on the path, as a team's own code is: the team's names win there.
        "PYTHONPATH": str(folder),
    }
    yield folder, environ


def worker(folder: Path, environ: dict[str, str], agent: str = "helpdesk:agent") -> Process:
    started = Process([str(BIN / "durable-agent-worker"), "--agent", agent], folder, environ)
    line = started.line()
    assert line.startswith("worker ready"), line
    return started


def tickets(environ: dict[str, str]) -> int:
    with sqlite3.connect(environ["HELPDESK_DB"]) as db:
        opened = db.execute("SELECT count(*) FROM tickets WHERE opened_by_key IS NOT NULL")
        return int(opened.fetchone()[0])


def refunds(environ: dict[str, str], charge_id: str) -> list[int]:
    """The cents of each refund of the charge, as the desk's own records hold them."""
    with sqlite3.connect(environ["HELPDESK_DB"]) as db:
        rows = db.execute("SELECT cents FROM refunds WHERE charge_id = ?", (charge_id,))
        return [int(cents) for (cents,) in rows]


def sse(response: httpx.Response) -> Iterator[tuple[int, str, dict[str, object]]]:
    """(id, event, data) of each server-sent event."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        yield int(fields["id"]), fields["event"], json.loads(fields["data"])
        fields = {}


@contextlib.contextmanager
def service(folder: Path, environ: dict[str, str]) -> Iterator[httpx.Client]:
    """The team's FastAPI service under uvicorn, and an HTTP client of it (as `demo`)."""
    port = free_port()
    running = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "service:app", "--port", str(port)],
        cwd=folder,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not is_listening("127.0.0.1", port):
            assert running.poll() is None, running.stderr.read() if running.stderr else ""
            assert time.monotonic() < deadline, "the service did not listen"
            time.sleep(0.1)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"X-User": "demo"}, timeout=60
        ) as http:
            yield http
    finally:
        running.terminate()
        running.wait(timeout=30)


def test_a_team_service_asks_streams_and_approves_across_a_sigkill(
    team: tuple[Path, dict[str, str]],
) -> None:
    folder, environ = team
    served = worker(folder, environ)
    try:
        with service(folder, environ) as http:
            asked = http.post("/ask", json={"question": "Is the VPN down?"})
            assert asked.status_code == 200, asked.text
            assert asked.json()["outcome"] == "answered" and "degraded" in asked.json()["answer"]
            again = http.post(
                "/ask", json={"question": "Is the VPN down?"}, headers={"Idempotency-Key": "k-1"}
            )
            same = http.post(
                "/ask", json={"question": "Is the VPN down?"}, headers={"Idempotency-Key": "k-1"}
            )
            assert again.json()["workflow_id"] == same.json()["workflow_id"] == "turn-demo-k~1"

            started = http.post(
                "/turns", json={"question": "Please open a ticket: my laptop will not boot."}
            )
            assert started.status_code == 202, started.text
            turn_id = started.json()["workflow_id"]
            seen = 0
            with http.stream("GET", f"/turns/{turn_id}/events") as events:
                for offset, kind, data in sse(events):
                    assert offset == seen + 1
                    seen = offset
                    if kind == "step" and data["step"]["kind"] == "approval":  # type: ignore[index]
                        break
            # The customer's calls awaiting consent: this one (and any turn of theirs that
            # other tests left waiting, whose workers are gone).
            (waiting,) = [w for w in http.get("/approvals").json() if w["workflow_id"] == turn_id]
            assert (waiting["workflow_id"], waiting["tool"]) == (turn_id, "open_ticket")
            assert http.get("/approvals", headers={"X-User": "sam"}).json() == []
            assert http.get(f"/turns/{turn_id}", headers={"X-User": "sam"}).status_code == 404

            served.stop(signal.SIGKILL)  # while the write waits for consent
            served = worker(folder, environ)
            decided = http.post(
                f"/turns/{turn_id}/approvals/{waiting['call_id']}", json={"approved": True}
            )
            assert decided.status_code == 200 and decided.json()["approved"], decided.text
            twice = http.post(
                f"/turns/{turn_id}/approvals/{waiting['call_id']}", json={"approved": True}
            )
            assert twice.status_code == 409, twice.text

            # The stream picks up where the browser left off (Last-Event-ID): nothing twice.
            kinds = []
            with http.stream(
                "GET", f"/turns/{turn_id}/events", headers={"Last-Event-ID": str(seen)}
            ) as events:
                for offset, kind, _ in sse(events):
                    assert offset == seen + 1
                    seen = offset
                    kinds.append(kind)
            assert kinds[-1] == "done"
            result = http.get(f"/turns/{turn_id}").json()
            assert result["outcome"] == "answered" and "INC-1004" in result["answer"]
            assert http.get("/turns/turn-demo-nope").status_code == 404
            # Bad input is a clean 4xx, never a traceback or a hang.
            for bad in ("x", "-1", str(2**64)):
                refused = http.get(f"/turns/{turn_id}/events", headers={"Last-Event-ID": bad})
                assert refused.status_code == 422, (bad, refused.text)
            assert http.post("/ask", json={"question": "x" * 5000}).status_code == 422
            assert http.post("/ask", json={}, headers={"X-User": "a b"}).status_code == 422
            assert http.get("/approvals", headers={"X-User": "u" * 501}).status_code == 422
            # A question about files (multipart): answered from them; a misnamed one is
            # refused with its line, and no turn.
            log = ("vpn.log", b"The VPN gateway restarts every night at 2:00.\n", "text/plain")
            question = {"question": "When does the VPN gateway restart?"}
            asked = http.post("/ask/files", data=question, files=[("files", log)])
            assert asked.status_code == 200, asked.text
            said = asked.json()["answer"]
            assert said == "From vpn.log: The VPN gateway restarts every night at 2:00.", said
            script = ("invoice.pdf", b"#!/bin/sh\necho hi\n", "application/pdf")
            refused = http.post("/ask/files", data=question, files=[("files", script)])
            assert refused.status_code == 400, refused.text
            assert refused.json()["detail"].startswith(
                "'invoice.pdf' is a text file by its content"
            )
    finally:
        served.stop()
    assert tickets(environ) == 1


SCRIPT = """\
import asyncio

from durable_agent import AgentClient


async def main() -> None:
    agents = await AgentClient.connect()
    turn = await agents.start("Please open a ticket: the badge reader is broken.", agent="helpdesk")
    async for item in turn.events():
        if item.event.type == "step" and item.event.step.kind == "approval":
            await turn.approve(by="team-script")
    print((await turn.result()).answer)


asyncio.run(main())
"""


def test_a_team_script_asks_follows_and_approves(team: tuple[Path, dict[str, str]]) -> None:
    folder, environ = team
    (folder / "ask_desk.py").write_text(SCRIPT)
    served = worker(folder, environ)
    try:
        alone = {k: v for k, v in environ.items() if k != "PYTHONPATH"}
        runs = [
            # The script's folder first on sys.path, as `python script.py` puts it.
            ([sys.executable, "ask_desk.py"], folder, alone, None),
            # The folder on PYTHONPATH only: the script read from stdin elsewhere.
            ([sys.executable, "-"], folder.parent, environ, SCRIPT),
        ]
        for args, cwd, env, stdin in runs:
            done = subprocess.run(
                args, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
            assert "Ticket id: INC-" in done.stdout, done.stdout
            assert done.stderr == ""
    finally:
        served.stop()
    assert tickets(environ) == 2


PAGE = Path(__file__).resolve().parent.parent / "docs" / "from-your-application.md"


def test_the_page_shows_the_service_as_it_is_and_its_first_script_runs(
    team: tuple[Path, dict[str, str]],
) -> None:
    first, _, service = code_blocks(PAGE.read_text(), "python")
    assert service == (HELPDESK / "service.py").read_text()
    folder, environ = team
    (folder / "ten_lines.py").write_text(first)
    served = worker(folder, environ)
    try:
        done = subprocess.run(
            [sys.executable, "ten_lines.py"],
            cwd=folder,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
        # The installed command, in the same folder, beside the team's own modules.
        command = subprocess.run(
            [str(BIN / "durable-agent"), "ask", "--agent", "helpdesk", "Is the VPN down?"],
            cwd=folder,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        served.stop()
    assert command.returncode == 0, command.stderr
    assert "answer (answered):" in command.stdout and "degraded" in command.stdout
    assert done.returncode == 0 and done.stderr == "", done.stderr
    outcome, *_ = done.stdout.split()
    assert outcome == "answered" and "degraded" in done.stdout


def test_no_user_reaches_another_users_turn(team: tuple[Path, dict[str, str]]) -> None:
    """`bob` can neither read, stream nor decide a turn of `bob-x`'s: 404, in the words
    said of a turn that does not exist. Keys that join alike (`bob` + `x-k1`, `bob-x` +
    `k1`; `a/b` + `k1`, `a%2Fb` + `k1`) are turns of their own, each answering its own
    question; a key sent again with another question is 409, with the same one the turn."""
    folder, environ = team
    served = worker(folder, environ)
    bob, bob_x = {"X-User": "bob"}, {"X-User": "bob-x"}
    try:
        with service(folder, environ) as http:

            def ask(who: dict[str, str], key: str, question: str) -> httpx.Response:
                return http.post(
                    "/ask", json={"question": question}, headers={**who, "Idempotency-Key": key}
                )

            vpn = ask(bob, "x-k1", "Is the VPN down?")
            email = ask(bob_x, "k1", "Is email working?")
            assert vpn.status_code == email.status_code == 200, (vpn.text, email.text)
            assert vpn.json()["workflow_id"] != email.json()["workflow_id"]
            assert "vpn" in vpn.json()["answer"].lower(), vpn.json()["answer"]
            assert "email" in email.json()["answer"].lower(), email.json()["answer"]
            slashed = ask({"X-User": "a/b"}, "k1", "Is the VPN down?")
            escaped = ask({"X-User": "a%2Fb"}, "k1", "Is email working?")
            assert slashed.json()["workflow_id"] != escaped.json()["workflow_id"]
            assert "email" in escaped.json()["answer"].lower()

            again = ask(bob, "x-k1", "Is the VPN down?")
            assert again.json()["workflow_id"] == vpn.json()["workflow_id"]
            conflict = ask(bob, "x-k1", "Is payroll up?")
            assert conflict.status_code == 409, conflict.text
            assert "another request" in conflict.json()["detail"]

            started = http.post(
                "/turns",
                json={"question": "Please open a ticket: my laptop will not boot."},
                headers=bob_x,
            )
            assert started.status_code == 202, started.text
            turn_id = started.json()["workflow_id"]
            deadline = time.monotonic() + 60
            while not (
                waiting := [
                    w
                    for w in http.get("/approvals", headers=bob_x).json()
                    if w["workflow_id"] == turn_id
                ]
            ):
                assert time.monotonic() < deadline, "the ticket never waited for consent"
                time.sleep(0.2)
            call_id = waiting[0]["call_id"]
            assert all(
                w["workflow_id"] != turn_id for w in http.get("/approvals", headers=bob).json()
            )

            nowhere = f"turn-bob-{uuid.uuid4().hex[:8]}"
            tries = [
                ("GET", "/turns/{}", None),
                ("GET", "/turns/{}/events", None),
                ("POST", "/turns/{}/approvals/" + call_id, {"approved": True}),
            ]
            for who in (bob, {"X-User": "Bob-x"}, {"X-User": "bob-x-"}, {"X-User": "bob~x"}):
                for method, path, body in tries:
                    theirs = http.request(method, path.format(turn_id), json=body, headers=who)
                    none = http.request(method, path.format(nowhere), json=body, headers=who)
                    assert theirs.status_code == none.status_code == 404, (who, path, theirs.text)
                    said = theirs.json()["detail"].replace(turn_id, "ID")
                    assert said == none.json()["detail"].replace(nowhere, "ID"), said

            decided = http.post(
                f"/turns/{turn_id}/approvals/{call_id}", json={"approved": True}, headers=bob_x
            )
            assert decided.status_code == 200, decided.text
            result = http.get(f"/turns/{turn_id}", headers=bob_x).json()
            assert result["outcome"] == "answered" and "INC-" in result["answer"]
    finally:
        served.stop()
    assert tickets(environ) == 1


def test_the_service_takes_its_user_from_a_verified_jwt_only(
    team: tuple[Path, dict[str, str]],
) -> None:
    """With a JWT configured, a token with a bad signature, for another audience or
    expired gets 401 (and X-User counts for nothing); a valid one is its `sub`."""
    folder, environ = team
    secret = "the-service-shared-secret-32-bytes!!"
    environ = {**environ, "AGENT_WEB_JWT_SECRET": secret, "AGENT_WEB_JWT_AUDIENCE": "desk"}

    def bearer(key: str = secret, **claims: object) -> dict[str, str]:
        body = {"sub": "sam", "tenant": "acme", "aud": "desk", "exp": time.time() + 300}
        return {"Authorization": f"Bearer {jwt.encode({**body, **claims}, key, 'HS256')}"}

    with service(folder, environ) as http:  # it sends X-User: demo, which is ignored
        for headers in (
            {},
            bearer(key="another-secret-of-thirty-two-bytes!"),
            bearer(aud="another-service"),
            bearer(exp=time.time() - 60),
        ):
            refused = http.get("/approvals", headers=headers)
            assert refused.status_code == 401, (headers, refused.text)
            assert refused.headers["www-authenticate"] == "Bearer"
        ok = http.get("/approvals", headers=bearer())
        assert ok.status_code == 200 and ok.json() == [], ok.text


def test_a_support_lead_approves_a_customers_refund_and_the_audit_shows_it(
    team: tuple[Path, dict[str, str]],
) -> None:
    """Two tenants, JWTs: a customer of acme asks, in her own words, for a refund, which
    the desk gives to acme's support leads to decide (`helpdesk:with_leads`). acme's lead
    sees the exact call and approves it; the customer, another customer of acme and
    globex's lead cannot (a turn of another's: 404, as one that does not exist); a role
    in a token signed with another key is 401. The charge is refunded once. The audit
    shows the refund, the customer as asker and the lead as approver.
    Then acme's daily budget (the worker's, as the page sets it) stops acme's turns with
    `budget_limit`, and globex's go on."""
    folder, environ = team
    secret = "the-service-shared-secret-32-bytes!!"
    environ = {**environ, "AGENT_WEB_JWT_SECRET": secret}
    # The page's budget: a fresh dev server per session, so acme's ledger starts at $0.
    budgeted = {**environ, "AGENT_BUDGETS": BUDGET, "AGENT_MODEL_PRICES": PRICES}

    def bearer(sub: str, tenant: str, *roles: str, key: str = secret) -> dict[str, str]:
        claims = {"sub": sub, "tenant": tenant, "roles": list(roles), "exp": time.time() + 300}
        return {"Authorization": f"Bearer {jwt.encode(claims, key, 'HS256')}"}

    ada, bo = bearer("ada", "acme"), bearer("bo", "acme")
    lead, their_lead = (
        bearer("lee", "acme", "support-lead"),
        bearer("lee", "globex", "support-lead"),
    )
    forged = bearer("lee", "acme", "support-lead", key="another-secret-of-thirty-two-bytes!")
    served = worker(folder, budgeted, "helpdesk:with_leads")
    try:
        with service(folder, environ) as http:
            started = http.post("/turns", json={"question": REFUND}, headers=ada)
            assert started.status_code == 202, started.text
            turn_id = started.json()["workflow_id"]

            def listed(who: dict[str, str]) -> list[dict[str, object]]:
                shown = http.get("/approvals", headers=who)
                assert shown.status_code == 200, shown.text
                return [w for w in shown.json() if w["workflow_id"] == turn_id]

            deadline = time.monotonic() + 60
            while not (waiting := listed(lead)):
                assert time.monotonic() < deadline, "the refund never waited for consent"
                time.sleep(0.2)
            (call,) = waiting
            assert call["asked_by"] == "ada" and call["approvers"] == ["role:support-lead"]
            assert (call["tool"], call["arguments"]) == ("refund", ASKED), call
            assert listed(ada) and not listed(bo) and not listed(their_lead)
            assert http.get("/approvals", headers=forged).status_code == 401

            path = str(call["decide"])  # the id quoted: it holds `%` (`turn-acme%3Aada-…`)
            assert path == f"/turns/{quote(turn_id, safe='')}/approvals/{call['call_id']}"
            nowhere = "turn-acme%3Ax-y"
            for who in (bo, their_lead):
                theirs = http.post(path, json={"approved": True}, headers=who)
                none = http.post(
                    path.replace(quote(turn_id, safe=""), quote(nowhere, safe="")),
                    json={"approved": True},
                    headers=who,
                )
                assert theirs.status_code == none.status_code == 404, theirs.text
                said = theirs.json()["detail"].replace(turn_id, "ID")
                assert said == none.json()["detail"].replace(nowhere, "ID"), said
            assert http.post(path, json={"approved": True}, headers=forged).status_code == 401
            own = http.post(path, json={"approved": True}, headers=ada)  # not an approver
            assert own.status_code == 403 and "support-lead" in own.json()["detail"], own.text
            assert refunds(environ, "CHG-5002") == []

            decided = http.post(path, json={"approved": True}, headers=lead)
            assert decided.status_code == 200, decided.text
            result = http.get(f"/turns/{quote(turn_id, safe='')}", headers=ada).json()
            assert result["outcome"] == "answered", result
            assert result["answer"].startswith("Charge id: CHG-5002. Refunded: 45.00."), result

            # Ada asks on until acme's daily budget cannot pay for another model call.
            asked = []
            while not asked or asked[-1]["outcome"] != "budget_limit":
                assert len(asked) < 8, [a["outcome"] for a in asked]
                answered = http.post("/ask", json={"question": "Is the VPN down?"}, headers=ada)
                assert answered.status_code == 200, answered.text
                asked.append(answered.json())
            assert {a["outcome"] for a in asked[:-1]} <= {"answered"}, asked
            assert asked[-1]["answer"].startswith(
                "Sorry, I had to stop: the daily budget of tenant acme ($0.12)"
            ), asked[-1]
            again = http.post("/ask", json={"question": "Is email working?"}, headers=bo).json()
            # What is left may pay for a short call, never for a whole turn.
            assert again["outcome"] == "budget_limit" and again["usage"]["model_calls"] <= 1
            theirs = http.post("/ask", json={"question": "Is the VPN down?"}, headers=their_lead)
            assert theirs.json()["outcome"] == "answered", theirs.text
        audit = subprocess.run(
            [str(BIN / "durable-agent"), "audit", "--tenant", "acme", "--json"],
            cwd=folder,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        served.stop()
    assert refunds(environ, "CHG-5002") == [4500]
    assert audit.returncode == 0, audit.stderr
    (row,) = [r for r in map(json.loads, audit.stdout.splitlines()) if r["workflow_id"] == turn_id]
    assert (row["tenant"], row["user"], row["tool"], row["arguments"], row["ran"]) == (
        "acme",
        "ada",
        "refund",
        ASKED,
        True,
    )
    assert (row["principal"]["user"], row["principal"]["tenant"]) == ("lee", "acme")
    assert row["via"] == "helpdesk" and row["refused"] == 1 and row["approved"]
    # What ran is what the page shows.
    page = PAGE.read_text()
    assert f"AGENT_BUDGETS={BUDGET} AGENT_MODEL_PRICES={PRICES}" in page
    assert (
        json.dumps({"question": REFUND}) in page
        and json.dumps(ASKED, separators=(",", ":")) in page
    )
