"""The plain-Python core, no server: offline model, tool registry, rendering, shop data."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from pydantic import BaseModel, ValidationError

from durable_agent.answers import DECLINE
from durable_agent.argfill import find_reason
from durable_agent.conversation import AssistantMessage, ToolResult, UserMessage
from durable_agent.errors import InvalidCall, NotFound, UnknownModel
from durable_agent.model import ModelCatalog, ModelRequest, Reply
from durable_agent.render import render_result
from durable_agent.shop import TOOLS, ShopStore
from durable_agent.shop.phrasebook import offline_model
from durable_agent.shop.store import ORDER_NOT_FOUND
from durable_agent.tools import BadToolName, ToolContext, ToolRegistry, tool
from durable_agent.types import ToolCall, TurnInput
from tests.conftest import SEED_CASES, request


async def plan(question: str) -> Reply:
    return await offline_model().plan(request(question))


@pytest.mark.parametrize(
    ("question", "calls"),
    [
        ("Which item was ordered for 123456?", ["order_status(order_id='123456')"]),
        ("When is my return rtn003 processed?", ["return_status(return_id='rtn003')"]),
        ("Which item was ordered for 383833?", ["order_status(order_id='383833')"]),
        ("Could you tell me if order 123456 has shipped?", ["order_status(order_id='123456')"]),
        (
            "Has order 123456 shipped and is return rtn001 processed?",
            ["order_status(order_id='123456')", "return_status(return_id='rtn001')"],
        ),
        (
            "How many days do I have to return an item?",
            ["search_policies(query='How many days do I have to return an item?')"],
        ),
        ("Do you ship to Canada?", ["search_policies(query='Do you ship to Canada?')"]),
        (  # a question about returning looks up the order and the policy, at once
            "Can I return order 123456?",
            [
                "order_status(order_id='123456')",
                "search_policies(query='Can I return order 123456?')",
            ],
        ),
        (  # a request to return writes, with the customer's reason
            "I want to return order 123456, the soap is broken",
            ["start_return(order_id='123456', reason='the soap is broken')"],
        ),
    ],
)
async def test_offline_model_picks_tools_and_fills_arguments(question: str, calls: list[str]):
    assert [c.render() for c in (await plan(question)).calls] == calls


@pytest.mark.parametrize(
    "question",
    [
        "How is the weather in Scotland right now?",
        "What is the impact of return rtn001 on world peace?",
        "Tell me a joke",
        "Write me a poem about order 123456 and the ocean and the moon",
    ],
)
async def test_offline_model_declines_off_topic_questions(question: str) -> None:
    p = await plan(question)
    assert p.calls == [] and p.text == DECLINE


async def test_offline_model_asks_for_a_missing_id() -> None:
    p = await plan("Has my order shipped?")
    assert p.calls == []
    assert "order ID (6 digits" in p.text


async def test_offline_model_asks_for_a_missing_reason() -> None:
    p = await plan("I want to return order 123456.")
    assert p.calls == []
    assert p.text == "I can start a return for order 123456. Please tell me why the item goes back."


async def test_offline_model_greets_with_what_the_tools_do() -> None:
    p = await plan("hi")
    assert p.calls == [] and p.text.startswith("Hello!")
    assert "status of a specific order" in p.text and "search the store's policy" in p.text


async def test_offline_model_follows_up_on_the_previous_answer() -> None:
    messages = [
        UserMessage(text="Has order 123456 shipped?"),
        AssistantMessage(text="Yes — order 123456 shipped on 2026-11-18."),
        UserMessage(text="When will it arrive?"),
    ]
    reply = await offline_model().plan(ModelRequest(messages=messages, tools=TOOLS.specs))
    assert [c.render() for c in reply.calls] == ["order_status(order_id='123456')"]


def answered(question: str, call: ToolCall, result: str) -> ModelRequest:
    messages = [
        UserMessage(text=question),
        AssistantMessage(calls=[call]),
        ToolResult(call_id=call.id, tool=call.name, ok=True, text=result),
    ]
    return ModelRequest(messages=messages, tools=TOOLS.specs)


async def test_offline_model_reads_the_records_it_is_given() -> None:
    order = (
        "Order id: 654321. Item: Cedar Soap. Quantity: 1. Total: $7.00. Status: shipped. "
        "Shipped on: 2027-01-02. Expected delivery: 2027-01-05."
    )
    call = ToolCall(id="c1", name="order_status", arguments={"order_id": "654321"})
    reply = await offline_model().interpret(answered("Has order 654321 shipped?", call, order))
    assert reply.text == "Yes — order 654321 shipped on 2027-01-02 and should arrive by 2027-01-05."
    reply = await offline_model().interpret(answered("What did 654321 cost?", call, order))
    assert reply.text == "The total for order 654321 was $7.00 (1 × Cedar Soap)."


async def test_offline_model_tells_an_open_return_from_a_new_one() -> None:
    args = {"order_id": "654321", "reason": "too small"}
    call = ToolCall(id="c1", name="start_return", arguments=args)
    new = (
        "Return id: rtn042. Order id: 654321. Status: requested. "
        "Detail: Requested on 2027-01-09 (too small). Ship the item back."
    )
    reply = await offline_model().interpret(answered("Return 654321, too small", call, new))
    assert reply.text.startswith("I've started return rtn042 for order 654321")
    open_one = new.replace("(too small)", "(broken)")
    reply = await offline_model().interpret(answered("Return 654321, too small", call, open_one))
    assert reply.text.startswith("Order 654321 already has an open return, rtn042")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I want to return order 123456, the soap is broken", "the soap is broken"),
        ("please start a return for 234567: wrong size", "wrong size"),
        ("Return order 123456 because it arrived damaged.", "it arrived damaged"),
        ("Order 123456 arrived broken, please return it", "Order 123456 arrived broken"),
        ("I want to return order 123456.", None),
        ("Hi, please start a return for order 123456, thanks!", None),
    ],
)
def test_the_reason_is_the_customers_own(text: str, reason: str | None) -> None:
    assert find_reason(text, ("start", "return")) == reason


async def test_offline_model_answers_from_the_results() -> None:
    call = ToolCall(id="c1", name="order_status", arguments={"order_id": "383833"})
    messages = [
        UserMessage(text="Which item was ordered for 383833?"),
        AssistantMessage(calls=[call]),
        ToolResult(call_id="c1", tool="order_status", ok=False, text=ORDER_NOT_FOUND),
    ]
    reply = await offline_model().interpret(ModelRequest(messages=messages))
    assert reply.calls == [] and reply.text == ORDER_NOT_FOUND
    assert reply.usage.model_calls == 1


def test_registry_explains_invalid_calls() -> None:
    with pytest.raises(InvalidCall, match="unknown tool 'nope'; available tools: order_status"):
        TOOLS.validate(ToolCall(id="1", name="nope"))
    with pytest.raises(InvalidCall, match=r"order_id: String should match pattern .* \(got '12'\)"):
        TOOLS.validate(ToolCall(id="1", name="order_status", arguments={"order_id": "12"}))
    with pytest.raises(InvalidCall, match="order_id: Field required"):
        TOOLS.validate(ToolCall(id="1", name="order_status", arguments={}))


def test_registry_knows_which_tools_write() -> None:
    assert TOOLS.side_effecting == ["start_return"]


def test_return_ids_are_normalised() -> None:
    call = ToolCall(id="1", name="return_status", arguments={"return_id": " RTN001 "})
    assert TOOLS.validate(call).model_dump() == {"return_id": "rtn001"}


def test_tool_decorator_reads_signature_and_docstring() -> None:
    class Args(BaseModel):
        n: int

    @tool(examples=["double 2"], timeout=timedelta(seconds=1))
    def double(args: Args, ctx: ToolContext[None]) -> int:
        """Doubles a number."""
        return args.n * 2

    assert double.spec.description == "Doubles a number."
    assert double.spec.parameters["required"] == ["n"]
    assert double(Args(n=2), ToolContext("c", None)) == 4
    with pytest.raises(ValueError, match="'double': it is listed twice .*: list it once"):
        ToolRegistry([double, double])
    with pytest.raises(TypeError, match="pydantic model"):
        tool(lambda x, ctx: x)


def test_render_is_compact_and_capped() -> None:
    assert render_result({"item": "Soap", "shipped_on": None}) == "Item: Soap."
    assert render_result([]) == "(nothing found)"
    long = render_result("x" * 5000, limit=100)
    assert long.startswith("x" * 100) and long.endswith("[truncated 4900 more characters]")


def test_store_scopes_lookups_to_the_customer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = ShopStore(tmp_path / "shop.db")
    assert store.order("demo", "123456").item == "Herbal Handsoap"
    with pytest.raises(NotFound, match="Order not found"):
        store.order("cust-002", "123456")
    assert store.return_("demo", "rtn003").status == "received"
    assert store.search_policies("refund card")[0].title == "Refunds"
    ShopStore(tmp_path / "shop.db")  # opening again does not seed twice
    assert len(store.search_policies("policy returns refunds shipping warranty payment", 10)) == 6


def test_unknown_model_says_what_to_use() -> None:
    catalog = ModelCatalog({"offline": lambda _: offline_model()})
    assert catalog.resolve("offline") is catalog.resolve("offline")
    assert catalog.resolve("") is catalog.resolve("offline")  # the worker's default
    with pytest.raises(UnknownModel, match="unknown model 'gpt:x': use one of offline"):
        catalog.resolve("gpt:x")


@pytest.mark.parametrize("question", ["", "   \n"])
def test_blank_questions_are_refused(question: str) -> None:
    with pytest.raises(ValidationError, match="the question is empty"):
        TurnInput(question=question)


@pytest.mark.parametrize(
    "customer_id", ["", "x" * 501, "demo\n", "demo\r\n", "\ndemo", " demo", "de\u202emo"]
)
def test_odd_customer_ids_are_refused(customer_id: str) -> None:
    with pytest.raises(ValidationError, match="customer id must be"):
        TurnInput(question="q", customer_id=customer_id)


class Isbn13(BaseModel):
    isbn: str


@pytest.mark.parametrize("name", ["book price", "books.price", "x" * 65, "price\n", "prix\u00e9"])
def test_a_tool_name_no_model_api_takes_is_refused_with_a_name_that_would_do(name: str) -> None:
    @tool
    def price(args: Isbn13, ctx: ToolContext[None]) -> str:
        """Price of a book."""
        return ""

    with pytest.raises(BadToolName, match="a tool's name is 1-64 letters, digits, '_' or '-'"):
        ToolRegistry([tool(name=name)(price.fn)])


def test_seed_cases_cover_the_six_questions() -> None:
    assert len(SEED_CASES) == 6


def test_web_ui_text_survives_markdown() -> None:
    from durable_agent.answers import markdown_plain, markdown_safe, story
    from durable_agent.types import Step, StepKind

    text = "Total: $19.98. Refund of $26.85 for order_status(order_id='123456') [1] *x* <b>"
    steps = [Step(iteration=1, kind=StepKind.OBSERVATION, text=text)]
    shown = story(steps)
    # No unescaped character Markdown (or its math) would interpret.
    assert not re.search(r"(?<!\\)[$*_\[\]<>`]", shown.replace("\\\\", ""))
    assert markdown_plain(shown) == steps[0].render()
    assert markdown_plain(markdown_safe(text)) == text
