"""MCP elicitation as a durable step, against a real server written with the `mcp` SDK
(tests/fakes/eliciting_server.py) whose tools ask for input in form and URL mode:
the question waits in the turn for a person, and the answer reaches the server."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentClient
from durable_agent.chat import ConversationInput
from durable_agent.elicitation import AnswerInput, Question
from durable_agent.errors import InvalidAnswer
from durable_agent.mcp import MCPConfigError, MCPServer, connected, load_config
from durable_agent.model import Reply
from durable_agent.runtime.turns import start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput
from durable_agent.workflows import AgentTurn
from tests.conftest import Harness, last_result
from tests.fakes.chat_completions import ChatCompletionsServer, text, tool_calls
from tests.test_mcp import agent_with, client_py, worker_environ, worker_process
from tests.test_web import CHROMIUM, answer, say, web_chat

pytestmark = pytest.mark.usefixtures("own_state_dir")
ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "fakes" / "eliciting_server.py"
FORM: dict[str, Any] = {"type": "object", "properties": {}}
SIGNUP = {"email": "ann@example.com", "plan": "pro", "seats": 3, "news": True}


def eliciting(log: Path, **options: Any) -> MCPServer:
    return MCPServer(name="el", command=sys.executable, args=(str(SERVER), str(log)), **options)


def ran(log: Path) -> list[str]:
    """What the server's tool got, each time it ran."""
    return log.read_text().splitlines() if log.exists() else []


def asking(tool: str) -> ScriptedModel:
    call = ToolCall(id="c1", name=f"el__{tool}", arguments={"customer": "ann"})
    return ScriptedModel(
        plans=[Reply(calls=[call])], decisions=[lambda req: Reply(text=last_result(req))]
    )


@asynccontextmanager
async def turn_asking(
    harness: Harness, tool: str, server: MCPServer
) -> AsyncIterator[tuple[Any, Question]]:
    """A turn whose call of `tool` asked a question, and that question once it waits."""
    async with (
        connected([agent_with(server)]) as agents,
        harness.worker(asking(tool), agents=agents) as task_queue,
    ):
        client = AgentClient(harness.client, task_queue=task_queue)
        handle = await start_turn(
            harness.client, TurnInput(question="Sign ann up", model="scripted"), task_queue
        )
        turn = client.turn(handle.id)
        yield turn, await first_question(turn)


async def first_question(turn: Any) -> Question:
    async with asyncio.timeout(120):
        while not (waiting := await turn.questions()):
            await asyncio.sleep(0.05)
    return waiting[0]


async def test_a_form_question_waits_for_a_person_and_the_accepted_answer_reaches_the_server(
    harness: Harness, tmp_path: Path
) -> None:
    log = tmp_path / "ran.log"
    async with turn_asking(harness, "signup", eliciting(log)) as (turn, question):
        assert question.mode == "form" and question.server == "el"
        assert question.message == "Sign ann up: which plan, and where to?"
        assert question.requested_schema is not None
        assert set(question.requested_schema["properties"]) == {"email", "plan", "seats", "news"}
        # The server heard no answer yet: its tool met an error, and ran once.
        assert len(ran(log)) == 1 and ran(log)[0].startswith("error")
        # The CLI's and every front end's listing reads it from the memo.
        listed = await turn.client.questions()
        assert [(q.workflow_id, q.question.id) for q in listed] == [(turn.id, question.id)]
        await turn.answer(question.id, action="accept", content=SIGNUP, by="alice")
        result = await turn.result()
    assert result.outcome is Outcome.ANSWERED
    got = f"accept {json.dumps(SIGNUP, sort_keys=True)}"
    assert result.answer.startswith(got)
    assert ran(log)[-1] == got
    said = [s.text for s in result.steps if s.kind is StepKind.QUESTION]
    assert said[-1] == f"el__signup: {question.id}: accept by alice"


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_decline_and_cancel_reach_the_server(
    harness: Harness, tmp_path: Path, action: str
) -> None:
    log = tmp_path / "ran.log"
    async with turn_asking(harness, "signup", eliciting(log)) as (turn, question):
        await turn.answer(action=action, by="alice")  # the turn's only question
        result = await turn.result()
    assert result.answer.startswith(action)
    assert ran(log)[-1] == action


