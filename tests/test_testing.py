"""The test kit for teams' own agents (`durable_agent.testing`): arguments TestModel makes
pass each tool's own validator, FunctionModel keeps nothing between turns, the servers do
what the kit says each can, the time-skipping clock survives turns awaited at once, and
the replay gate fails one line per history that the current code cannot continue."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from decimal import Decimal
from enum import Enum, IntEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field, HttpUrl
from temporalio.plugin import SimplePlugin

from durable_agent import Agent, ShieldSettings, ToolContext, TurnLimits, tool
from durable_agent.conversation import ToolResult, UserMessage
from durable_agent.model import ModelRequest
from durable_agent.outputs import OUTPUT_TOOL, Output
from durable_agent.stream import DoneEvent, TokensEvent
from durable_agent.testing import (
    SERVERS,
    FunctionModel,
    NoConsentAsked,
    ReplayFailed,
    Reply,
    ServerLacks,
    TestModel,
    ToolCall,
    agent_test,
    arguments_for,
    check_replays,
    latest_results,
    record_turn,
    typed_reply,
    value_for,
)
from durable_agent.tools import Tool, ToolRegistry, ToolSpec, schema_tool
from durable_agent.types import Outcome, StepKind
from durable_agent.workflows import AgentTurn

# -- arguments made from schemas ---------------------------------------------------------


class Color(str, Enum):
    RED = "red"
    GREEN = "green"


class Level(IntEnum):
    LOW = 1
    HIGH = 3


class Address(BaseModel):
    street: str = Field(min_length=3, max_length=40)
    zip: str = Field(pattern=r"^\d{5}(-\d{4})?$")
    country: Literal["DE", "FR", "US"] = "US"


class Line(BaseModel):
    sku: Annotated[str, Field(pattern=r"^[A-Z]{3}-\d{4}$")]
    quantity: int = Field(ge=1, le=99)
    price: float = Field(gt=0, lt=1000, multiple_of=0.25)


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Node(BaseModel):
    name: str
    children: list[Node] = []


class Everything(BaseModel):
    """Nested objects, enums, arrays, bounded numbers, optional fields, formats."""

    address: Address
    lines: list[Line] = Field(min_length=2, max_length=4)
    color: Color
    level: Level
    tags: set[str] = Field(min_length=3)
    pair: tuple[int, str]
    ratio: float = Field(gt=0, lt=1)
    big: int = Field(multiple_of=7, gt=50)
    amount: Decimal = Field(ge=Decimal("0.5"), le=Decimal("10"))
    code: str = Field(min_length=8, max_length=8, pattern=r"^[A-Z0-9]+$")
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]
    tree: Node
    counts: dict[str, int]
    day: dt.date
    at: dt.datetime
    when: dt.time
    wait: dt.timedelta
    id: uuid.UUID
    site: HttpUrl
    note: str | None = None
    limit: int | None = Field(default=None, ge=5, le=6)
    backup: Address | None = None


@tool
def everything(args: Everything, ctx: ToolContext[Any]) -> str:
    """Takes every kind of argument."""
    return "ok"


class Booking(BaseModel):
    room: Literal["A", "B"]
    nights: int = Field(ge=1, le=14)
    guests: list[str] = Field(min_length=1, max_length=3)
    breakfast: bool = False


@tool
def book(args: Booking, ctx: ToolContext[Any]) -> str:
    """Books a room."""
    return "booked"


DRAFT_2020 = {
    "type": "object",
    "$defs": {
        "money": {
            "type": "object",
            "properties": {
                "value": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.01},
                "currency": {"enum": ["EUR", "USD"]},
            },
            "required": ["value", "currency"],
            "additionalProperties": False,
        }
    },
    "properties": {
        "total": {"$ref": "#/$defs/money"},
        "method": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "kind": {"const": "card"},
                        "last4": {"type": "string", "pattern": "^[0-9]{4}$"},
                    },
                    "required": ["kind", "last4"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "iban"}, "iban": {"type": "string"}},
                    "required": ["kind", "iban"],
                },
            ]
        },
        "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]},
        "email": {"type": "string", "format": "email"},
        "due": {"type": "string", "format": "date-time"},
        "ref": {"type": ["string", "null"], "pattern": "^(ord|inv)_[a-f0-9]{6,8}$"},
        "priority": {"type": "integer", "enum": [1, 2, 3]},
        "extra": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "integer"},
        },
        "both": {"allOf": [{"type": "string", "minLength": 4}, {"maxLength": 6}]},
        "rows": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 100}},
                "required": ["n"],
            },
            "minItems": 3,
            "uniqueItems": True,
        },
    },
    "required": ["total", "method", "point", "email", "due", "ref", "priority", "rows"],
}


def schema_tools() -> list[Tool]:
    return [
        schema_tool("pay", "Pays an invoice.", DRAFT_2020, lambda args, ctx: "paid"),
        schema_tool(
            "lookup",
            "Looks an order up.",
            {
                "type": "object",
                "properties": {"order_id": {"type": "string", "pattern": r"^\d{6}$"}},
                "required": ["order_id"],
            },
            lambda args, ctx: "found",
        ),
    ]


VARIED = [everything, book, *schema_tools()]


@pytest.mark.parametrize("made_for", VARIED, ids=lambda t: t.name)
def test_arguments_made_for_varied_schemas_pass_the_tools_own_validators(made_for: Tool) -> None:
    made = arguments_for(made_for.spec)
    assert made.values is not None, made.note
    # The tool's own validator: pydantic's for a @tool, jsonschema's for a schema tool.
    ToolRegistry([made_for]).validate(ToolCall(id="c1", name=made_for.name, arguments=made.values))


def test_made_arguments_fill_optional_fields_and_are_deterministic() -> None:
    first = arguments_for(everything.spec).values
    assert first == arguments_for(everything.spec).values
    assert first is not None
    assert first["limit"] in (5, 6) and first["note"] == "note"  # optional, filled validly
    assert len(first["lines"]) == 2 and len(set(first["tags"])) == 3
    assert arguments_for(book.spec, seed=1).values != arguments_for(book.spec).values


def test_values_the_question_holds_are_taken_first() -> None:
    lookup = schema_tools()[1]
    assert arguments_for(lookup.spec).values == {"order_id": "000000"}
    said = arguments_for(lookup.spec, text="Where is order 654321, please?")
    assert said.values == {"order_id": "654321"}
    assert arguments_for(book.spec, text="Room B for two nights").values["room"] == "B"  # type: ignore[index]


UNMAKEABLE = [
    ({"not": {"type": "string"}}, "x"),
    ({"type": "string", "pattern": "^(?=x)y$"}, "no string"),
    ({"type": "integer", "minimum": 5, "maximum": 3}, "no integer within its bounds"),
    ({"type": "string", "minLength": 5, "maxLength": 3}, "x"),
    ({"type": "string", "pattern": r"^\p{L}+$"}, "not one Python can read"),
    ({"type": "string", "pattern": r"(?<=a)b\1"}, "x"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 10**9}, "over 10,000"),
    ({"type": "string", "minLength": 10**9}, "over 10,000"),
    ({"type": "string", "pattern": "^(a{1000}){1000}$"}, "a repeat longer than 10,000"),
    ({"type": "array", "items": {"type": "array", "minItems": 200}, "minItems": 200}, "over"),
    ({"type": "array", "minItems": "two"}, "its schema cannot be read"),
]


@pytest.mark.parametrize(("field", "why"), UNMAKEABLE, ids=lambda v: str(v)[:30])
def test_a_field_it_cannot_make_valid_is_a_note_that_names_it(
    field: dict[str, Any], why: str
) -> None:
    spec = ToolSpec(  # as an MCP server may list it: not checked before
        name="odd",
        description="Odd.",
        parameters={"type": "object", "properties": {"name": field}, "required": ["name"]},
    )
    made = arguments_for(spec)
    assert made.values is None
    assert made.note.startswith("odd: cannot make name"), made.note
    assert "\n" not in made.note and (why == "x" or why in made.note), made.note


# -- test models, in turns ---------------------------------------------------------------


class Lookup(BaseModel):
    service: Literal["email", "vpn"] = Field(description="the service")


class NewTicket(BaseModel):
    title: str = Field(min_length=5, description="what is wrong")


class Slot(BaseModel):
    service: Literal["email", "vpn"]
    up: bool
    tickets: list[int] = Field(max_length=2)


@tool(quick=True)
def service_status(args: Lookup, ctx: ToolContext[list[str]]) -> str:
    """Whether a service is up."""
    return f"{args.service} is up"


@tool(side_effects=True)
def open_ticket(args: NewTicket, ctx: ToolContext[list[str]]) -> str:
    """Open a ticket."""
    ctx.deps.append(args.title)
    return f"opened {args.title!r}"


def desk(name: str = "desk", **options: Any) -> Agent:
    """A small agent over a list of its own (the tickets it opened)."""
    options.setdefault("tools", [service_status, open_ticket])
    return Agent(name=name, deps=[], **options)


READS = TestModel(call_tools=["service_status"])
WRITES = TestModel(call_tools=["open_ticket"])


def tool_calls(result: Any) -> list[str]:
    return [c.name for s in result.steps if s.kind is StepKind.TOOL_CALL for c in s.calls]


async def test_a_test_model_calls_every_tool_once_and_says_what_it_could_not() -> None:
    agent = Agent(
        name="kinds", tools=[everything, book, *schema_tools()], shields=ShieldSettings.none()
    )
    async with agent_test(agent, model=TestModel()) as t:
        result = await t.client.ask("Book room B and pay.")

    assert result.answered
    assert sorted(tool_calls(result)) == ["book", "everything", "lookup", "pay"]
    assert not [s for s in result.steps if s.kind is StepKind.REJECTED]
    assert result.answer.splitlines() == [
        "everything: ok",
        "book: booked",
        "pay: paid",
        "lookup: found",
    ]


async def test_a_test_model_skips_a_tool_it_cannot_make_arguments_for() -> None:
    odd = schema_tool(
        "odd",
        "Odd.",
        {"type": "object", "properties": {"n": {"not": {}}}, "required": ["n"]},
        lambda args, ctx: "ran",
    )
    agent = desk(tools=[service_status, odd], shields=ShieldSettings.none())
    async with agent_test(agent, model=TestModel(text="Done.")) as t:
        turn = await t.client.start("Is the VPN up?")
        result = await turn.result()
        steps = [s.text for s in result.steps if s.kind is StepKind.PLAN]

    assert tool_calls(result) == ["service_status"] and result.answer == "Done."
    assert any("skipped odd: cannot make n: " in text for text in steps), steps


async def test_a_test_model_gives_a_typed_turn_a_valid_value() -> None:
    async with agent_test(desk(), model=READS) as t:
        made = await t.client.ask("Is the VPN up?", output_type=Slot)
    given = Slot(service="email", up=True, tickets=[1])
    async with agent_test(desk(), model=TestModel(call_tools=[], output=given)) as t:
        told = await t.client.ask("Is email up?", output_type=Slot)

    assert isinstance(made.output, Slot) and made.output.service == "vpn"
    assert tool_calls(made) == ["service_status"]
    assert told.output == given


def test_typed_reply_answers_as_the_request_asks_for_the_value() -> None:
    output = Output.of_type(list[int])
    by_tool = ModelRequest(
        messages=[UserMessage(text="n?")], tools=[output.tool()], final_tool=OUTPUT_TOOL
    )
    native = ModelRequest(messages=[UserMessage(text="n?")], output=output.spec)

    assert typed_reply(by_tool, [1, 2]).calls[0].arguments == {"result": [1, 2]}
    assert typed_reply(native, [1, 2]).text == "[1, 2]"
    with pytest.raises(TypeError, match="this turn has no output type"):
        typed_reply(ModelRequest(messages=[UserMessage(text="n?")]), 1)


def echo_with_lookup(seen: list[list[str]]):  # type: ignore[no-untyped-def]
    """A function model that looks the service up, then answers with its own question
    and the result; `seen` gets the questions each request held (for the test)."""

    async def reply(request: ModelRequest) -> Reply:
        seen.append([m.text for m in request.messages if isinstance(m, UserMessage)])
        await asyncio.sleep(0.05)  # turns at once interleave here
        results = latest_results(request.messages)
        if results:
            return Reply(text=f"{request.question} -> {results[0].text}")
        service = "vpn" if "vpn" in request.question.lower() else "email"
        return Reply(
            calls=[ToolCall(id="s", name="service_status", arguments={"service": service})]
        )

    return reply


async def test_two_turns_with_one_function_model_share_nothing() -> None:
    seen: list[list[str]] = []
    model = FunctionModel(echo_with_lookup(seen))
    async with agent_test(desk(), model=model) as t:
        first = await t.client.ask("Is the VPN up?")
        second = await t.client.ask("Is email up?")
        together = await asyncio.gather(*(t.client.ask(f"Is email up? ({n})") for n in range(4)))

    assert first.answer == "Is the VPN up? -> vpn is up"
    assert second.answer == "Is email up? -> email is up"
    assert [r.answer for r in together] == [f"Is email up? ({n}) -> email is up" for n in range(4)]
    # Each request held its own turn's question, alone: no other turn's conversation.
    assert all(len(questions) == 1 for questions in seen), seen
    assert len(seen) == 2 * 6
    with pytest.raises(AttributeError):
        model.calls = []  # type: ignore[attr-defined]  # nowhere to keep anything


async def test_a_reply_a_function_shares_between_turns_is_not_changed_by_them() -> None:
    """The model-call activity names calls and counts usage on the reply it gets: each
    turn gets a copy, so a reply kept in a constant stays as it was written."""
    shared = Reply(calls=[ToolCall(id="", name="service_status", arguments={"service": "vpn"})])

    def reply(request: ModelRequest) -> Reply:
        return Reply(text="done") if latest_results(request.messages) else shared

    async with agent_test(desk(), model=FunctionModel(reply)) as t:
        results = await asyncio.gather(*(t.client.ask("Is the VPN up?") for _ in range(3)))

    assert [r.answer for r in results] == ["done"] * 3
    assert shared.calls[0].id == "" and shared.usage.model_calls == 0


async def test_a_function_that_returns_no_reply_ends_the_turn_as_a_model_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with agent_test(desk(), model=FunctionModel(lambda request: 42, name="broken")) as t:  # type: ignore[arg-type,return-value]
        result = await t.client.ask("Is the VPN up?")

    assert result.outcome is Outcome.MODEL_ERROR
    assert "FunctionModel broken: its function returned int; return a Reply" in caplog.text


async def test_a_streamed_turn_gets_the_test_models_text_as_it_is_written() -> None:
    async with agent_test(desk(), model=FunctionModel(lambda r: "All systems are up.")) as t:
        turn = await t.client.start("Is email up?", stream=True)
        events = [item.event async for item in turn.events()]

    written = "".join(e.text for e in events if isinstance(e, TokensEvent))
    assert written == "All systems are up."  # as it wrote it, before the answer step


async def test_the_override_replaces_every_model_and_leaves_the_agent_as_it_was() -> None:
    built: list[str] = []

    def own(arg: str) -> Any:
        built.append(arg)
        raise AssertionError("the agent's own model must not be built")

    agent = desk(model="mine:big", models={"mine": own})
    fingerprint = agent.fingerprint()
    async with agent_test(agent, model=READS) as t:
        result = await t.client.ask("Is email up?")

    assert tool_calls(result) == ["service_status"] and built == []
    assert agent.model == "mine:big" and agent.fingerprint() == fingerprint == result.fingerprint


# -- what each server does ---------------------------------------------------------------


@pytest.mark.parametrize("server", SERVERS)
async def test_turns_consent_forks_chats_and_sub_agents_on_each_server(server: Any) -> None:
    expert = desk("expert", tools=[service_status])
    agent = desk(tools=[service_status, open_ticket, expert.as_tool(description="Asks IT.")])
    async with agent_test(
        agent, model=TestModel(call_tools=["service_status", "expert"]), server=server
    ) as t:
        asked = await t.client.ask("Is the VPN up?")
        events = [item.event async for item in t.client.turn(asked.workflow_id).events()]
        rerun = await (await t.client.rerun(asked.workflow_id, from_step=1)).result()
        replayed = await (await t.client.replay(asked.workflow_id)).result()
        chat = t.client.chat()
        said = [await chat.send("Is the VPN up?"), await chat.send("And email?")]
        typed = await t.client.ask("Is the VPN up?", output_type=Slot)

    assert asked.answered and "service_status: vpn is up" in asked.answer
    assert "expert: service_status: email is up" in asked.answer  # the sub-agent's turn
    assert isinstance(events[-1], DoneEvent)
    assert rerun.answered and replayed.answered
    assert all(r.answered for r in said)
    assert isinstance(typed.output, Slot)


@pytest.mark.parametrize("server", SERVERS)
async def test_approve_and_reject_on_each_server(server: Any) -> None:
    agent = desk()
    async with agent_test(agent, model=WRITES, server=server) as t:
        approved = await t.client.start("Open a ticket: the printer is on fire.")
        await t.waiting(approved)
        await approved.approve(by="alice")  # no call id: the turn's only one
        declined = await t.client.start("Open a ticket: the printer is on fire.")
        [waiting] = await t.waiting(declined)
        await declined.reject(waiting.call.id, by="alice", reason="no")
        done = [await approved.result(), await declined.result()]
        with pytest.raises(NoConsentAsked, match="ended without asking for consent"):
            await t.waiting(approved)

    assert "open_ticket: opened 'title'" in done[0].answer
    assert "declined" in done[1].answer
    assert agent.deps == ["title"]


async def test_what_the_time_skipping_server_lacks_is_one_line() -> None:
    async with agent_test(desk(), model=READS) as t:
        await t.client.ask("Is email up?")
        with pytest.raises(ServerLacks) as found:
            await t.client.find()
        with pytest.raises(ServerLacks, match="a turn's own pending"):
            await t.client.pending()

    assert str(found.value) == (
        "AgentClient.find needs a visibility store and search attributes, which the "
        "time-skipping test server does not have: run this test on the dev server, "
        'agent_test(..., server="dev")'
    )


async def test_the_dev_server_finds_turns() -> None:
    async with agent_test(desk(), model=READS, server="dev") as t:
        asked = await t.client.ask("Is email up?", agent="desk")
        for _ in range(100):  # its visibility store lists a turn a moment after it ends
            found = await t.client.find(agent="desk")
            if found:
                break
            await asyncio.sleep(0.1)

    assert [row.workflow_id for row in found] == [asked.workflow_id]


async def test_a_chats_turn_skips_its_durable_wait_too() -> None:
    """A chat's turns are picked up by id: their results run the clock as well."""
    limits = TurnLimits(approval_timeout=dt.timedelta(days=3))
    async with agent_test(desk(), model=WRITES) as t:
        chat = t.client.chat(limits=limits)
        result = await asyncio.wait_for(chat.send("Open a ticket: the printer is on fire."), 60)
        took = await t.workflow_time(t.client.turn(result.workflow_id))

    assert "nobody approved open_ticket" in result.answer
    assert took >= dt.timedelta(days=3)


