"""What the offline model picks, and what it says when it cannot.

- It never picks a tool that writes for a message that asks nothing to change: a
  question, or a request to be shown something ("Show me everything in the knowledge
  graph" once picked the memory server's `create_entities` three times and showed the
  customer a raw schema error).
- A call it cannot make valid (a list, a number, a value over its length) is not made:
  the customer hears politely what it needs, and a refused call is said in words,
  never as the schema's message.
- Customers' own wordings are answered from the demo shop's tools: typos around an
  id, anger around an id, a parcel that never came, a due date instead of an id, an
  id of the wrong length, and a follow-up about what the last answer listed. Each
  wording comes in variants: the class is fixed, not the string.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from durable_agent.chat import ConversationInput
from durable_agent.conversation import AssistantMessage, ToolResult, UserMessage
from durable_agent.model import ModelRequest, Reply
from durable_agent.offline import OfflineModel
from durable_agent.runtime.turns import send, start_chat, start_turn
from durable_agent.shop import TOOLS
from durable_agent.shop.questions import Case
from durable_agent.tools import Tool, ToolRegistry, ToolSpec, schema_tool
from durable_agent.types import Outcome, StepKind, ToolCall, TurnInput, TurnOutput
from durable_agent.workflows import AgentTurn
from tests.conftest import Harness
from tests.test_mcp import memory_server, needs_npm, serving
from tests.test_questions import table_problems

# -- tools of a knowledge graph, as an MCP server lists them ---------------------------

NAMES = {"type": "array", "items": {"type": "string"}}
ENTITIES = {
    "type": "array",
    "items": {"type": "object", "properties": {"name": {"type": "string"}}},
}


def graph_tool(name: str, description: str, writes: bool, **properties: Any) -> Tool:
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return schema_tool(name, description, schema, lambda args, ctx: "", side_effects=writes)


GRAPH = ToolRegistry(
    [
        graph_tool(
            "memory__create_entities",
            "Create multiple new entities in the knowledge graph",
            True,
            entities=ENTITIES,
        ),
        graph_tool(
            "memory__create_relations",
            "Create multiple new relations between entities in the knowledge graph",
            True,
            relations=ENTITIES,
        ),
        graph_tool(
            "memory__add_observations",
            "Add new observations to existing entities in the knowledge graph",
            True,
            observations=ENTITIES,
        ),
        graph_tool(
            "memory__delete_entities",
            "Delete multiple entities and their associated relations from the knowledge graph",
            True,
            entityNames=NAMES | {"description": "An array of entity names to delete"},
        ),
        graph_tool(
            "memory__delete_observations",
            "Delete specific observations from entities in the knowledge graph",
            True,
            deletions=ENTITIES,
        ),
        graph_tool("memory__read_graph", "Read the entire knowledge graph", False),
        graph_tool(
            "memory__search_nodes",
            "Search for nodes in the knowledge graph based on a query",
            False,
            query={"type": "string", "description": "The search query to match against names"},
        ),
        graph_tool(
            "memory__open_nodes",
            "Open specific nodes in the knowledge graph by their names",
            False,
            names=NAMES | {"description": "An array of entity names to retrieve"},
        ),
    ]
)

SHOWING = [
    "Show me {}",
    "show {} please",
    "List {}",
    "Can you show me {}?",
    "Could you list {} for me",
    "Please display {}",
    "I'd like to see {}",
    "What is in {}?",
    "What are {}?",
    "find {}",
    "Tell me about {}",
    "Which are {}?",
]
"""Messages that ask to be shown something, around what the tools speak of."""
THINGS = [
    "everything in the knowledge graph",
    "the whole graph",
    "the entities",
    "all entities I created",
    "the new entities",
    "the relations between entities",
    "the observations added to the entities",
    "the entities you deleted",
    "the knowledge graph",
]


async def plan(model: OfflineModel, registry: ToolRegistry, *messages: Any) -> Reply:
    said = [UserMessage(text=m) if isinstance(m, str) else m for m in messages]
    return await model.plan(ModelRequest(messages=said, tools=registry.specs))


def assert_polite(text: str) -> None:
    """Words for a customer: no validation message, no schema."""
    assert text and "invalid arguments" not in text and "unknown tool" not in text, text
    assert "{" not in text and "required" not in text and "type" not in text, text


@pytest.mark.parametrize("wording", SHOWING)
async def test_a_request_to_be_shown_something_never_picks_a_write(wording: str) -> None:
    model = OfflineModel()
    for thing in THINGS:
        reply = await plan(model, GRAPH, wording.format(thing))
        writes = [c.name for c in reply.calls if GRAPH[c.name].side_effects]
        assert not writes, (wording.format(thing), writes)
        if not reply.calls:
            assert_polite(reply.text)
        for call in reply.calls:  # what it does call, the registry accepts
            GRAPH.validate(call)


async def test_the_knowledge_graph_is_read_not_written() -> None:
    reply = await plan(OfflineModel(), GRAPH, "Show me everything in the knowledge graph")
    assert [c.name for c in reply.calls] == ["memory__read_graph"]


async def test_the_shops_write_is_never_picked_for_a_question_or_a_look() -> None:
    model = OfflineModel()
    for text in [
        "Show me how to return order 123456",
        "Can I return order 123456?",
        "list the returns of order 123456",
        "Tell me if order 123456 can be returned",
        "what happens if I return order 123456?",
    ]:
        reply = await plan(model, TOOLS, text)
        assert "start_return" not in [c.name for c in reply.calls], text


@pytest.mark.parametrize(
    "request_text",
    [
        "Create an entity named Alice",
        "please create a new entity for Bob",
        "Delete the entity Alice",
        "Add an observation to Alice: likes tea",
        "open the node Alice",
    ],
)
async def test_a_call_it_cannot_make_valid_is_a_polite_answer(request_text: str) -> None:
    """Lists of objects cannot be made of a message: no call is made, and the customer
    reads what the tool needs."""
    reply = await plan(OfflineModel(), GRAPH, request_text)
    assert reply.calls == [], reply.calls
    assert reply.text.startswith("Sorry, I can't "), reply.text
    assert_polite(reply.text)


async def test_a_value_the_schema_would_refuse_is_not_sent() -> None:
    """A free-text value longer than its `maxLength` is no valid call either."""
    short = schema_tool(
        "search",
        "Search the knowledge base for articles",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": 40, "description": "the search words"}
            },
            "required": ["query"],
        },
        lambda args, ctx: "",
    )
    registry = ToolRegistry([short])
    model = OfflineModel()
    fits = await plan(model, registry, "search the knowledge base for tea")
    assert [c.arguments for c in fits.calls] == [{"query": "search the knowledge base for tea"}]
    long = "please search the knowledge base for all the articles in the knowledge base"
    reply = await plan(model, registry, long)
    assert (
        reply.calls == [] and "it needs the search words of at most 40 characters" in reply.text
    ), reply.text


async def test_a_refused_call_is_said_in_words_when_asked_again_and_when_read() -> None:
    """The turn asks again when every call was refused, and the model reads refusals
    among results: both times the customer hears words, never the registry's message."""
    call = ToolCall(id="call_1", name="memory__open_nodes", arguments={"names": "Alice"})
    try:
        GRAPH.validate(call)
    except Exception as e:
        refusal = str(e)
    assert refusal.startswith("invalid arguments for memory__open_nodes")
    messages = [
        UserMessage(text="open the node Alice"),
        AssistantMessage(calls=[call]),
        ToolResult(call_id="call_1", tool=call.name, ok=False, text=refusal),
    ]
    model = OfflineModel()
    again = await model.plan(ModelRequest(messages=messages, tools=GRAPH.specs))
    assert again.calls == [] and "open nodes" in again.text
    assert_polite(again.text)
    read = await model.interpret(ModelRequest(messages=messages, tools=GRAPH.specs))
    assert read.calls == [] and "open nodes" in read.text
    assert_polite(read.text)
    unknown = ToolCall(id="call_1", name="memory__nope", arguments={})
    messages[1:] = [
        AssistantMessage(calls=[unknown]),
        ToolResult(call_id="call_1", tool=unknown.name, ok=False, text="unknown tool 'x'; ..."),
    ]
    assert_polite((await model.interpret(ModelRequest(messages=messages, tools=GRAPH.specs))).text)