async def test_a_url_question_carries_its_url_and_domain_and_its_answer_reaches_the_server(
    harness: Harness, tmp_path: Path
) -> None:
    log = tmp_path / "ran.log"
    async with turn_asking(harness, "verify", eliciting(log)) as (turn, question):
        assert question.mode == "url"
        assert question.url == "https://id.example.com/v/ann"
        assert question.domain == "id.example.com"
        with pytest.raises(InvalidAnswer, match="accept carries no content"):
            await turn.answer(action="accept", content={"x": 1}, by="alice")
        await turn.answer(action="accept", by="alice")
        result = await turn.result()
    assert result.answer.startswith("accept") and ran(log)[-1] == "accept"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ({**SIGNUP, "plan": "gold"}, "plan: 'gold' is not one of ['basic', 'pro']"),
        ({**SIGNUP, "seats": 500}, "seats: 500 is greater than the maximum of 50"),
        ({"email": "ann@example.com"}, "'plan' is a required property"),
        ("pro", "accept of a form carries content: a JSON object of its fields"),
    ],
)
async def test_an_answer_that_breaks_the_form_is_refused_in_one_line_and_nothing_is_sent(
    harness: Harness, tmp_path: Path, content: Any, says: str
) -> None:
    log = tmp_path / "ran.log"
    async with turn_asking(harness, "signup", eliciting(log)) as (turn, question):
        with pytest.raises(InvalidAnswer) as refused:
            await turn.answer(question.id, action="accept", content=content, by="alice")
        assert says in str(refused.value) and "\n" not in str(refused.value)
        # The turn itself refuses an answer of the wrong shape (a client that skips
        # the check), leaving the question waiting.
        given = AnswerInput(question_id=question.id, action="decline", content={"x": 1}, by="x")
        with pytest.raises(WorkflowUpdateFailedError):
            await turn.temporal.execute_update(AgentTurn.answer, given)
        assert len(ran(log)) == 1  # nothing reached the server
        assert [q.id for q in await turn.questions()] == [question.id]  # still waits
        await turn.answer(question.id, action="cancel", by="alice")
        assert (await turn.result()).answer.startswith("cancel")


async def test_no_answer_in_time_is_cancel(harness: Harness, tmp_path: Path) -> None:
    log = tmp_path / "ran.log"
    server = eliciting(log, elicitation_timeout=__import__("datetime").timedelta(seconds=1))
    async with turn_asking(harness, "signup", server) as (turn, _):
        result = await turn.result()
    assert result.answer.startswith("cancel") and ran(log)[-1] == "cancel"
    said = [s.text for s in result.steps if s.kind is StepKind.QUESTION]
    assert said[-1].endswith("cancel: no answer within 1 s")


async def test_a_server_with_elicitation_switched_off_gets_the_sdks_refusal(
    harness: Harness, tmp_path: Path
) -> None:
    log = tmp_path / "ran.log"
    async with (
        connected([agent_with(eliciting(log, elicitation=False))]) as agents,
        harness.worker(asking("signup"), agents=agents) as task_queue,
    ):
        handle = await start_turn(
            harness.client, TurnInput(question="Sign ann up", model="scripted"), task_queue
        )
        result = await handle.result()
    assert not any(s.kind is StepKind.QUESTION for s in result.steps)
    # The client declares no elicitation capability; the SDK refuses the request.
    assert ran(log) == ["error Elicitation not supported"]
    assert result.answer.startswith(ran(log)[0])


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    """A page of a headless chromium, as tests/test_web.py has it."""
    async with async_playwright() as p:
        browser: Browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
        context = await browser.new_context(viewport={"width": 900, "height": 760})
        yield await context.new_page()
        await browser.close()


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="the browser tests need chromium")
async def test_the_web_chat_draws_the_form_and_its_answer_reaches_the_server(
    harness: Harness, page: Page, tmp_path: Path
) -> None:
    """The page draws the server's form from its schema (a text field, a choice, a
    number, a yes/no); a value the form refuses is said in one line; the answer sent
    reaches the server."""
    log = tmp_path / "ran.log"
    chat = ConversationInput(customer_id="demo", model="scripted")
    async with (
        connected([agent_with(eliciting(log))]) as agents,
        harness.worker(asking("signup"), agents=agents) as task_queue,
        web_chat(harness.client, task_queue, chat) as url,
    ):
        await page.goto(url)
        await say(page, "Sign ann up")
        form = page.get_by_test_id("question")
        await expect(form.get_by_test_id("field-email")).to_be_visible(timeout=60_000)
        await expect(form).to_contain_text("Sign ann up: which plan, and where to?")
        await form.get_by_test_id("field-email").fill("ann@example.com")
        await form.get_by_test_id("field-plan").select_option("pro")
        await form.get_by_test_id("field-seats").fill("500")  # over the form's maximum
        await form.get_by_test_id("accept").click()
        await expect(page.get_by_test_id("notice").last).to_contain_text(
            "seats: 500 is greater than the maximum of 50"
        )
        assert len(ran(log)) == 1  # nothing reached the server
        await form.get_by_test_id("field-seats").fill("3")
        await form.get_by_test_id("field-news").check()
        await form.get_by_test_id("accept").click()
        await expect(answer(page, 1)).to_contain_text("accept", timeout=60_000)
        await expect(form.get_by_test_id("accept")).to_have_count(0)
    assert ran(log)[-1] == f"accept {json.dumps(SIGNUP, sort_keys=True)}"