@pytest.mark.parametrize("server", SERVERS)
async def test_turns_awaited_at_once_all_answer(server: Any) -> None:
    """Six at a time, five times. On the time-skipping server the clock runs while any
    is awaited, and never through a workflow task in flight (each waiter unlocking it
    on its own lost turns)."""
    model = FunctionModel(echo_with_lookup([]))
    async with agent_test(desk(), model=model, server=server) as t:
        for _ in range(5):
            results = await asyncio.gather(*(t.client.ask(f"Is email up? {n}") for n in range(6)))
            assert [r.answer for r in results] == [
                f"Is email up? {n} -> email is up" for n in range(6)
            ]


async def test_skip_moves_the_clock_while_a_turn_waits() -> None:
    limits = TurnLimits(approval_timeout=dt.timedelta(hours=2))
    async with agent_test(desk(), model=WRITES) as t:
        turn = await t.client.start("Open a ticket: the printer is on fire.", limits=limits)
        await t.waiting(turn)
        await t.skip(dt.timedelta(hours=3))
        for _ in range(300):  # the clock stands still again: only the skip moved it
            progress = await turn.progress()
            if progress.done:
                break
            await asyncio.sleep(0.1)

    assert progress.done and "nobody approved open_ticket" in progress.steps[-1].text


# -- the replay gate ---------------------------------------------------------------------