def test_a_tool_spec_says_whether_it_writes() -> None:
    specs = {s.name: s for s in GRAPH.specs}
    assert specs["memory__create_entities"].side_effects
    assert not specs["memory__read_graph"].side_effects
    assert ToolSpec(name="x", description="y", parameters={}).side_effects is False


@needs_npm
async def test_a_memory_server_is_read_for_a_look_and_nothing_is_written(
    harness: Harness, tmp_path: Path
) -> None:
    """The real `@modelcontextprotocol/server-memory`, through a turn: a look reads the
    graph (no write, no consent asked, no schema error); a write it cannot make is a
    polite answer with nothing refused."""
    async with serving(harness, None, memory_server(tmp_path)) as task_queue:
        results = [
            await (await start_turn(harness.client, TurnInput(question=q), task_queue)).result()
            for q in ("Show me everything in the knowledge graph", "Create an entity named Alice")
        ]
    look, create = results
    for result in results:
        assert result.outcome is Outcome.ANSWERED, result.answer
        assert not any(s.kind in (StepKind.APPROVAL, StepKind.REJECTED) for s in result.steps)
        assert "invalid arguments" not in result.answer
    assert_polite(create.answer)
    assert {c.name for s in look.steps for c in s.calls} == {"memory__read_graph"}
    assert not [c for s in create.steps for c in s.calls]
    assert create.answer.startswith("Sorry, I can't create entities")
    assert (
        not (tmp_path / "memory.jsonl").exists()
        or "entity" not in (tmp_path / "memory.jsonl").read_text()
    )


