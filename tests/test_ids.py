"""Ids no other customer can reach (`runtime.turns.workflow_id`), ownership by what a
turn records (`AgentClient.turn_for`, `conversation_for`), a request id reused for
another request (`RequestConflict`), and the client's errors in one line: a real
server and worker, customers of every shape, keys that collide when joined naively."""

from __future__ import annotations

import random
import string
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from durable_agent import AgentClient
from durable_agent.commands.client import workflow_id as cli_workflow_id
from durable_agent.errors import (
    AgentClientError,
    InvalidContext,
    RequestConflict,
    UnknownTurn,
)
from durable_agent.model import Reply
from durable_agent.outputs import OUTPUT_TOOL, output_spec
from durable_agent.runtime import turns
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.turns import MAX_ID_PART, chat_id, opening, turn_id, workflow_id
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import ShopStore
from durable_agent.types import OutputSpec, ToolCall, TurnInput, TurnLimits
from durable_agent.workflows import AgentTurn
from tests.conftest import Harness

ODD_CUSTOMERS = [
    "bob",
    "bob-x",
    "bob_x",
    "a/b",
    "50%",
    "%7E",
    "~",
    "josé",
    "日本の顧客",
    "bob smith",
    "a+b@example.com",
    "x" * 300,
    "é" * 300,
]
"""Customer ids of every shape a service's authentication may give."""

NAIVE_COLLISIONS = [
    # `turn-<customer>-<key>` joined plainly gave each pair one id.
    (("bob", "x-k1"), ("bob-x", "k1")),
    (("bob-", "k1"), ("bob", "-k1")),
    (("a-b-c", "d"), ("a", "b-c-d")),
    (("a~b", "c"), ("a-b", "c")),  # `-` is written `~`: a real `~` must not be
    (("a%7Eb", "c"), ("a~b", "c")),  # nor may a written escape
    (("a+b", "c"), ("a%2Bb", "c")),
    (("bob", "x/k1"), ("bob/x", "k1")),
    (("bob", " k1"), ("bob ", "k1")),
    (("x" * 300, "k"), ("x" * 301, "k")),  # both cut: the hash tells them apart
    (("x" * 299 + "a", "k"), ("x" * 299 + "b", "k")),
    (("demo", "r" + "0" * 24), ("demo", "a key/with spaces")),  # the old hashed form
]

ALPHABET = "-~%+_.@/ :abkx0123456789" + "é日\u0301\U0001f600" + string.ascii_uppercase[:3]


def random_text(rng: random.Random) -> str:
    size = rng.choice([0, 1, 2, 3, 5, 8, 30, 63, 64, 65, 80, 200, 300])
    return "".join(rng.choice(ALPHABET) for _ in range(size))


def test_no_two_customer_and_key_pairs_give_one_id() -> None:
    """Injective over 20,000 random pairs from an alphabet rich in separators, escapes,
    multi-byte characters and lengths around the cut, and over pairs that collide when
    joined naively; every id is bounded, printable ASCII, a single path segment, with
    exactly the two `-` of its structure (ids made from it, `-<n>`, `-fork-<n>`, have
    more, so they never equal one), and a command takes it as it is."""
    rng = random.Random(46)
    pairs: set[tuple[str, str]] = set()
    while len(pairs) < 20_000:
        pairs.add((random_text(rng), random_text(rng)))
    pairs |= {pair for collision in NAIVE_COLLISIONS for pair in collision}
    pairs |= {(c, k) for c in ODD_CUSTOMERS for k in ("k1", "x-k1", "")}
    seen: dict[str, tuple[str, str]] = {}
    for pair in pairs:
        made = workflow_id("turn", *pair)
        assert seen.setdefault(made, pair) == pair, (made, pair, seen[made])
        assert len(made) <= len("turn") + 2 * MAX_ID_PART + 2, made
        assert made.isascii() and made.isprintable() and " " not in made and "/" not in made
        assert made.count("-") == 2, made
        assert cli_workflow_id(made) == made
    for first, second in NAIVE_COLLISIONS:
        assert workflow_id("turn", *first) != workflow_id("turn", *second), (first, second)
    assert len(seen) == len(pairs)