async def recorded(folder: Path, agent: Agent, names: list[str]) -> None:
    async with agent_test(agent, model=READS) as t:
        for name in names:
            turn = await t.client.start("Is the VPN up?", agent=agent.name)
            await turn.result()
            await record_turn(turn, folder, name)


async def test_recorded_turns_replay_and_a_changed_workflow_fails_one_line_each(
    tmp_path: Path,
) -> None:
    from tests.drill_worker import ChangedTurn

    agent = desk()
    await recorded(tmp_path, agent, ["first", "second"])
    assert [p.name for p in await check_replays(tmp_path, agent)] == ["first.json", "second.json"]
    # Your worker's own plugin, changing what the turn does (as a new release might).
    changed = SimplePlugin(
        "changed",
        workflows=lambda given: [ChangedTurn, *(w for w in given or [] if w is not AgentTurn)],
    )
    with pytest.raises(ReplayFailed) as failed:
        await check_replays(tmp_path, agent, plugins=[changed])

    header, *lines = str(failed.value).splitlines()
    assert header == f"2 of 2 recorded turns in {tmp_path} cannot continue on this code:"
    assert [line.split(": ")[:2] for line in lines] == [
        ["first.json", "NondeterminismError"],
        ["second.json", "NondeterminismError"],
    ]
    # The failure's own words, not the SDK's wrapping of them.
    assert all("] Nondeterminism error: " in line and "Failure {" not in line for line in lines)