# -- the demo shop's customers, in their own words ------------------------------------

O123, O456, O678 = (f"order_status(order_id='{n}')" for n in ("123456", "456789", "678901"))
LIST = "list_orders()"
LATE_TAIL = "shipped on 2026-11-18 and was due by 2026-11-21: it is 3 days late."
THE_LATE_ONE = f"Order 123456 (2 × Herbal Handsoap) {LATE_TAIL}"
ORDERS = "You have 5 orders: 456789: 1 × Electric Toothbrush"
SORRY = "I'm sorry about that."
NOT_AN_ORDER = "is not an order ID (6 digits, like 123456)."
DECLINED = "Sorry, I cannot answer that question."


def case(question: str, calls: list[str], facts: list[str], *absent: str, before: str = "") -> Case:
    return Case(question, calls, facts, before=(before,) if before else (), absent=absent)


def wrong_id(question: str, said: str) -> Case:
    """A number given as an order id that cannot be one: said so first, then their list."""
    return case(question, [LIST], [f"{said} {NOT_AN_ORDER} {ORDERS}"])


WORDINGS = [
    # Typos around an id.
    case("wher is my ordr 123456??", [O123], [LATE_TAIL]),
    case("whre is my oder 123456", [O123], [LATE_TAIL]),
    case("were is my odrer 123456?", [O123], [LATE_TAIL]),
    case("has my ordre 456789 shippped yet", [O456], ["No — order 456789 has not shipped"]),
    case("wen will ordr 456789 arive", [O456], ["it should arrive by 2026-11-27"]),
    case("how much did ordr 678901 cots", [O678], ["$15.90"]),
    # Anger around an id: answered, with an apology.
    case("WHERE THE HELL IS MY ORDER 123456, this is ridiculous!!!", [O123], [SORRY, LATE_TAIL]),
    case("This is unacceptable. Order 456789 STILL hasn't shipped!!", [O456], [SORRY, "456789"]),
    case("seriously, what did 678901 cost?? worst shop ever", [O678], [SORRY, "$15.90"]),
    case("I'm so fed up. wtf is going on with 123456", [O123], [SORRY, "123456"]),
    case("PLEASE CHECK ORDER 123456", [O123], [LATE_TAIL], SORRY),  # capitals, no anger
    # A parcel that never came: their orders, and which one is late.
    case("my package never came", [LIST], [SORRY, THE_LATE_ONE, ORDERS]),
    case("My parcel never arrived", [LIST], [SORRY, THE_LATE_ONE, ORDERS]),
    case("I still haven't received my order", [LIST], [THE_LATE_ONE, ORDERS]),
    case("my order is late", [LIST], [THE_LATE_ONE]),
    # About how things are, not about theirs: the policy, not their list.
    case(
        "I want to know your policy on late parcels",
        ["search_policies(query='I want to know your policy on late parcels')"],
        ["policy says"],
        ORDERS,
    ),
    # A due date instead of an id.
    case("it was due on the 21st, where is it?", [LIST], [THE_LATE_ONE, ORDERS]),
    case("My order was supposed to arrive on the 21st", [LIST], [THE_LATE_ONE]),
    case("it should have been here by the 21st", [LIST], [THE_LATE_ONE]),
    case(
        "the one due on the 27th, has it shipped?",
        [LIST],
        ["Order 456789 (1 × Electric Toothbrush) has not shipped yet"],
        "123456 (2",
    ),
    case(
        "my order due on the 15th never came", [LIST], ["None of your orders was due on the 15th"]
    ),
    # An id of the wrong length: not an order id, said before their orders.
    case("where is my order 12345", [LIST], [f"12345 {NOT_AN_ORDER}", ORDERS]),
    case("order 1234567 hasn't arrived", [LIST], [f"1234567 {NOT_AN_ORDER}", ORDERS]),
    case("status of order #12345?", [LIST], [f"12345 {NOT_AN_ORDER}", ORDERS]),
    case("what's in order no. 9876543", [LIST], [f"9876543 {NOT_AN_ORDER}"]),
    wrong_id("Tell me about order 12345678", "12345678"),
    wrong_id("Tell me about order 12345", "12345"),
    wrong_id("tell me about order 1234567!!", "1234567"),
    wrong_id("Order #12345678?", "12345678"),
    wrong_id("what about order-12345678", "12345678"),
    wrong_id("Where is order...1234567", "1234567"),
    wrong_id('Tell me about order "12345".', "12345"),
    wrong_id("Tell me about order (12345678)", "12345678"),
    wrong_id("has order 12-345-678 shipped?", "12-345-678"),
    wrong_id("Tell me about order 12.345.678", "12.345.678"),
    wrong_id("Tell me about order #12,345,678", "12,345,678"),
    wrong_id("Tell me about order 12 345", "12 345"),
    wrong_id("Tell me about order 123-456", "123-456"),
    wrong_id("Tell me about order n° 1234567", "1234567"),
    wrong_id("My order number is 12345678.", "12345678"),
    wrong_id("my order is 12345, where is it?", "12345"),
    case("status of rtn01", [], ["rtn01 is not a return ID (like rtn001).", "Please tell me"]),
    case(
        "rtn001",
        ["return_status(return_id='rtn001')"],
        ["Return rtn001 for order 345678"],
        before="status of rtn01",
    ),
    # Numbers that are no ids are no near misses.
    case("Tell me about orders 123456, 234567", [O123, "order_status(order_id='234567')"], []),
    case("I want to order 25 bottles", [], [], "is not an"),
    case("my order 123456 is 7 days late", [O123], [], "is not an"),
    case("Has order 123456 shipped? I ordered it in 2026", [O123], ["Yes — order 123456 shipped"]),
    case("I placed 2 orders in 2026, where are they?", [LIST], [ORDERS], "is not an"),
    case("How is the weather in 2026?", [], [DECLINED]),
    # A follow-up about what the last answer listed.
    case("which one of those is late?", [LIST], [THE_LATE_ONE], ORDERS, before="Show me my orders"),
    case("are any of them late?", [LIST], [THE_LATE_ONE], ORDERS, before="What orders do I have?"),
    case(
        "Which of those was due on the 21st?",
        [LIST],
        [THE_LATE_ONE],
        ORDERS,
        before="list my orders pls",
    ),
]