def test_ids_stay_readable_where_they_can() -> None:
    assert turn_id("bob", "x-k1") == "turn-bob-x~k1"
    assert turn_id("bob-x", "k1") == "turn-bob~x-k1"
    assert turn_id("ada@example.com", "order_5.1") == "turn-ada@example.com-order_5.1"
    assert turn_id("josé", "a b") == "turn-jos%C3%A9-a%20b"
    long = turn_id("x" * 300, "k")
    assert long.startswith("turn-" + "x" * 31 + "+") and long.endswith("-k")
    assert turn_id("demo").startswith("turn-demo-") and turn_id("demo") != turn_id("demo")
    assert chat_id("bob-x").startswith("chat-bob~x-")


async def test_customers_of_every_shape_ask_and_find_only_their_own_turns(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """Each customer's request id is theirs: `bob`'s `x-k1` and `bob-x`'s `k1` are two
    turns, each answering its own question; a turn looked up as another customer's is
    `UnknownTurn`, in the very words of a turn that does not exist."""
    key = uuid.uuid4().hex[:6]
    async with harness.worker() as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        asked: dict[tuple[str, str], Any] = {}
        for (c1, k1), (c2, k2) in NAIVE_COLLISIONS[:3]:
            for customer, request in ((c1, k1), (c2, k2)):
                question = f"Has order 123456 shipped? ({customer}, {request})"
                request = f"{request}{key}"
                asked[customer, request] = await agents.start(
                    question, customer=customer, request_id=request
                )
        for customer in ODD_CUSTOMERS:
            asked[customer, key] = await agents.start(
                "Has order 123456 shipped?", customer=customer, request_id=key
            )
        ids = {turn.id for turn in asked.values()}
        assert len(ids) == len(asked)
        for (customer, request), turn in asked.items():
            assert turn.id == turn_id(customer, request)
            mine = await agents.turn_for(turn.id, customer=customer)
            result = await mine.result()
            assert result.answered and result.workflow_id == turn.id
            recorded = await opening(mine.temporal)  # each asked its own question
            assert recorded.customer_id == customer
            if request != key:
                assert recorded.question.endswith(f"({customer}, {request.removesuffix(key)})")
        bob, bob_x = asked["bob", f"x-k1{key}"], asked["bob-x", f"k1{key}"]
        with pytest.raises(UnknownTurn) as theirs:
            await agents.turn_for(bob_x.id, customer="bob")
        with pytest.raises(UnknownTurn) as nothing:
            await agents.turn_for(bob_x.id + "0", customer="bob")
        assert str(theirs.value) == str(nothing.value).replace(bob_x.id + "0", bob_x.id)
        with pytest.raises(UnknownTurn):
            await agents.turn_for(bob.id, customer="bob-x")
        for customer in ("bob ", "Bob", "bob\u200b"):
            with pytest.raises(UnknownTurn):
                await agents.turn_for(bob.id, customer=customer)
        # A conversation is no turn, and a turn no conversation.
        chat = agents.chat(customer="bob")
        first = await chat.start("Has order 123456 shipped?")
        await first.result()
        assert (await agents.conversation_for(chat.id, customer="bob")).id == chat.id
        with pytest.raises(UnknownTurn, match="no conversation with workflow id"):
            await agents.conversation_for(chat.id, customer="bob-x")
        with pytest.raises(UnknownTurn, match="no conversation with workflow id"):
            await agents.conversation_for(bob.id, customer="bob")
        with pytest.raises(UnknownTurn, match="no turn with workflow id"):
            await agents.turn_for(chat.id, customer="bob")
        assert (await agents.turn_for(first.id, customer="bob")).id == first.id
        with pytest.raises(UnknownTurn):
            await agents.turn_for(first.id, customer="bob-x")
        await chat.end()


async def test_a_request_id_with_another_request_is_a_conflict(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """The same request again is the same turn (streamed or not); the same request id
    with another question, context, agent, model, settings, limits or output type is
    refused,
    and no turn is started for it."""
    key = f"k-{uuid.uuid4().hex[:6]}"
    question = "Has order 123456 shipped?"
    async with harness.worker() as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        first = await agents.ask(question, customer="bob", request_id=key)
        again = await agents.start(question, customer="bob", request_id=key, stream=True)
        assert again.id == first.workflow_id and not again.started
        # A start that made its turn is its request's without asking the server; one
        # that found the turn there (running, or ended) asks.
        made = await agents.start(question, customer="bob", request_id=f"{key}-made")
        found = await agents.start(question, customer="bob", request_id=f"{key}-made")
        assert turns.made_by(made.temporal) and not turns.made_by(found.temporal)
        assert found.id == made.id
        others: list[dict[str, Any]] = [
            {"question": "Has order 654321 shipped?"},
            {"context": {"plan": "pro"}},
            {"agent": "helpdesk"},
            {"model": "offline,offline2"},
            {"limits": TurnLimits(max_steps=3)},
            {"output_type": output_spec(dict)},
            {"settings": {"temperature": 0.2}},
        ]
        for changed in others:
            asked = {"question": question, **changed}
            with pytest.raises(RequestConflict) as refused:
                await agents.start(asked.pop("question"), customer="bob", request_id=key, **asked)
            message = str(refused.value)
            assert "\n" not in message and repr(key) in message, message
            assert "another request" in message and first.workflow_id in message
        # Another customer's same key is theirs, and no conflict.
        theirs = await agents.ask("Has order 654321 shipped?", customer="bob-x", request_id=key)
        # A turn started before turns kept their request's hash: its input tells.
        earlier = TurnInput(question=question, customer_id="bob")
        older = f"{key}-old"
        await env.client.start_workflow(
            AgentTurn.run, earlier, id=turn_id("bob", older), task_queue=task_queue
        )
        same = await agents.start(question, customer="bob", request_id=older)
        assert same.id == turn_id("bob", older)
        with pytest.raises(RequestConflict):
            await agents.start("Has order 654321 shipped?", customer="bob", request_id=older)
        # A workflow id of the caller's naming that is a conversation's: no turn of this.
        chat = agents.chat(customer="bob")
        await (await chat.start(question)).result()
        with pytest.raises(RequestConflict, match=f"workflow id '{chat.id}' was used"):
            await agents.start_turn(earlier, workflow_id=chat.id)
        await chat.end()
        await same.result()
    assert theirs.workflow_id != first.workflow_id and theirs.answered
    assert (await agents.turn(first.workflow_id).result()).steps == first.steps


async def test_a_named_conversation_of_another_customer_gets_no_message(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    async with harness.worker() as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        named = workflow_id("chat", "bob-x", uuid.uuid4().hex[:6])
        theirs = agents.chat(customer="bob-x", conversation_id=named)
        await (await theirs.start("Has order 123456 shipped?")).result()
        mine = agents.chat(customer="bob", conversation_id=named)
        with pytest.raises(RequestConflict, match="is another customer's"):
            await mine.start("Has order 654321 shipped?")
        state = await theirs.state()
        await theirs.end()
    assert [e.question for e in state.exchanges] == ["Has order 123456 shipped?"]


@pytest.mark.parametrize(
    "context",
    [
        {"a": float("nan")},
        {"a": float("inf")},
        {"a": -float("inf")},
        {"deep": {"er": [1, 2, {"x": float("nan")}]}},
        {"list": [float("inf")]},
    ],
)
async def test_nan_and_infinity_in_a_context_are_refused(
    env: WorkflowEnvironment, context: dict[str, Any]
) -> None:
    agents = AgentClient(env.client, task_queue=f"nobody-{uuid.uuid4().hex[:6]}")
    with pytest.raises(InvalidContext, match="which JSON cannot hold") as refused:
        await agents.start("Has order 123456 shipped?", context=context)
    assert "\n" not in str(refused.value)
    with pytest.raises(InvalidContext):
        agents.chat(context=context)


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_every_error_of_the_client_is_one_line(
    env: WorkflowEnvironment, harness: Harness
) -> None:
    """Values nested too deep to serialize, too large for the server (with the payload
    store off: on, a large input is stored), and types pydantic cannot take: each an
    `AgentClientError` with one line, never the SDK's own."""
    config = env.client.config()
    config["data_converter"] = data_converter({"AGENT_PAYLOAD_STORE": "off"})
    agents = AgentClient(Client(**config), task_queue=f"nobody-{uuid.uuid4().hex[:6]}")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"context": nested(300)}, "nests lists and objects over 32 deep"),
        ({"context": nested(100_000)}, "nests lists and objects over 32 deep"),
        (
            {"output_type": OutputSpec(name="deep", json_schema=nested(300))},
            "nested too deeply to send",
        ),
        (
            {"output_type": OutputSpec(name="big", json_schema={"description": "x" * 2_100_000})},
            "too large for the Temporal server",
        ),
        (
            {"output_type": OutputSpec(name="huge", json_schema={"description": "x" * 4_300_000})},
            "too large for the Temporal server",
        ),
        ({"output_type": object()}, "pydantic cannot describe it"),
    ]
    for options, said in cases:
        with pytest.raises(AgentClientError) as refused:
            await agents.start("Has order 123456 shipped?", **options)
        message = str(refused.value)
        assert said in message and "\n" not in message and len(message) < 600, message
    with pytest.raises(AgentClientError, match="pydantic cannot describe it"):
        agents.turn("turn-demo-x", output_type=object())


