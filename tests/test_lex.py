"""The Lex V2 fulfillment handler, driven with sample Lex V2 events (tests/lex_events/)
against the real dev server and an in-process worker with the offline model.

Between events, `carry` does what Lex does: the next event brings back the session
attributes of the previous answer. The handler runs in a thread, as Lambda runs it
(a synchronous call), while the worker runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, ToolContext, tool
from durable_agent.chat import ConversationState
from durable_agent.frontends import lex
from durable_agent.frontends._lexv2 import close
from durable_agent.runtime.turns import decide
from durable_agent.shop import TOOLS
from durable_agent.shop.tools import order_status
from durable_agent.tools import ToolRegistry
from durable_agent.workflows import AgentTurn, Conversation, search
from tests.conftest import Harness

EVENTS = Path(__file__).parent / "lex_events"
SESSION = "581432718822519"
SHIPPED = "order 123456 shipped on 2026-11-18 and was due by 2026-11-21: it is 3 days late"


def load(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / name).read_text())


def carry(event: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    """`event` as Lex sends it after `previous`: with the session attributes it set."""
    event["sessionState"]["sessionAttributes"] = previous["sessionState"]["sessionAttributes"]
    return event


class LambdaContext:
    """The part of Lambda's context object the handler reads."""

    def __init__(self, remaining_ms: int = 25_000) -> None:
        self.remaining_ms = remaining_ms
        self.aws_request_id = "c0ffee00-0000-4000-8000-000000000000"

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def text(response: dict[str, Any]) -> str:
    return " ".join(m["content"] for m in response["messages"])


def attrs(response: dict[str, Any]) -> dict[str, str]:
    return response["sessionState"]["sessionAttributes"]  # type: ignore[no-any-return]


def assert_lex_v2(response: dict[str, Any], *, fulfilled: bool) -> None:
    """What Lex V2 accepts from a fulfillment function that closes the intent."""
    assert json.loads(json.dumps(response)) == response
    assert set(response) <= {"sessionState", "messages", "requestAttributes"}
    state = response["sessionState"]
    assert state["dialogAction"] == {"type": "Close"}
    assert state["intent"]["name"] == "FallbackIntent"
    assert state["intent"]["state"] == ("Fulfilled" if fulfilled else "Failed")
    assert response["messages"]
    for message in response["messages"]:
        assert set(message) == {"contentType", "content"}
        assert message["contentType"] == "PlainText"
        assert 1 <= len(message["content"]) <= 1024
    for key, value in state["sessionAttributes"].items():
        assert isinstance(key, str) and key and isinstance(value, str)


async def chat_state(harness: Harness, conversation: str, exchanges: int = 0) -> ConversationState:
    """The conversation's state once it remembers `exchanges` of them: it records an
    exchange as it sees the turn end, a moment after the turn's answer is out."""
    handle = harness.client.get_workflow_handle_for(Conversation.run, conversation)
    deadline = time.monotonic() + 30
    while True:
        state = await handle.query(Conversation.state, rpc_timeout=timedelta(seconds=10))
        if len(state.exchanges) >= exchanges or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.1)