async def test_a_changed_agent_replays_and_a_removed_one_fails(tmp_path: Path) -> None:
    await recorded(tmp_path, desk(), ["vpn"])
    changed = desk(instructions="Be brief.", tools=[service_status, open_ticket, book])
    assert changed.fingerprint() != desk().fingerprint()
    await check_replays(tmp_path, changed)  # what a turn got from its agent is in its history

    with pytest.raises(ReplayFailed) as failed:
        await check_replays(tmp_path, desk("helpdesk"))
    assert str(failed.value).splitlines()[1:] == [
        "vpn.json: its agent 'desk' is not among the agents given (helpdesk); a worker of "
        "this code would end it unknown_agent"
    ]


async def test_a_turn_that_continued_as_new_is_recorded_run_by_run(tmp_path: Path) -> None:
    def reads(request: ModelRequest) -> Reply:
        if sum(isinstance(m, ToolResult) for m in request.messages) >= 6:
            return Reply(text="read them all")
        return Reply(calls=[ToolCall(id="", name="service_status", arguments={"service": "vpn"})])

    limits = TurnLimits(max_steps=8, continue_after_events=40)
    async with agent_test(desk(), model=FunctionModel(reads)) as t:
        turn = await t.client.start("Read the status six times.", limits=limits)
        result = await turn.result()
        files = await record_turn(turn, tmp_path, "long")

    assert result.answer == "read them all" and result.runs > 1
    assert [f.name for f in files] == [f"long.run{n}.json" for n in range(1, result.runs + 1)]
    assert await check_replays(tmp_path, desk()) == files


async def test_a_gate_with_nothing_to_check_fails(tmp_path: Path) -> None:
    with pytest.raises(ReplayFailed, match="no recorded turns"):
        await check_replays(tmp_path, desk())
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    with pytest.raises(ReplayFailed, match="notes.json: not a workflow history"):
        await check_replays(tmp_path, desk())


def test_bounds_and_steps_of_numbers_are_kept() -> None:
    assert value_for({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 7}) == 6
    assert value_for({"type": "number", "minimum": 0.1, "maximum": 0.5, "multipleOf": 0.07}) == 0.14
    assert value_for({"type": "integer", "minimum": 3, "exclusiveMinimum": 1}) == 3
    assert value_for({"type": "number", "maximum": 0.2}) == 0.2