class Slot(BaseModel):
    slot_id: str
    time: str


SLOT = {"slot_id": "s1", "time": "09:00"}


async def test_result_takes_what_start_takes(env: WorkflowEnvironment, harness: Harness) -> None:
    """A type or an `OutputSpec`, given to `ask`, `start` or `turn(...)`: the same
    value back, an object of the type or (a spec) its JSON; an agent's own type is the
    object too, named or not (this process has its module)."""
    final = Reply(calls=[ToolCall(id="out1", name=OUTPUT_TOOL, arguments=SLOT)])
    typed = replace(harness.agent(), output_type=Slot)
    async with harness.worker(ScriptedModel(plans=[final]), agents=[typed]) as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        by_type = await agents.ask("Book me a slot", model="scripted", output_type=Slot)
        spec = output_spec(Slot)
        by_spec = await agents.ask("Book me a slot", model="scripted", output_type=spec)
        own = await agents.ask("Book me a slot", model="scripted")
        for given in (Slot, spec, None):
            again = await agents.turn(by_type.workflow_id, output_type=given).result()
            assert again.output == (Slot(**SLOT) if given is Slot else SLOT)
        own_typed = await agents.turn(own.workflow_id, output_type=Slot).result()
    assert by_type.output == Slot(**SLOT) and by_spec.output == SLOT and own.output == Slot(**SLOT)
    assert own_typed.output == Slot(**SLOT)