@pytest.fixture
def process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh process state (event loop and client) for the handler, closed after."""
    fresh = lex._Process()
    monkeypatch.setattr(lex, "_PROCESS", fresh)
    yield
    fresh.close()


@pytest.fixture
def handler(
    env: WorkflowEnvironment, process: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Any:
    """`handler(event)`, as Lambda calls it, connecting to the test server through the
    TEMPORAL_* settings."""
    for name in (
        *("TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_PROFILE"),
        *("AGENT_ENCRYPTION_KEY", "AGENT_ENCRYPTION_KEY_FILE"),
        *(lex.BUDGET_ENV, lex.CUSTOMER_ENV, lex.SECRET_ENV, lex.SELF_APPROVAL_ENV),
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(lex.CUSTOMER_ENV, "demo")  # the sample shop's customer, for all
    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "no-temporal.toml"))

    async def call(event: Any, *, fulfilled: bool = True) -> dict[str, Any]:
        answering = asyncio.to_thread(lex.handler, event, LambdaContext())
        response: dict[str, Any] = await asyncio.wait_for(answering, timeout=30)
        assert_lex_v2(response, fulfilled=fulfilled)
        return response

    return call


async def test_a_plain_answer_then_a_follow_up_in_the_same_conversation(
    harness: Harness, handler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness.worker() as task_queue:
        monkeypatch.setenv("AGENT_TASK_QUEUE", task_queue)
        first = await handler(load("shipped.json"))
        second = await handler(carry(load("follow_up.json"), first))
        conversation = attrs(first)["agentConversation"]
        state = await chat_state(harness, conversation, exchanges=2)

    assert SHIPPED in text(first)
    assert attrs(first)["customerId"] == "demo"  # the application's attribute, kept
    assert re.fullmatch(r"chat-demo-[0-9a-f]{8}", conversation)
    assert attrs(first)["agentTurn"] == ""
    # The follow-up names no order: the conversation's memory supplied it.
    assert "2026-11-21" in text(second) and "123456" in text(second)
    assert attrs(second)["agentConversation"] == conversation
    assert [e.question for e in state.exchanges] == [
        "Has order 123456 shipped?",
        "When will it arrive?",
    ]


async def test_a_return_waits_for_an_operator_and_the_next_utterance_gets_the_answer(
    harness: Harness,
    handler: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=lex.__name__)
    async with harness.worker() as task_queue:
        monkeypatch.setenv("AGENT_TASK_QUEUE", task_queue)
        asked = await handler(load("return_request.json"))
        turn = attrs(asked)["agentTurn"]
        still = await handler(carry(load("any_news.json"), asked))
        written_while_waiting = harness.store.returns_for("123456")
        await decide(harness.client, turn, None, approved=True, by="alice")
        answered = await handler(carry(load("any_news.json"), still))
        state = await chat_state(harness, attrs(answered)["agentConversation"])

    # The stale conversation id of the sample event belongs to no running chat:
    # a new one answers, and the turn it started is the one that waits.
    assert turn == f"{attrs(asked)['agentConversation']}-1"
    assert "start_return(order_id='123456', reason='the soap is broken')" in text(asked)
    assert "needs approval by our team" in text(asked) and turn in text(asked)
    assert f"decide with: python client.py approve {turn} " in caplog.text
    assert attrs(still)["agentTurn"] == turn and "needs approval" in text(still)
    assert written_while_waiting == []
    assert text(answered).startswith("I've started return rtn")
    assert "for order 123456" in text(answered)
    assert attrs(answered)["agentTurn"] == ""
    assert state.turns == 1  # "any news?" asked about the turn; it was no new question


async def test_a_slow_turn_says_it_is_still_working_and_answers_later(
    harness: Harness, handler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def held_order_status(args: Any, ctx: Any) -> Any:
        release.wait(timeout=4)  # below the tool's 5 s timeout
        return order_status.fn(args, ctx)

    tools = ToolRegistry(
        [dataclasses.replace(order_status, fn=held_order_status)]
        + [t for name, t in TOOLS.tools.items() if name != order_status.name]
    )
    async with harness.worker(tools=tools) as task_queue:
        monkeypatch.setenv("AGENT_TASK_QUEUE", task_queue)
        monkeypatch.setenv(lex.BUDGET_ENV, "1")
        started = time.monotonic()
        slow = await handler(load("shipped.json"))
        took = time.monotonic() - started
        release.set()
        monkeypatch.delenv(lex.BUDGET_ENV)
        later = await handler(carry(load("follow_up.json"), slow))  # a new question

    turn = attrs(slow)["agentTurn"]
    assert turn == f"{attrs(slow)['agentConversation']}-1"
    assert text(slow) == (
        f'I\'m still working on that. Ask me "any news?" in a moment (reference {turn}).'
    )
    assert took < 2.5  # the budget, and not the turn, set the pace
    # First the answer that was pending, then the new question's.
    earlier, new = (m["content"] for m in later["messages"])
    assert earlier.startswith("About your earlier question: ") and SHIPPED in earlier
    assert "2026-11-21" in new
    assert attrs(later)["agentTurn"] == ""


async def test_the_lex_user_decides_when_self_approval_is_on(
    harness: Harness, handler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(lex.SELF_APPROVAL_ENV, "1")
    async with harness.worker() as task_queue:
        monkeypatch.setenv("AGENT_TASK_QUEUE", task_queue)
        asked = await handler(load("return_request.json"))
        turn = attrs(asked)["agentTurn"]
        approved = await handler(carry(load("yes.json"), asked))
        answered = harness.client.get_workflow_handle_for(AgentTurn.run, turn).result()
        result = await asyncio.wait_for(answered, timeout=30)

    assert text(asked) == (
        "start_return(order_id='123456', reason='the soap is broken') needs your approval: "
        'say "yes" to go ahead or "no" to cancel.'
    )
    assert text(approved).startswith("I've started return rtn")
    assert attrs(approved)["agentTurn"] == ""
    decisions = [s.text for s in result.steps if s.kind.value == "decision"]
    assert decisions == [f"start_return: approved by lex:{SESSION}"]


async def test_an_ended_or_foreign_conversation_is_replaced(
    harness: Harness, handler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness.worker() as task_queue:
        monkeypatch.setenv("AGENT_TASK_QUEUE", task_queue)
        monkeypatch.setenv(lex.SECRET_ENV, SECRET)
        first = await handler(load("shipped.json"))
        ended = harness.client.get_workflow_handle_for(
            Conversation.run, attrs(first)["agentConversation"]
        )
        await ended.signal(Conversation.end)  # as after 30 idle minutes: it is over
        await asyncio.wait_for(ended.result(), timeout=20)
        after_end = await handler(carry(load("shipped.json"), first))

        alice = load("shipped.json")
        alice["sessionState"]["sessionAttributes"]["customerToken"] = lex.customer_token(
            "alice", SECRET
        )
        alices = attrs(await handler(alice))["agentConversation"]
        foreign = load("follow_up.json")  # demo's session, naming alice's chat and turn
        foreign["sessionState"]["sessionAttributes"].update(
            agentConversation=alices, agentTurn=f"{alices}-1"
        )
        not_followed = await handler(foreign)
        alice_state = await chat_state(harness, alices)

    assert SHIPPED in text(after_end)
    assert attrs(after_end)["agentConversation"] not in ("", ended.id)
    assert re.fullmatch(r"chat-demo-[0-9a-f]{8}", attrs(not_followed)["agentConversation"])
    assert "earlier question" not in text(not_followed)  # alice's answer stays hers
    assert alice_state.turns == 1


@pytest.mark.parametrize(
    ("event", "settings", "says", "logged"),
    [
        pytest.param(
            "shipped.json",
            {"TEMPORAL_ADDRESS": "127.0.0.1:1"},
            lex.TROUBLE,
            "cannot connect to Temporal at 127.0.0.1:1",
            id="no-server",
        ),
        pytest.param(
            "shipped.json",
            {"AGENT_TASK_QUEUE": "lex-nobody-polls", lex.BUDGET_ENV: "1"},
            lex.TROUBLE,
            "is a worker polling task queue 'lex-nobody-polls'?",
            id="no-worker",
        ),
        pytest.param(
            "speech_silence.json",
            {},
            "Sorry, I can't take that message: the question is empty; ask something.",
            "message refused: the question is empty",
            id="refused-message",
        ),
        pytest.param("lex_v1.json", {}, lex.NOT_UNDERSTOOD, "not a Lex V2 event", id="lex-v1"),
        pytest.param(
            "shipped.json",
            {lex.BUDGET_ENV: "soon"},
            lex.TROUBLE,
            "AGENT_LEX_BUDGET_S='soon': set the seconds to wait",
            id="bad-setting",
        ),
    ],
)
async def test_errors_get_a_polite_answer_and_a_log_line(
    handler: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    event: str,
    settings: dict[str, str],
    says: str,
    logged: str,
) -> None:
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    sent = load(event)
    started = time.monotonic()
    response = await handler(sent, fulfilled=False)
    assert text(response) == says
    assert logged in caplog.text
    # The session keeps its attributes (a V1 event has none Lex V2 would know).
    kept = sent.get("sessionState", {}).get("sessionAttributes", {})
    assert attrs(response).items() >= kept.items()
    assert time.monotonic() - started < 5


SECRET = "a-secret-the-application-and-the-function-share"


@pytest.mark.parametrize(
    ("settings", "attributes", "logged"),
    [
        pytest.param({}, {}, "no customer source: set AGENT_LEX_CUSTOMER_SECRET", id="no-source"),
        pytest.param(
            {lex.SECRET_ENV: SECRET},
            {"customerId": "alice"},
            "carries no customerToken attribute",
            id="plain-attribute",
        ),
        pytest.param(
            {lex.SECRET_ENV: SECRET},
            {"customerToken": lex.customer_token("alice", "another secret")},
            "signature does not match AGENT_LEX_CUSTOMER_SECRET",
            id="forged",
        ),
        pytest.param(
            {lex.SECRET_ENV: SECRET},
            {"customerToken": lex.customer_token("alice", SECRET, ttl_s=-1)},
            "the customerToken attribute expired",
            id="expired",
        ),
        pytest.param(
            {lex.SECRET_ENV: SECRET},
            {"customerToken": "alice:9999999999:"},
            "signature does not match",
            id="unsigned",
        ),
        pytest.param(
            {lex.SECRET_ENV: SECRET},
            {"customerToken": "alice:\u00b2:x"},
            "the customerToken attribute is not a customer token",
            id="expiry-not-ascii-digits",
        ),
        pytest.param(
            {lex.SECRET_ENV: SECRET},
            {"customerToken": "alice:" + "9" * 5000 + ":x"},
            "the customerToken attribute is not a customer token",
            id="expiry-of-5000-digits",
        ),
        pytest.param(
            {lex.SECRET_ENV: SECRET},
            {"customerToken": "alice:9999999999:\u00e9t\u00e9"},
            "signature does not match",
            id="signature-not-ascii",
        ),
        pytest.param(
            {lex.SECRET_ENV: SECRET},
            {"customerToken": "alice:9999999999:x:y"},
            "the customerToken attribute is not a customer token",
            id="four-parts",
        ),
        pytest.param(
            {lex.CUSTOMER_ENV: "demo\u202e; drop table"},
            {},
            "customer id 'demo\\u202e; drop table': customer id must be 1-500 characters",
            id="bad-id",
        ),
    ],
)
async def test_no_customer_comes_from_what_the_caller_controls(
    handler: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    settings: dict[str, str],
    attributes: dict[str, str],
    logged: str,
) -> None:
    """The session id and plain attributes are the caller's to choose: without a
    signed token or a configured customer the function answers nobody."""
    monkeypatch.delenv(lex.CUSTOMER_ENV)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    event = load("shipped.json")
    event["sessionId"] = "alice"  # a caller who picks the session id picks nothing
    event["sessionState"]["sessionAttributes"] = attributes
    response = await handler(event, fulfilled=False)
    assert text(response) == lex.TROUBLE
    assert logged in caplog.text
    assert "unexpected failure" not in caplog.text and "Traceback" not in caplog.text


def test_a_customer_token_names_its_customer_until_it_expires() -> None:
    token = lex.customer_token("alice", SECRET, ttl_s=60, now=1000)
    assert lex.verify_customer_token(token, SECRET, now=1059) == "alice"
    with pytest.raises(lex.SetupError, match="expired"):
        lex.verify_customer_token(token, SECRET, now=1061)
    with pytest.raises(lex.SetupError, match="signature"):
        lex.verify_customer_token(token.replace("alice", "bob"), SECRET, now=1000)


@pytest.mark.parametrize("event", [None, [], {"sessionState": {}}])
def test_a_malformed_event_never_makes_the_handler_raise(process: None, event: Any) -> None:
    response = lex.handler(event, LambdaContext())
    assert_lex_v2(response, fulfilled=False)
    assert text(response) == lex.NOT_UNDERSTOOD


def test_long_answers_are_split_into_messages_lex_accepts() -> None:
    answer = " ".join(["Our Returns policy says: you can return any unused item."] * 60)
    response = close({"name": "FallbackIntent"}, {}, [answer], fulfilled=True)
    assert_lex_v2(response, fulfilled=True)
    assert len(response["messages"]) == 4
    assert text(response) == answer


def test_the_budget_stops_short_of_the_lambda_timeout() -> None:
    assert lex._deadline(100.0, 20.0, LambdaContext(remaining_ms=30_000)) == 120.0
    assert lex._deadline(100.0, 20.0, LambdaContext(remaining_ms=10_000)) == 108.0
    assert lex._deadline(100.0, 20.0, None) == 120.0


class Isbn(BaseModel):
    isbn: str = Field(pattern=r"^\d{13}$", description="the book's ISBN (13 digits)")


@tool(quick=True)
def book_price(args: Isbn, ctx: ToolContext[None]) -> str:
    """Price of one book, by its ISBN."""
    return f"Book {args.isbn} costs $9.99."


async def test_the_bot_answers_as_the_agent_it_names(
    harness: Harness, handler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AGENT_LEX_AGENT: the bot's conversations are another agent's than the worker's
    first, and its tools answer."""
    bookstore = Agent(name="bookstore", tools=[book_price])
    async with harness.worker(agents=[harness.agent(), bookstore]) as task_queue:
        monkeypatch.setenv("AGENT_TASK_QUEUE", task_queue)
        monkeypatch.setenv(lex.AGENT_ENV, "bookstore")
        event = load("shipped.json")
        event["inputTranscript"] = "How much is the book 9780141187761?"
        answered = await handler(event)
        conversation = attrs(answered)["agentConversation"]
        started = await harness.client.get_workflow_handle(conversation).describe()
    assert "9780141187761" in text(answered) and "$9.99" in text(answered)
    assert started.typed_search_attributes.get(search.AGENT) == "bookstore"


def test_the_bot_names_the_agent_that_answers() -> None:
    event = lex.LexEvent.parse(load("shipped.json"))
    settings = lex.Settings.from_env({lex.AGENT_ENV: "helpdesk", lex.CUSTOMER_ENV: "demo"})
    assert lex.conversation_input(event, settings).agent == "helpdesk"
    assert lex.Settings.from_env({}).agent == ""  # the worker's first
    with pytest.raises(lex.SetupError, match="AGENT_LEX_AGENT='two words'"):
        lex.Settings.from_env({lex.AGENT_ENV: "two words"})