def helpdesk_service() -> Any:
    """The FastAPI example's app (examples/helpdesk/service.py), as its file is."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "helpdesk_service", ROOT / "examples" / "helpdesk" / "service.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its annotations are resolved in its module
    spec.loader.exec_module(module)
    return module.app


async def test_the_fastapi_example_lists_and_answers_a_question_of_its_users_own_only(
    harness: Harness, tmp_path: Path
) -> None:
    """Over HTTP: `GET /questions` lists the user's questions, and
    `POST /turns/{id}/questions/{qid}` answers one, owner-checked as its approvals
    are; an answer that breaks the form is a 400 in one line."""
    import httpx

    log = tmp_path / "ran.log"
    desk = replace(agent_with(eliciting(log)), name="helpdesk", model="scripted")
    app = helpdesk_service()
    async with (
        connected([desk]) as agents,
        harness.worker(asking("signup"), agents=agents) as task_queue,
    ):
        app.state.agents = AgentClient(harness.client, task_queue=task_queue)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://desk") as http:
            ann, sam = {"X-User": "ann"}, {"X-User": "sam"}
            started = await http.post("/turns", json={"question": "Sign me up"}, headers=ann)
            turn_id = started.json()["workflow_id"]
            async with asyncio.timeout(120):
                while not (listed := (await http.get("/questions", headers=ann)).json()):
                    await asyncio.sleep(0.1)
            (asked,) = listed
            assert asked["workflow_id"] == turn_id and asked["server"] == "el"
            assert asked["requested_schema"]["required"] == ["email", "plan", "seats", "news"]
            assert (await http.get("/questions", headers=sam)).json() == []
            path = f"/turns/{turn_id}/questions/{asked['id']}"
            other = await http.post(path, json={"action": "decline"}, headers=sam)
            assert other.status_code == 404  # another's turn is no turn
            bad = await http.post(
                path, json={"action": "accept", "content": {**SIGNUP, "plan": "x"}}, headers=ann
            )
            assert bad.status_code == 400
            assert "plan: 'x' is not one of ['basic', 'pro']" in bad.json()["detail"]
            good = await http.post(path, json={"action": "accept", "content": SIGNUP}, headers=ann)
            assert good.status_code == 200, good.text
            done = await http.get(f"/turns/{turn_id}", headers=ann)
    assert done.json()["answer"].startswith(f"accept {json.dumps(SIGNUP, sort_keys=True)}")
    assert ran(log)[-1] == f"accept {json.dumps(SIGNUP, sort_keys=True)}"


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"message": "x" * 2001, "requested_schema": FORM}, "a message over 2000 characters"),
        (
            {"message": "m", "requested_schema": {**FORM, "properties": {"a": {"type": "object"}}}},
            "field 'a' is not a string, number, integer, boolean or enum",
        ),
        (
            {"message": "m", "requested_schema": {"type": "array", "items": {}}},
            "a schema that is not an object of fields",
        ),
        (
            {
                "message": "m",
                "requested_schema": {
                    **FORM,
                    "properties": {"a": {"type": "string", "description": "d" * 9000}},
                },
            },
            "a schema over 8 KB",
        ),
        (
            {
                "message": "m",
                "requested_schema": {
                    **FORM,
                    "properties": {f"f{n}": {"type": "string"} for n in range(21)},
                },
            },
            "a form has 0 to 20 properties",
        ),
        (
            {"mode": "url", "message": "m", "url": "javascript:alert(1)", "elicitation_id": "e"},
            "at a URL that is not http(s)",
        ),
    ],
)
def test_a_question_no_person_could_be_shown_fails_the_call_in_one_line(
    params: dict[str, Any], says: str
) -> None:
    """What a server may ask with is bounded; past a bound, the call fails with one line
    the model reads (`UnusableQuestion`, a tool error), and nobody is asked."""
    from mcp.types import ElicitRequestFormParams, ElicitRequestURLParams

    from durable_agent.elicitation import question_of
    from durable_agent.errors import ToolError, UnusableQuestion

    kind = ElicitRequestURLParams if params.get("mode") == "url" else ElicitRequestFormParams
    with pytest.raises(UnusableQuestion) as refused:
        question_of("el", kind.model_validate(params))
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert isinstance(refused.value, ToolError)


def test_an_accepted_form_takes_its_defaults_in_the_fields_left_out() -> None:
    """MCP's SEP-1034: the client fills a form's defaults in, before the answer is
    checked (a required field with a default may be left out); the person's own values
    stand. tests/test_mcp_conformance.py checks what a server gets from the MCP client."""
    from mcp.types import ElicitRequestFormParams

    from durable_agent.elicitation import Answer, question_of

    form = {
        "type": "object",
        "properties": {
            "email": {"type": "string"},
            "plan": {"type": "string", "enum": ["basic", "pro"], "default": "basic"},
            "seats": {"type": "integer", "default": 1},
        },
        "required": ["email", "plan"],
    }
    params = ElicitRequestFormParams(message="Which plan?", requested_schema=form)
    question = question_of("el", params)
    answer = Answer.of(question, "accept", {"email": "a@b.example", "seats": 3})
    assert answer.content == {"email": "a@b.example", "seats": 3, "plan": "basic"}
    assert Answer.of(question, "decline").content is None
    with pytest.raises(InvalidAnswer, match="'email' is a required property"):
        Answer.of(question, "accept", {})


@pytest.mark.parametrize("elicits", [True, False])
async def test_a_call_that_waits_too_long_for_its_turn_is_not_sent(
    tmp_path: Path, elicits: bool
) -> None:
    """A server that may elicit takes one call at a time (its questions must be its
    call's): a call that cannot start within `TURN_WAIT_S` is not sent, in one line (a
    write's for the model; a read's is tried again), and never taken for one that may
    have reached the server. Switched off (with sampling: a server that may sample is
    sent one call at a time too), calls overlap as before."""
    from durable_agent.errors import ToolError, ToolUnavailable
    from durable_agent.mcp import Connection

    log = tmp_path / "ran.log"
    off = {} if elicits else {"elicitation": False, "sampling": "deny"}
    connection = Connection(eliciting(log, **off))
    await connection.open()
    try:
        slow = asyncio.ensure_future(connection.call("slow", {"seconds": 15}, write=False))
        async with asyncio.timeout(60):
            while "slow started" not in ran(log):
                await asyncio.sleep(0.05)
        if elicits:
            with pytest.raises(ToolError, match="'el' is busy with another call") as busy:
                await connection.call("signup", {"customer": "ann"}, write=True)
            assert "signup was not sent: try again" in str(busy.value)
            with pytest.raises(ToolUnavailable, match="verify was not sent"):
                await connection.call("verify", {"customer": "ann"}, write=False)
            assert ran(log) == ["slow started"]  # neither reached the server
        else:
            got = await connection.call("signup", {"customer": "ann"}, write=True)
            assert got.content[0].text == "error Elicitation not supported"
            assert ran(log) == ["slow started", "error Elicitation not supported"]
        await slow
    finally:
        await connection.close()


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"elicitation": "no"}, "elicitation is true or false"),
        ({"elicitation_timeout": 0}, "elicitation_timeout is seconds"),
        ({"elicitation_timeout": 1e12}, "at most 30 days"),
    ],
)
def test_a_bad_elicitation_setting_says_what_to_fix(
    tmp_path: Path, entry: dict[str, Any], says: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"el": {"command": "x", **entry}}}))
    with pytest.raises(MCPConfigError, match=says):
        load_config(path)


def signup_worker(
    env: WorkflowEnvironment, tmp_path: Path
) -> tuple[Path, ChatCompletionsServer, Path, dict[str, str]]:
    """For a worker process whose model (the strict fake) calls the eliciting server's
    signup tool once, then says "Signed up.": the server's log, the fake, the MCP config
    and the worker's environment."""
    log = tmp_path / "ran.log"
    fake = ChatCompletionsServer()
    fake.replies = [
        tool_calls(("c1", "el__signup", json.dumps({"customer": "ann"}))),
        text("Signed up."),
    ]
    config = tmp_path / "mcp.json"
    entry = {"command": sys.executable, "args": [str(SERVER), str(log)]}
    config.write_text(json.dumps({"mcpServers": {"el": entry}}))
    return log, fake, config, worker_environ(env, tmp_path, fake)