async def test_customers_wordings_are_answered_from_the_tools(tmp_path: Path) -> None:
    report = await table_problems(WORDINGS, tmp_path)
    assert not report, report


@pytest.mark.parametrize(
    ("question", "said"),
    [
        ("Tell me about order 12345678", "12345678"),
        ("Tell me about order 12345", "12345"),
        ("Where is order #123-4567?", "123-4567"),
    ],
)
async def test_a_wrong_order_id_is_said_first_in_a_turn(
    harness: Harness, question: str, said: str
) -> None:
    """Through the worker, as `client.py ask` puts it: the turn's answer begins with it."""
    result = await harness.ask(question)
    assert result.outcome is Outcome.ANSWERED
    assert result.answer.startswith(f"{said} {NOT_AN_ORDER} {ORDERS}"), result.answer


async def test_a_follow_up_about_a_list_in_a_conversation(harness: Harness) -> None:
    """Through the conversation workflow: the second message refers to the first's answer."""

    async def answered(turn_id: str) -> TurnOutput:
        handle = harness.client.get_workflow_handle_for(AgentTurn.run, turn_id)
        return await asyncio.wait_for(handle.result(), timeout=60)

    async with harness.worker() as task_queue:
        conversation, first = await start_chat(
            harness.client, ConversationInput(), "shwo me all my ordrs", task_queue
        )
        listed = await answered(first.turn_id)
        late = await answered((await send(conversation, "which one of those is late?")).turn_id)
    assert listed.outcome is Outcome.ANSWERED and ORDERS in listed.answer, listed.answer
    assert late.outcome is Outcome.ANSWERED, late.answer
    assert THE_LATE_ONE in late.answer and ORDERS not in late.answer, late.answer