async def test_a_turn_whose_payloads_this_client_cannot_read_is_one_line(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A worker that keeps payloads in a store the client does not read (TMPRL1105):
    reading the turn says so, naming the setting, in one line."""
    environ = {
        "AGENT_PAYLOAD_STORE": f"local:{tmp_path / 'payloads'}",
        "AGENT_PAYLOAD_THRESHOLD": "0",
    }
    stored = await Client.connect(
        env.client.service_client.config.target_host, data_converter=data_converter(environ)
    )
    harness = Harness(stored, ShopStore(tmp_path / "shop.db"))
    async with harness.worker() as task_queue:
        theirs = AgentClient(stored, task_queue=task_queue)
        turn = await theirs.start("Has order 123456 shipped?", customer="bob")
        assert (await turn.result()).answered
        plain = AgentClient(env.client, task_queue=task_queue)
        reads = [
            lambda: plain.turn_for(turn.id, customer="bob"),
            lambda: plain.turn(turn.id).result(),
            lambda: plain.turn(turn.id).progress(),
            lambda: anext(plain.turn(turn.id).events()),
        ]
        for read in reads:
            with pytest.raises(AgentClientError) as refused:
                await read()
            message = str(refused.value)
            assert "AGENT_PAYLOAD_STORE" in message and "\n" not in message, message
            assert turn.id in message


async def test_a_new_turn_never_takes_the_id_of_an_earlier_one(
    env: WorkflowEnvironment, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn without a request id draws its id at random (8 hex digits, which meet
    again over tens of thousands of a customer's turns): an id an earlier turn has is
    drawn again, so the earlier turn's record is never hidden behind a new run."""
    from durable_agent.runtime import turns

    taken = f"turn-c-{uuid.uuid4().hex[:8]}"
    fresh = f"turn-c-{uuid.uuid4().hex[:8]}"
    draws = iter([taken, taken, fresh])
    monkeypatch.setattr(turns, "turn_id", lambda customer, request_id="": next(draws))
    async with harness.worker() as task_queue:
        agents = AgentClient(env.client, task_queue=task_queue)
        first = await agents.start("Has order 123456 shipped?", customer="c")
        assert first.id == taken
        answered = await first.result()
        second = await agents.start("Has order 654321 shipped?", customer="c")
        assert second.id == fresh
        await second.result()
        again = await agents.turn(taken).result()  # still the first turn, one run
        assert again.answer == answered.answer
        assert (await opening(first.temporal)).question == "Has order 123456 shipped?"