async def test_a_worker_killed_while_the_question_waits_loses_nothing(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The question is workflow state: a worker SIGKILLed while it waits, and another
    started, takes the answer (given on the command line) and sends the call again;
    the server gets the answer."""
    log, fake, config, environ = signup_worker(env, tmp_path)
    client = AgentClient(env.client, task_queue=environ["AGENT_TASK_QUEUE"])

    def cli(*args: str) -> Awaitable[subprocess.CompletedProcess[str]]:
        return client_py(environ, *args)

    try:
        with worker_process(environ, "worker.py", "--mcp-config", str(config)) as first:
            handle = await start_turn(
                env.client,
                TurnInput(question="Sign ann up", customer_id="c-el"),
                environ["AGENT_TASK_QUEUE"],
            )
            turn = client.turn(handle.id)
            question = await first_question(turn)
            first.process.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(first.process.wait, 60) == -signal.SIGKILL
        # No worker runs: the question is still listed (from the turn's memo), and an
        # answer that breaks the form is refused all the same.
        listed = await cli("pending", "--customer", "c-el")
        assert listed.returncode == 0, listed.stderr
        assert f"{handle.id}  {question.id}  el asks: Sign ann up" in listed.stdout
        assert "form: email, plan, seats, news" in listed.stdout
        bad = await cli("answer", handle.id, "--accept", json.dumps({**SIGNUP, "seats": 0}))
        assert bad.returncode != 0
        assert "seats: 0 is less than the minimum of 1" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        # Answered while no worker runs: recorded for when one does.
        good = await cli("answer", handle.id, question.id, "--accept", json.dumps(SIGNUP))
        assert good.returncode == 0, good.stderr
        assert f"accept: el's question {question.id} (el__signup)" in good.stdout
        assert "the answer is recorded, and applies when one runs the turn" in good.stdout
        assert len(ran(log)) == 1  # the server has not heard it yet
        with worker_process(environ, "worker.py", "--mcp-config", str(config)):
            result = await turn.result()
    finally:
        fake.close()
    assert result.outcome is Outcome.ANSWERED
    assert ran(log)[-1] == f"accept {json.dumps(SIGNUP, sort_keys=True)}"
    tool_results = [m for r in fake.accepted for m in r["messages"] if m["role"] == "tool"]
    assert tool_results[-1]["content"].startswith(ran(log)[-1])


async def test_chat_asks_the_person_for_a_servers_question_and_for_its_use_of_the_model(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`client.py chat` asks inline, as it asks for a tool's consent: a form field by
    field (an answer that breaks it is said in one line, and the form asked again; a
    field left empty takes its default), then a server's request to use the model (a
    yes or no); both answers reach the real servers."""
    from tests.test_mcp_sampling import SERVER as SAMPLING_SERVER

    asked, sampled = tmp_path / "asked.log", tmp_path / "sampled.log"
    fake = ChatCompletionsServer()
    fake.replies = [
        tool_calls(("c1", "el__signup", json.dumps({"customer": "ann"}))),
        text("Signed up."),
        tool_calls(("c2", "sm__summarise", json.dumps({"text": "the report"}))),
        text("Sales rose."),  # the model's reply to the server
        text("Summarised."),
    ]
    config = tmp_path / "mcp.json"
    servers = {
        "el": {"command": sys.executable, "args": [str(SERVER), str(asked)]},
        "sm": {"command": sys.executable, "args": [str(SAMPLING_SERVER), str(sampled)]},
    }
    config.write_text(json.dumps({"mcpServers": servers}))
    environ = worker_environ(env, tmp_path, fake)
    typed = [
        "Sign ann up",
        *("y", "ann@example.com", "pro", "500", ""),  # 500 seats: over the form's maximum
        *("y", "ann@example.com", "pro", "3", ""),  # news left empty: its default, false
        "Summarise the report",
        "y",  # the sampling server may use the model
    ]
    try:
        with worker_process(environ, "worker.py", "--mcp-config", str(config)):
            chat = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "client.py", "chat"],
                cwd=ROOT,
                env=environ,
                input="\n".join(typed) + "\n",
                capture_output=True,
                text=True,
                timeout=180,
            )
    finally:
        fake.close()
    assert chat.returncode == 0, chat.stderr
    got = {"email": "ann@example.com", "news": False, "plan": "pro", "seats": 3}
    # Once asked (the call ends with the question), once answered: the refused answer
    # never reached the server.
    assert len(ran(asked)) == 2 and ran(asked)[0].startswith("error")
    assert ran(asked)[1] == f"accept {json.dumps(got, sort_keys=True)}"
    assert ran(sampled)[-1] == "sampled openai:test-model: Sales rose."
    assert "fill in the form? [y = accept / n = decline / c = cancel]" in chat.stdout
    assert "Seats (integer; required): " in chat.stdout
    assert "News (boolean; default false): " in chat.stdout
    assert "seats: 500 is greater than the maximum of 50" in chat.stderr
    assert "asks to use the agent's model" in chat.stdout and "[y/N]" in chat.stdout
    assert "agent> Signed up." in chat.stdout and "agent> Summarised." in chat.stdout


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="the browser tests need chromium")
async def test_the_web_chat_answers_a_question_that_waited_through_a_worker_sigkill(
    env: WorkflowEnvironment, page: Page, tmp_path: Path
) -> None:
    """A real MCP server's question, asked in the web chat, waits while the worker is
    SIGKILLed; after a reload (the page holds nothing the turn does not) the form is
    drawn again from the turn, answered, and the answer reaches the server through the
    worker started since."""
    log, fake, config, environ = signup_worker(env, tmp_path)
    queue = environ["AGENT_TASK_QUEUE"]
    try:
        async with web_chat(env.client, queue, ConversationInput(customer_id="demo")) as url:
            with worker_process(environ, "worker.py", "--mcp-config", str(config)) as first:
                await page.goto(url)
                await say(page, "Sign ann up")
                form = page.get_by_test_id("question")
                await expect(form.get_by_test_id("field-email")).to_be_visible(timeout=90_000)
                first.process.send_signal(signal.SIGKILL)
                assert await asyncio.to_thread(first.process.wait, 60) == -signal.SIGKILL
            assert len(ran(log)) == 1  # asked, not answered
            with worker_process(environ, "worker.py", "--mcp-config", str(config)):
                await page.reload()
                form = page.get_by_test_id("question")
                await expect(form.get_by_test_id("field-email")).to_be_visible(timeout=90_000)
                await form.get_by_test_id("field-email").fill(SIGNUP["email"])
                await form.get_by_test_id("field-plan").select_option(SIGNUP["plan"])
                await form.get_by_test_id("field-seats").fill(str(SIGNUP["seats"]))
                await form.get_by_test_id("field-news").check()
                await form.get_by_test_id("accept").click()
                await expect(answer(page, 1)).to_contain_text("Signed up.", timeout=90_000)
    finally:
        fake.close()
    assert ran(log)[-1] == f"accept {json.dumps(SIGNUP, sort_keys=True)}"
